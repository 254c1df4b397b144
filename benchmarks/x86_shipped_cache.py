"""A deployment's first compile: pdlkit's decision cache filled on one machine and shipped to
another of the same kind, against Inductor's first compile there (issue 21's compile cost).

    python benchmarks/x86_shipped_cache.py [--model bert-mini] [--dtype bf16] [--rounds 3]
        [--threads 1] [--out DIR]

The build machine and the serving one are two copies of the shipped pattern and kernel
folders at other paths (other inodes and times, as on another machine), each named by
``PDLKIT_PATTERN_PATH`` / ``PDLKIT_KERNEL_PATH``. The build compiles the model once with
everything cold (``build``). Its decision cache folder is copied, and then, ``--rounds``
times, alternating, each in a new process with a new, empty Inductor cache folder: Inductor
alone (``peer``) and pdlkit over a copy of the build's decision cache on the serving folders
(``shipped``). Inductor's caches are cold on both sides: a new machine has none, unless they
are shipped too. Each process is warmed first as ``x86_models.py`` warms it. Printed and
written (``x86_shipped_cache.md`` in ``--out``): each compile's seconds and pdlkit's tuning
counters, the medians and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
COUNTERS = ("tuning_misses", "tuning_hits", "matches_from_disk", "graphs_left_to_inductor")


def one(model: str, dtype: str, conf: str) -> None:
    """In this process: warm it, compile and run the model once; print seconds and counters."""
    import torch
    import torch._inductor.config as ic
    from x86_models import build, prepare, warm_process

    import pdlkit

    m, x = prepare(*build(model), dtype)
    warm_process(tempfile.mkdtemp())
    ic.freezing = dtype.startswith("int8")
    pdlkit.stats(reset=True)
    t = time.perf_counter()
    with torch.no_grad():
        (torch.compile(m) if conf == "peer" else pdlkit.optimize(m))(x)
    took = time.perf_counter() - t
    st = pdlkit.stats()
    print(json.dumps({"s": took, **{k: st.get(k, 0) for k in COUNTERS}}))


def _run(args: argparse.Namespace, conf: str, folders: Path, decisions: Path, tmp: Path) -> dict:
    env = dict(
        os.environ,
        PDLKIT_PATTERN_PATH=str(folders / "patterns"),
        PDLKIT_KERNEL_PATH=str(folders / "kernels"),
        PDLKIT_CACHE_DIR=str(decisions),
        TORCHINDUCTOR_CACHE_DIR=tempfile.mkdtemp(prefix="inductor-", dir=tmp),
        OMP_NUM_THREADS=str(args.threads),
    )
    from x86_models import child_json

    cmd = [sys.executable, __file__, "--one", conf, "--model", args.model, "--dtype", args.dtype]
    result = child_json(conf, cmd, env)
    print(f"   {conf:8s} {result['s']:6.2f} s  {result}", flush=True)
    return result


def _copies(tmp: Path) -> tuple[Path, Path]:
    """Two copies of the shipped pattern and kernel folders: the build's and the server's."""
    out = []
    for name in ("build", "serving"):
        for part in ("patterns", "kernels"):
            shutil.copytree(
                ROOT / part, tmp / name / part, ignore=shutil.ignore_patterns("__pycache__")
            )
        out.append(tmp / name)
    return out[0], out[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="bert-mini")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--one", choices=("peer", "pdlkit"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        return one(args.model, args.dtype, args.one)
    import torch
    from machine import host_header

    # as each compile's process runs (OMP_NUM_THREADS), so that the header says so
    torch.set_num_threads(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="shipped-cache-"))
    build, serving = _copies(tmp)
    print(f"== {args.model} {args.dtype}, {args.threads} thread(s)", flush=True)
    built = _run(args, "pdlkit", build, tmp / "decisions", tmp)
    times: dict[str, list[float]] = {"peer": [], "shipped": []}
    rows = [f"| build (all cold) | {built['s']:.2f} | {_counters(built)} |"]
    for i in range(args.rounds):
        shipped = tmp / f"shipped-{i}"
        shutil.copytree(tmp / "decisions", shipped)
        for conf in ("peer", "shipped") if i % 2 == 0 else ("shipped", "peer"):
            r = _run(args, "peer" if conf == "peer" else "pdlkit", serving, shipped, tmp)
            times[conf].append(r["s"])
            rows.append(f"| {conf}, round {i + 1} | {r['s']:.2f} | {_counters(r)} |")
    peer, ours = statistics.median(times["peer"]), statistics.median(times["shipped"])
    summary = f"shipped cache / Inductor, first compile (medians): {ours:.2f} / {peer:.2f} s = {ours / peer:.2f}x"
    print(summary)
    lines = [
        f"# A deployment's first compile: {args.model} {args.dtype}, {args.threads} thread(s)",
        "",
        *host_header(args.threads),
        "",
        f"`python benchmarks/x86_shipped_cache.py --model {args.model} --dtype {args.dtype} "
        f"--rounds {args.rounds} --threads {args.threads}` (the script's docstring says how).",
        "",
        f"**{summary}**",
        "",
        "| compile | seconds | pdlkit's counters |",
        "|---|---|---|",
        *rows,
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "x86_shipped_cache.md").write_text("\n".join(lines) + "\n")
    shutil.rmtree(tmp, ignore_errors=True)


def _counters(r: dict) -> str:
    return ", ".join(f"{k} {r[k]}" for k in COUNTERS if r.get(k))


if __name__ == "__main__":
    main()

"""Where a first compile's time goes: Inductor alone, pdlkit with its measured choice, pdlkit
with static priority (issue 21's first-compile figure).

    python benchmarks/first_compile_split.py [--model bert-mini] [--rounds 3] [--threads 1]
        [--dtype fp32 | bf16 | int8-static | int8-dynamic] [--out DIR]

Each round compiles the model (``benchmarks/_x86_models_build.py``) three ways, as
``x86_models.py`` names and makes them (``peer``: Inductor alone; ``pdlkit``; ``pdlkit-off``:
``autotune="off"``), the order rotated by the round, each from cold caches (an empty Inductor cache folder and an empty
decision cache, Inductor's in-memory caches cleared, ``torch._dynamo.reset()``): the wall
clock of ``torch.compile(m)(x)`` / ``pdlkit.optimize(m, autotune=...)(x)``, and, from
cProfile over the same call, the seconds inside Inductor's ``compile_fx_inner`` (and how many
graphs it compiled), pdlkit's pass (``backend.run_pass``: re-trace, matching and the sites'
measured choices, of which ``choose.cached_or_measured`` is the measuring) and the
whole-graph check's timing rounds (``graph_guard._measure`` and ``_confident``). What is
left is Dynamo's tracing and the first call. Medians over rounds; writes
``first_compile_split.md`` (``--out``).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import os
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _x86_models_build import build, prepare  # noqa: E402
from machine import host_header  # noqa: E402
from x86_models import CONFIGS, PT2E, inductor_cache, maker  # noqa: E402

# (column, function name, file name ends with): seconds inside, summed over calls
PARTS = [
    ("Inductor compiles", "compile_fx_inner", "compile_fx.py"),
    ("pdlkit pass", "run_pass", "backend.py"),
    ("sites measured", "cached_or_measured", "choose.py"),
    ("whole-graph rounds", "_measure", "graph_guard.py"),
    ("whole-graph glance", "_confident", "graph_guard.py"),
]


def compile_once(conf: str, model: Any, x: Any) -> dict[str, float]:
    """One cold compile and first call of ``conf`` (x86_models.py's ``maker``: "peer" is
    Inductor alone): its wall clock and the PARTS. A full garbage collection first, untimed."""
    torch._dynamo.reset()
    with tempfile.TemporaryDirectory() as tmp, inductor_cache(tmp), torch.no_grad():
        os.environ["PDLKIT_CACHE_DIR"] = os.path.join(tmp, "pdlkit")
        gc.collect()
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        maker(conf, model)()(x)
        prof.disable()
        row = {"total": time.perf_counter() - t0}
    stats: Any = getattr(pstats.Stats(prof), "stats")  # noqa: B009 (untyped in typeshed)
    for col, name, file in PARTS:
        hits = [v for (f, _, fn_name), v in stats.items() if fn_name == name and f.endswith(file)]
        row[col] = sum(v[3] for v in hits)  # cumulative seconds
        if col == "Inductor compiles":
            row["graphs compiled"] = sum(v[1] for v in hits)  # primitive calls
    return row


def markdown(rows: dict[str, list[dict[str, float]]], args: argparse.Namespace) -> str:
    cols = ["total", "graphs compiled", *(c for c, _, _ in PARTS)]
    med = {c: {k: statistics.median(r[k] for r in rs) for k in cols} for c, rs in rows.items()}
    peer = med["peer"]["total"]
    lines = [
        f"# First compile split: {args.model} {args.dtype}, {args.threads} thread(s)",
        "",
        *host_header(args.threads),
        "",
        f"`python benchmarks/first_compile_split.py --model {args.model} --dtype {args.dtype} "
        f"--rounds {args.rounds} --threads {args.threads}`: medians of {args.rounds} cold "
        "compiles each (seconds; the script's docstring says what each column counts).",
        "",
        "| configuration | total s | / Inductor | " + " | ".join(cols[1:]) + " |",
        "|---|---|---|" + "---|" * (len(cols) - 1),
    ]
    for conf, m in med.items():
        cells = " | ".join(f"{m[k]:.2f}" if k != "graphs compiled" else f"{m[k]:.0f}" for k in cols[1:])  # fmt: skip
        lines.append(f"| {conf} | {m['total']:.2f} | {m['total'] / peer:.2f}x | {cells} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="bert-mini")
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, x = build(args.model)
    model, x = prepare(model, x, args.dtype)
    torch._inductor.config.freezing = args.dtype in PT2E  # as x86_models.py: int8 peers freeze
    small = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()).eval()
    for conf in CONFIGS:  # a process's one-time costs out of the rounds
        compile_once(conf, small, torch.randn(2, 16))
    rows: dict[str, list[dict[str, float]]] = {c: [] for c in CONFIGS}
    for r in range(args.rounds):
        for conf in CONFIGS[r % 3 :] + CONFIGS[: r % 3]:
            rows[conf].append(compile_once(conf, model, x))
            print(conf, {k: round(v, 2) for k, v in rows[conf][-1].items()}, flush=True)
    md = markdown(rows, args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "first_compile_split.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()

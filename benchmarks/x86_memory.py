"""What compiling a model costs in host memory: pdlkit against Inductor, per dtype.

    python benchmarks/x86_memory.py [--models bert-base,llama] [--dtypes fp32,bf16,int8-static]
        [--threads 1] [--out DIR]

Each configuration runs in a new process (models from ``_x86_models_build.py``, through
``pdlkit.quantization.quantize`` as ``x86_models.py`` prepares them): the model is built and
prepared, then the process's resident set (``VmRSS``) is read, after a garbage collection and
``malloc_trim`` (freed heap given back, so that only what is still held counts); then the model
is compiled and called twice, and the resident set read the same way. Configurations:
``inductor`` (``torch.compile``; for the int8 dtypes with ``freezing``, PyTorch's int8 path),
``inductor-freezing`` (FP32 / BF16 with ``freezing``: Inductor's packed weights),
``pdlkit`` (``pdlkit.optimize``, the measured choice) and ``pdlkit-off``
(``autotune="off"``). Columns: the model's parameters and buffers (MB), what the compile added
to the resident set (MB), and the live plain CPU tensors that are neither parameters nor
buffers of the model (MB: packed weight copies a kernel keeps as tensors; packs that oneDNN or
native code hold are not tensors, and count only in the resident set). Writes
``x86_memory.md`` (``--out``).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CONFIGS = ("inductor", "inductor-freezing", "pdlkit", "pdlkit-off")
MB = 2**20


def _resident_mb() -> float:
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the heap keeps what it keeps
        pass
    with open("/proc/self/status") as f:
        kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))
    return kb / 1024


def _other_tensors_mb(model: Any) -> float:
    """Live CPU tensor storages that are not the model's parameters or buffers."""
    import torch

    own = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    seen: dict[int, int] = {}
    for o in gc.get_objects():  # plain tensors only: fake ones (a compile's) hold no memory
        if type(o) is torch.Tensor and o.device.type == "cpu" and not o.is_meta:
            try:
                s = o.untyped_storage()
                ptr = s.data_ptr()
            except (RuntimeError, NotImplementedError):  # a tensor without storage
                continue
            if ptr not in own:
                seen[ptr] = s.nbytes()
    return sum(seen.values()) / MB


def one(model: str, dtype: str, conf: str) -> None:
    """In this process: build, measure, compile and call twice, measure; print JSON."""
    import torch
    import torch._inductor.config as ic
    from _x86_models_build import build, prepare

    import pdlkit

    m, x = prepare(*build(model), dtype)
    weights = sum(t.numel() * t.element_size() for t in [*m.parameters(), *m.buffers()]) / MB
    ic.freezing = dtype.startswith("int8") or conf == "inductor-freezing"
    before = _resident_mb()
    with torch.no_grad():
        if conf.startswith("inductor"):
            f = torch.compile(m)
        else:
            f = pdlkit.optimize(m, autotune="off" if conf == "pdlkit-off" else "cached")
        f(x)
        f(x)
    added = _resident_mb() - before
    print(json.dumps({"weights": weights, "added": added, "other": _other_tensors_mb(m)}))


def _run(args: argparse.Namespace, model: str, dtype: str, conf: str, tmp: str) -> dict:
    env = dict(
        os.environ,
        PDLKIT_CACHE_DIR=tempfile.mkdtemp(prefix="pdlkit-", dir=tmp),
        TORCHINDUCTOR_CACHE_DIR=tempfile.mkdtemp(prefix="inductor-", dir=tmp),
        OMP_NUM_THREADS=str(args.threads),
    )
    from x86_models import child_json

    cmd = [sys.executable, __file__, "--one", conf, "--models", model, "--dtypes", dtype]
    try:
        result = child_json(conf, cmd, env)
    except RuntimeError as e:  # the row says so; the other configurations still run
        lines = str(e).strip().splitlines()  # "conf: exit N", then the stderr's last line
        return {"error": f"{lines[0].split(': ', 1)[-1]}: {lines[-1]}"}
    print(f"   {model} {dtype} {conf:18s} {result}", flush=True)
    return result


def _row(model: str, dtype: str, res: dict[str, dict]) -> str:
    def cell(conf: str) -> str:
        r = res.get(conf)
        if r is None:
            return "-"
        return r.get("error") or f"{r['added']:.0f} ({r['other']:.0f})"

    weights = next((r["weights"] for r in res.values() if "weights" in r), 0.0)
    return f"| {model} | {dtype} | {weights:.0f} | " + " | ".join(cell(c) for c in CONFIGS) + " |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="bert-base,llama")
    ap.add_argument("--dtypes", default="fp32,bf16,int8-static,int8-dynamic")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--one", choices=CONFIGS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        return one(args.models, args.dtypes, args.one)
    import torch
    from machine import host_header

    torch.set_num_threads(args.threads)  # as each configuration's process runs, for the header
    tmp = tempfile.mkdtemp(prefix="x86-memory-")
    rows = []
    for model in args.models.split(","):
        for dtype in args.dtypes.split(","):
            confs = [
                c for c in CONFIGS if not (dtype.startswith("int8") and c == "inductor-freezing")
            ]
            res = {c: _run(args, model, dtype, c, tmp) for c in confs}
            rows.append(_row(model, dtype, res))
    lines = [
        "# Host memory a compile adds: pdlkit against Inductor",
        "",
        *host_header(args.threads),
        "",
        f"`python benchmarks/x86_memory.py --models {args.models} --dtypes {args.dtypes} "
        f"--threads {args.threads}` (the script's docstring says how). MB added to the "
        "resident set by compiling and two calls, and in brackets the live tensors that are "
        "not the model's own; int8 rows' `inductor` is PyTorch's int8 path (freezing).",
        "",
        "| model | dtype | weights MB | " + " | ".join(CONFIGS) + " |",
        "|---|---|---|" + "---|" * len(CONFIGS),
        *rows,
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "x86_memory.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

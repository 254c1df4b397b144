"""oneDNN against pdlkit's AMX GEMMs with the weights in the caches and out of them, at
BERT-base's shapes: what ``matcher/cold.py``'s per-site timing rests on.

    python benchmarks/x86_cold_weights.py --threads 1 --rounds 8
    python benchmarks/x86_cold_weights.py --tables int8 --shapes 512x512x1408,512x1408x512

``hot``: every call on the same weight (a micro-benchmark's way, and pdlkit's per-site timing
before matcher/cold.py): the weight stays in the core's caches between calls. ``cold``: each
call on the next of as many copies of the weight (each packed once, before the timing) as add
up to ``--model-mb`` (default: matcher/cold.py's cap, 32): as in a model whose weights exceed
the caches, where each layer's weights come back from memory. BF16: ``linear_bf16_amx`` /
``linear_gelu_bf16_amx`` against oneDNN's packed BF16 linear (``linear_onednn`` /
``linear_gelu_onednn``); int8: ``qlinear_q_amx`` against oneDNN's ``qlinear_pointwise``
(``qlinear_q_onednn``); ln: ``qlinear_add_layer_norm_q_amx`` (GEMM, residual add, LayerNorm,
codes) against oneDNN's float GEMM alone; as ``benchmarks/x86_amx.py`` calls them. Interleaved rounds of
``--repeats`` calls, medians; ratio: AMX time / oneDNN's (< 1: AMX faster).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
from machine import host_header
from measure import write_report
from pdlkit.matcher import cold
from x86_amx import _bf16_cases, _cases, _kernels, _ln_cases

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "x86_cold_weights.md"
SHAPES = [(128, 768, 768, "none"), (128, 768, 3072, "gelu"), (128, 3072, 768, "none"),
          (1024, 768, 768, "none"), (1024, 768, 3072, "none")]  # fmt: skip


def _shapes(text: str) -> list[tuple[int, int, int, str]]:
    """``--shapes``: comma-separated ``MxKxN`` or ``MxKxN:gelu``; empty: :data:`SHAPES`."""
    if not text:
        return SHAPES
    out = []
    for item in text.split(","):
        dims, _, post = item.partition(":")
        m, k, n = (int(d) for d in dims.split("x"))
        out.append((m, k, n, post or "none"))
    return out


def _rotations(
    make: Callable[[], dict[str, Callable[[], Any]]], copies: int
) -> dict[str, Callable[[], Any]]:
    """Per engine, the hot call (copy 0) and a rotation through ``copies`` copies."""
    sets = [make() for _ in range(copies)]
    out: dict[str, Callable[[], Any]] = {}
    for name in ("onednn", "amx"):
        out[f"{name} hot"] = sets[0][name]
        rotation = cold.Rotation([s[name] for s in sets])
        rotation.warm_up()
        out[f"{name} cold"] = rotation
    return out


def _timed(cases: dict[str, Callable[[], Any]], rounds: int, repeats: int) -> dict[str, float]:
    times: dict[str, list[float]] = {c: [] for c in cases}
    for r in range(rounds):
        for c in list(cases) if r % 2 == 0 else list(reversed(cases)):
            f = cases[c]
            for _ in range(repeats):
                t0 = time.perf_counter()
                f()
                times[c].append((time.perf_counter() - t0) * 1e6)
    return {c: statistics.median(t) for c, t in times.items()}


def _table(ks: dict[str, Any], dtype: str, args: argparse.Namespace) -> list[str]:
    head = f"{'M':>5} {'K':>5} {'N':>5} {'post':>5} {'copies':>6}"
    head += " | hot: oneDNN us    amx us ratio | cold: oneDNN us    amx us ratio"
    lines = [f"{dtype}, threads {args.threads}", head]
    print(*lines, sep="\n", flush=True)
    for m, k, n, post in _shapes(args.shapes):
        if dtype == "ln" and post != "none":
            continue
        nbytes = n * k * (2 if dtype == "bf16" else 1)
        copies = cold.copies(nbytes, args.model_mb << 20)
        if dtype == "ln":
            make = partial(_ln_cases, ks, [], m, k, n)
        else:
            maker = _bf16_cases if dtype == "bf16" else _cases
            make = partial(lambda f, *a: f(*a)[0], maker, ks, [], m, k, n, post)
        cases = _rotations(make, copies)
        med = _timed(cases, args.rounds, args.repeats)
        line = f"{m:>5} {k:>5} {n:>5} {post:>5} {copies:>6}"
        for kind in ("hot", "cold"):
            o, a = med[f"onednn {kind}"], med[f"amx {kind}"]
            line += f" | {kind:>4}: {o:>9.1f} {a:>9.1f} {a / o:>5.2f}"
        print(line, flush=True)
        lines.append(line)
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--model-mb", type=int, default=cold.CAP_BYTES >> 20)
    ap.add_argument("--tables", default="bf16,int8,ln", help="comma-separated: bf16, int8, ln")
    ap.add_argument(
        "--shapes", default="", help="comma-separated MxKxN[:gelu] (default: BERT-base's)"
    )
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    tables = [t for t in args.tables.split(",") if t]
    ks = _kernels({"bf16", "int8"})
    text = ["# benchmarks/x86_cold_weights.py", "", *host_header(threads=args.threads), ""]
    text += [f"`python benchmarks/x86_cold_weights.py --threads {args.threads} --rounds "
             f"{args.rounds} --model-mb {args.model_mb}"
             + (f" --shapes {args.shapes}" if args.shapes else "") + "`", "", "```"]  # fmt: skip
    for dtype in tables:
        text += [*_table(ks, dtype, args), ""]
    write_report(args.out, "\n".join([*text, "```", ""]))


if __name__ == "__main__":
    main()

"""A transformers Llama prefill compiled once for every prompt length (``dynamic=True``), as a
server whose prompts vary compiles it: pdlkit int8 and pdlkit BF16 against BF16 Inductor.

    python benchmarks/cuda_llama_dynamic.py [--config llama2-7b] [--lengths 256 512 1024 2048]
        [--batch 1] [--paths pdlkit_int8 pdlkit_bf16] [--rounds 11] [--out DIR]
    (--device cpu --config tiny --lengths 8 16: a smoke run, Triton's interpreter)

The model and its int8 copy are ``cuda_llama.py``'s (2 decoder layers, random weights;
``quantize(..., scheme="int8-dynamic-per-token")``). Each path is compiled with
``dynamic=True`` and called at every length in turn; a graph with dynamic shapes gets a
whole-graph verdict per shape bucket at the bucket's first call (matcher/graph_buckets.py),
so these first calls include that check. Then rounds: per length, the paths round-robin,
each a window of back-to-back calls (host-issued, no CUDA graphs); ratios per round against
BF16 Inductor (above 1: faster), the median [lowest-highest]. Also per path: Dynamo's graph
count (recompilations), seconds of the first calls, the buckets Inductor's whole graph won,
and the cosine of each length's output against BF16 eager.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cuda_llama as L  # noqa: E402  the model, its int8 copy, the cosine


def first_calls(fn: Any, ids: dict[int, torch.Tensor], refs: dict[int, torch.Tensor]) -> dict:
    """Compile (the first call) and call at every length: seconds, graphs, verdicts, cosine."""
    from torch._dynamo.utils import counters

    import pdlkit

    counters.clear()
    pdlkit.stats(reset=True)
    t0 = time.perf_counter()
    cos = {n: L.cosine(fn(x), refs[n]) for n, x in ids.items()}
    seconds = time.perf_counter() - t0
    st = pdlkit.stats()
    return {
        "first_calls_s": seconds,
        "graphs": counters["stats"]["unique_graphs"],
        "buckets_to_inductor": st["buckets_to_inductor"],
        "cosine": cos,
    }


def rounds_of(fns: dict[str, Any], x: torch.Tensor, rounds: int, device: str) -> dict:
    """Per path: median ms per call over ``rounds`` interleaved windows, and its ratio per
    round against bf16_inductor (median, lowest, highest)."""
    calls = 5
    times: dict[str, list[float]] = {p: [] for p in fns}
    for r in range(rounds):
        order = list(fns) if r % 2 == 0 else list(fns)[::-1]
        for p in order:
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                fns[p](x)
            if device == "cuda":
                torch.cuda.synchronize()
            times[p].append((time.perf_counter() - t0) / calls * 1e3)
    out = {}
    for p, ms in times.items():
        ratios = sorted(b / t for b, t in zip(times["bf16_inductor"], ms, strict=True))
        out[p] = {
            "ms": statistics.median(ms),
            "ratio": [statistics.median(ratios), ratios[0], ratios[-1]],
        }
    return out


def markdown(res: dict[str, Any]) -> str:
    lines = [
        f"# {res['config']} prefill, batch {res['batch']}, compiled with dynamic=True: "
        "pdlkit against BF16 Inductor",
        "",
        res["machine"],
        "",
        f"`python benchmarks/cuda_llama_dynamic.py {' '.join(res['argv'])}` (the script's "
        "docstring says how). Ratio: BF16 Inductor's time / the path's, per round, median "
        "[lowest-highest] (above 1: faster).",
        "",
        "| path | graphs | first calls s | buckets Inductor's graph won | "
        + " | ".join(f"{n} tokens: ms, ratio, cosine" for n in res["lengths"])
        + " |",
        "|---|---|---|---|" + "---|" * len(res["lengths"]),
    ]
    for p, first in res["first"].items():
        cells = []
        for n in res["lengths"]:
            t = res["rows"][str(n)][p]
            lo, hi = t["ratio"][1], t["ratio"][2]
            cells.append(
                f"{t['ms']:.3f}, {t['ratio'][0]:.3f}x [{lo:.2f}-{hi:.2f}], {first['cosine'][n]:.5f}"
            )
        lines.append(
            f"| {p} | {first['graphs']} | {first['first_calls_s']:.1f} | "
            f"{first['buckets_to_inductor']} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="llama2-7b", choices=sorted(L.CONFIGS))
    ap.add_argument("--lengths", nargs="*", type=int, default=[256, 512, 1024, 2048])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--paths", nargs="*", default=["pdlkit_int8", "pdlkit_bf16"])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--out", default="benchmarks/results")
    a = ap.parse_args()
    from machine import host_header

    import pdlkit

    machine = "\n".join(host_header())
    print(machine)
    model = L.build_model(a.config, a.device)
    g = torch.Generator(device=a.device).manual_seed(3)
    ids = {n: torch.randint(0, L.VOCAB, (a.batch, n), device=a.device, generator=g)
           for n in a.lengths}  # fmt: skip
    models: dict[str, Any] = {"bf16_inductor": model, "pdlkit_bf16": model}
    models.update(L.quantized_copies(model, ids[a.lengths[0]], a.paths))
    target = L.INTERPRETER_TARGET if a.device == "cpu" else None
    res: dict[str, Any] = {"argv": sys.argv[1:], "config": a.config, "batch": a.batch,
                           "lengths": a.lengths, "machine": machine, "first": {}, "rows": {}}  # fmt: skip
    fns = {}
    with torch.no_grad():
        refs = {n: L.Prefill(model)(x) for n, x in ids.items()}
        for p in ["bf16_inductor", *a.paths]:
            torch._dynamo.reset()
            runner = L.Prefill(models[p])
            fn = (
                torch.compile(runner, dynamic=True)
                if p == "bf16_inductor"
                else pdlkit.optimize(runner, dynamic=True, target=target)
            )
            res["first"][p] = first_calls(fn, ids, refs)
            print(p, res["first"][p], flush=True)
            fns[p] = fn
        for n, x in ids.items():
            res["rows"][str(n)] = rounds_of(fns, x, a.rounds, a.device)
            print(n, res["rows"][str(n)], flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cuda_llama_dynamic.json").write_text(json.dumps(res, indent=1, default=str))
    (out / "cuda_llama_dynamic.md").write_text(markdown(res))
    print(markdown(res))


if __name__ == "__main__":
    main()

"""Where a compiled Llama step spends its GPU time, kernel by kernel, in launch order.

Run on a GPU machine, beside ``cuda_llama.py`` (same model, same steps, same compilation):

    python benchmarks/cuda_step_kernels.py [--config llama3-gqa] [--rows 'decode 64' ...]
                                           [--paths bf16_inductor pdlkit_int8] [--out DIR]

For each row and path: the step's time as a CUDA graph replay (``graph us``, what the
benchmark's ``graph ms`` column times), then torch.profiler over ``--calls`` steps run without a
graph: every kernel of a step in launch order with its median GPU time over the steps, the sum
by kernel name, and the gap between the graph's time and the kernels' sum (launch and drain
between kernels inside the graph). Each GEMM's weight bytes over the sum give the rate to set
against HBM's copy rate (measured in the same run).

Writes ``cuda_step_kernels_<config>.md`` (and ``.json``) under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cuda_llama as cl  # noqa: E402  benchmarks/cuda_llama.py


def copy_rate() -> float:
    """Device-to-device copy of 1 GiB, GB/s counting bytes read and written."""
    import triton.testing

    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    ms = triton.testing.do_bench(lambda: b.copy_(a), warmup=10, rep=50, return_mode="median")
    return 2 * a.numel() / ms / 1e6


def kernels_in_order(fn: Any, calls: int) -> list[tuple[str, float]]:
    """The kernels of one call of ``fn`` in launch order, each with its median GPU us over
    ``calls`` calls (every call launches the same sequence)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    events = sorted(
        (e for e in prof.events() if e.device_type.name == "CUDA"), key=lambda e: e.time_range.start
    )
    per = len(events) // calls
    if per * calls != len(events):
        raise RuntimeError(f"{len(events)} kernels over {calls} calls: not one sequence per call")
    return [
        (
            events[i].name,
            statistics.median(events[c * per + i].device_time_total for c in range(calls)),
        )
        for i in range(per)
    ]


def by_name(kernels: list[tuple[str, float]]) -> list[tuple[str, float, int]]:
    sums: dict[str, list[float]] = {}
    for name, us in kernels:
        sums.setdefault(name[:70], []).append(us)
    return sorted(((n, sum(v), len(v)) for n, v in sums.items()), key=lambda r: -r[1])


def measure(row: str, models: dict[str, Any], ctx: int, paths: list[str], calls: int) -> dict:
    kind, batch, seq = cl.parse_row(row)
    g = torch.Generator(device="cuda").manual_seed(2)
    ids = torch.randint(0, cl.VOCAB, (batch, seq), generator=g, device="cuda")
    kv = cl.make_kv(models["bf16_inductor"], batch, ctx, "cuda") if kind == "decode" else None
    out: dict[str, Any] = {}
    for path in paths:
        torch._dynamo.reset()
        fn = cl.compile_path(path, cl.runner_for(kind, models[path], kv), "cuda")

        def step(fn: Any = fn) -> Any:
            return fn(ids)

        with torch.no_grad():
            for _ in range(3):
                step()
            replay, note = cl.graph_replay(step)
            graph_us = cl.bench_ms(replay, "cuda") * 1e3 if replay else None
            kernels = kernels_in_order(step, calls)
        total = sum(us for _, us in kernels)
        out[path] = {"graph_us": graph_us, "graph_note": note, "kernels": kernels, "sum_us": total}
        print(f"{row} {path}: graph {graph_us} us, {len(kernels)} kernels, sum {total:.1f} us")
        for name, us in kernels:
            print(f"   {us:7.1f}  {name[:90]}")
    return out


def report(res: dict[str, Any]) -> str:
    lines = [f"# GPU time per kernel of a compiled Llama step on {res['device']}", ""]
    lines += [res["machine"], "", f"`cuda_step_kernels.py {' '.join(res['argv'])}`", ""]
    lines += [f"Copy rate (1 GiB device to device, read + written): {res['copy_GBs']:.0f} GB/s", ""]
    for row, paths in res["rows"].items():
        for p, r in paths.items():
            g = f"{r['graph_us']:.1f}" if r["graph_us"] else r["graph_note"]
            lines += [f"## {row}, {p}: graph {g} us, kernels' sum {r['sum_us']:.1f} us", ""]
            lines += ["| # | kernel | us |", "|---|---|---|"]
            lines += [f"| {i} | {n[:80]} | {us:.1f} |" for i, (n, us) in enumerate(r["kernels"])]
            lines += ["", "| kernel | us | launches |", "|---|---|---|"]
            lines += [f"| {n} | {us:.1f} | {c} |" for n, us, c in by_name(r["kernels"])]
            lines.append("")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="llama3-gqa", choices=sorted(cl.CONFIGS))
    ap.add_argument("--rows", nargs="*", default=["decode 64"])
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--paths", nargs="*", default=["bf16_inductor", "pdlkit_int8"])
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--out", default="benchmarks/results")
    a = ap.parse_args()
    from machine import host_header

    import pdlkit.backend  # noqa: F401  as a script using pdlkit imports it: before any compile

    res: dict[str, Any] = {"argv": sys.argv[1:], "device": torch.cuda.get_device_name()}
    res["machine"] = " ".join(host_header())
    res["copy_GBs"] = copy_rate()
    model = cl.build_model(a.config, "cuda")
    ids = torch.randint(0, cl.VOCAB, (1, 16), device="cuda")
    models = {"bf16_inductor": model, **cl.quantized_copies(model, ids, a.paths)}
    res["rows"] = {row: measure(row, models, a.ctx, a.paths, a.calls) for row in a.rows}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"cuda_step_kernels_{a.config}.json").write_text(json.dumps(res, indent=1))
    (out / f"cuda_step_kernels_{a.config}.md").write_text(report(res))


if __name__ == "__main__":
    main()

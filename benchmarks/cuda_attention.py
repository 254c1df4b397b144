"""The attention of a decode step on a GPU: pdlkit's Triton decode kernel against torch's SDPA
backends, at Llama-3's shapes (32 query heads over 8 key/value heads, head dim 128).

    python benchmarks/cuda_attention.py [--out DIR] [--rows B ...] [--ctx L ...] [--heads HQ HKV]
        [--sweep]
    python benchmarks/cuda_attention.py --best FILE B   # the fastest rule of a sweep's row B

For each row (B sequences, one query token each, a cache of L tokens, bfloat16): the kernel of
``kernels/cuda/_triton_attention.py`` at its default tile, at the tile a graph compiled for a
growing cache takes (the length symbolic: the most slices for B, those past the cache's end
empty), and with ``--sweep`` at other tiles, warps and pipeline stages, and ``F.scaled_dot_product_attention(..., enable_gqa=True)``
under each SDPA backend that takes it (cuDNN is what Inductor's graph of transformers' Llama
calls on an H200). Timing: a CUDA graph of 20 back-to-back calls over rotating caches (four,
together over L2's size where a cache is large), its replay time over the calls, the median
of 7 replays; GB/s counts the cache's keys and values read once. Also the largest difference
from the math backend in float32.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from dataclasses import astuple, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

HQ, HKV, D = 32, 8, 128
# tile rules (kernels/cuda/_triton_attention.py's Rule): tokens a tile, programs aimed for, stages
SWEEP = [(bn, p, 4, s) for bn in (16, 32, 64) for p in (512, 1024, 2048) for s in (2, 3)]
SWEEP += [
    (bn, p, w, s) for bn in (32, 64, 128) for p in (512, 4096) for w in (4, 8) for s in (2, 4)
]
# fewer warps a program: shorter reductions on a decode tile's few rows
SWEEP += [(bn, 512, w, s) for bn in (16, 32, 64) for w in (1, 2) for s in (2, 3, 4)]


def graph_us(call: Callable[[int], Any], copies: int, calls: int = 20) -> float:
    """Replay time of a graph of ``calls`` calls (call(i) uses copy i % copies), per call."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(3):
            call(i % copies)  # one copy where a cache is over 100 MB
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(calls):
            call(i % copies)
    times = []
    for _ in range(7):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        g.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(times)


def row(b: int, ctx: int, sweep: bool, heads: tuple[int, int] = (HQ, HKV)) -> dict[str, Any]:
    from pdlkit.kernels.cuda._triton_attention import Rule, decode_attention, pick_tile

    HQ, HKV = heads  # noqa: N806 (the module's constants, for another model's heads)
    nbytes = 2 * b * HKV * ctx * D * 2
    copies = max(1, min(4, (200 << 20) // nbytes))
    g = torch.Generator(device="cuda").manual_seed(b)
    q = torch.randn(b, HQ, 1, D, device="cuda", generator=g).bfloat16()
    ks = [torch.randn(b, HKV, ctx, D, device="cuda", generator=g).bfloat16() for _ in range(copies)]
    vs = [torch.randn(b, HKV, ctx, D, device="cuda", generator=g).bfloat16() for _ in range(copies)]
    scale = D**-0.5
    out: dict[str, Any] = {"B": b, "ctx": ctx, "heads": [HQ, HKV], "cache_MB": nbytes / 1e6}
    out["us"] = {}
    want = F.scaled_dot_product_attention(
        q.float(), ks[0].float(), vs[0].float(), scale=scale, enable_gqa=True
    )
    got = decode_attention(q, ks[0], vs[0], None, scale)
    out["max_err_vs_fp32"] = (got.float() - want).abs().max().item()
    tiles = {"pdlkit": pick_tile(b * HKV, ctx, D, HQ // HKV)}
    # a graph compiled for a growing cache: the length symbolic, the most slices for B
    tiles["pdlkit, length symbolic"] = pick_tile(b * HKV, None, D, HQ // HKV)
    tiles["pdlkit, partial tile last"] = replace(tiles["pdlkit"], tail_first=False)
    for r in SWEEP if sweep else []:
        tiles["rule " + ",".join(map(str, r))] = Rule(*r).tile(b * HKV, ctx, HQ // HKV)
    for key, tile in tiles.items():
        out.setdefault("tiles", {})[key] = astuple(tile)

        def ours(i: int, tile: Any = tile) -> torch.Tensor:
            return decode_attention(q, ks[i], vs[i], None, scale, tile)

        try:
            out["us"][key] = graph_us(ours, copies)
        except Exception as e:  # a tile that does not fit (shared memory)
            out["us"][key] = f"{type(e).__name__}: {str(e)[:80]}"
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for name in ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH"):
        try:
            with sdpa_kernel(getattr(SDPBackend, name)):
                out["us"][f"sdpa {name.lower()}"] = graph_us(
                    lambda i: F.scaled_dot_product_attention(
                        q, ks[i], vs[i], scale=scale, enable_gqa=True
                    ),
                    copies,
                )
        except Exception as e:
            out["us"][f"sdpa {name.lower()}"] = f"{type(e).__name__}: {str(e)[:80]}"
    out["GB/s"] = {k: nbytes / v / 1e3 for k, v in out["us"].items() if isinstance(v, float)}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--rows", type=int, nargs="*", default=[1, 64, 256])
    p.add_argument("--ctx", type=int, nargs="*", default=[129])
    p.add_argument("--heads", type=int, nargs=2, default=[HQ, HKV], metavar=("HQ", "HKV"))
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--best", nargs=2, metavar=("FILE", "B"))
    a = p.parse_args()
    if a.best:  # as PDLKIT_DECODE_ATTENTION_RULE takes it
        rows = [r for r in json.loads(Path(a.best[0]).read_text()) if r["B"] == int(a.best[1])]
        timed = [(v, k) for k, v in rows[0]["us"].items() if k.startswith("rule ") and isinstance(v, float)]  # fmt: skip
        print(min(timed)[1].removeprefix("rule "))
        return
    results = [row(b, ctx, a.sweep, tuple(a.heads)) for ctx in a.ctx for b in a.rows]
    for r in results:
        best = sorted((v, k) for k, v in r["us"].items() if isinstance(v, float))[:6]
        print(
            f"B={r['B']} ctx={r['ctx']} heads {r['heads']} ({r['cache_MB']:.1f} MB) err {r['max_err_vs_fp32']:.2e}"
        )
        for v, k in best:
            tile = r["tiles"].get(k, "")
            print(f"  {k:28s} {v:8.2f} us  {r['cache_MB'] * 1e3 / v:7.0f} GB/s  {tile}")
        for k, v in r["us"].items():
            if not isinstance(v, float):
                print(f"  {k:28s} {v}")
    name = f"cuda_attention{'_sweep' if a.sweep else ''}.json"
    (Path(a.out) / name).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

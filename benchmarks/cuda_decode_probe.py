"""Where a decode GEMM's time goes past its weights' bytes: variants of the split-K kernel's
loop, each leaving one thing out or changing one thing, timed as cuda_decode.py times the GEMMs
(a CUDA graph of back-to-back calls over weight copies three times L2's size).

    python benchmarks/cuda_decode_probe.py [--out DIR] [--cases '64 down' ...]
        [--variants base 'no A' ...] [--tiles BN,BK,warps,stages[,K slices] ...]

Variants of ``kernels/cuda/_triton_splitk.py``'s loop (int8 in, int32 sums, the bf16
epilogue of per-row and per-column scales), on the same tiles:
- ``base``: the loop as the library runs it (every program walks K from 0 in step);
- ``rotated``: program n of N starts its walk at K step n * STEPS // N and wraps around, so
  that the programs do not all read the same activation bytes from L2 at the same moment
  (int32 sums: the same result);
- ``no A``: the dot takes a constant activation tile from registers: no activation bytes
  read (what the weights' stream and the dots cost alone);
- ``no dot``: A and B loaded and summed per row, no tensor-core work (Triton does not
  pipeline these loads: far slower, a warning more than a measure);
- ``warp-specialized``: Triton's ``tl.range(warp_specialize=True)`` (Triton 3.6 builds it
  for Hopper only with eight warps here);
- ``evict first``: the weight loads with ``eviction_policy="evict_first"`` (the L2 hint was
  worth 1.0-1.7 us to the hand-written kernel, cuda_multicast_probe_h200_dd95b4a.md);
- ``library``: pdlkit's ``splitk`` on the same tile, tile counters kept between calls;
- ``counter``, ``flags``, ``atomic``: three ways to add K slices' sums (``_reduce``).
A tile with K slices (a fifth number) under ``base`` stores each slice's sums and stops:
split K's traffic without the tile's final addition. Each case beside the read floor of its
weight bytes (cuda_decode.stream_floor) and the time at 80% of the copy rate.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cuda_decode import _rotation, copy_rate, graph_ms, stream_floor, weight_copies  # noqa: E402
from machine import host_header  # noqa: E402
from measure import write_report  # noqa: E402

_WS: dict[str, torch.Tensor] = {}  # split K's partial sums and tile counters (probe only)
VARIANTS = {
    "base": (1, 1, 0, 0),
    "rotated": (1, 1, 1, 0),
    "no A": (0, 1, 0, 0),
    "no dot": (1, 0, 0, 0),
    "warp-specialized": (1, 1, 0, 1),
    "evict first": (1, 1, 0, 0),
    "library": (1, 1, 0, 0),
    "counter": (1, 1, 0, 0, 1),
    "flags": (1, 1, 0, 0, 2),
    "atomic": (1, 1, 0, 0, 3),
}  # (LOAD_A, DOT, ROTATE, WS[, REDUCE: how K slices' sums are added, see _reduce])
EVICT_FIRST = {"evict first"}  # variants whose weight loads ask L2 to evict them first
# (M, N, K, name): Llama-2-7B's o and down, Llama-3's down, at 64 and 16 rows
CASES = [
    (64, 4096, 11008, "down 4096x11008"),
    (64, 4096, 14336, "GQA down 4096x14336"),
    (64, 4096, 4096, "o 4096x4096"),
    (16, 4096, 11008, "down 4096x11008"),
]
# (BN, BK, warps, stages[, K slices]); BM covers the rows
TILES: list[tuple[int, ...]] = [(32, 256, 4, 6), (64, 256, 4, 4), (64, 128, 4, 8)]


@triton.jit
def _reduce(acc, pid_m, pid_n, ws_ptr, flag_ptr, SPLIT: tl.constexpr, REDUCE: tl.constexpr,
            BM: tl.constexpr, BN: tl.constexpr):  # fmt: skip
    """K slice pid_k's sums of tile (pid_m, pid_n): (the tile's whole sums, True) for the
    slice that finishes it, (its own, False) for the others. REDUCE 0: stored, never added
    (traffic only); 1: stored, then a tile counter (acq_rel) picks the last, which adds every
    slice's block (the library's ``_slices_epilogue``); 2: a ticket first (acq_rel), then the
    slices before the last store their block and raise a flag, and the last adds its own sums
    to theirs as each flag comes up (no store, fence and round trip of its own before it
    knows); 3: every slice adds its sums into one zeroed block (relaxed atomics), the counter
    picks the last, which reads the block and zeroes it."""
    tiles = tl.num_programs(0) * tl.num_programs(1)
    tile = pid_n * tl.num_programs(0) + pid_m
    pid_k = tl.program_id(2)
    offs = tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :]
    blk = BM * BN
    last = False
    if REDUCE == 0:
        tl.store(ws_ptr + (pid_k * tiles + tile).to(tl.int64) * blk + offs, acc)
    elif REDUCE == 1:
        tl.store(ws_ptr + (pid_k * tiles + tile).to(tl.int64) * blk + offs, acc)
        tl.debug_barrier()
        last = tl.atomic_add(flag_ptr + tile, 1, sem="acq_rel") == SPLIT - 1
        if last:
            acc = tl.zeros((BM, BN), dtype=tl.int32)
            for s in tl.static_range(SPLIT):
                blk_s = ws_ptr + (s * tiles + tile).to(tl.int64) * blk + offs
                acc += tl.load(blk_s, cache_modifier=".cg")
            tl.atomic_xchg(flag_ptr + tile, 0)
    elif REDUCE == 2:
        t = tl.atomic_add(flag_ptr + tile, 1, sem="acq_rel")
        last = t == SPLIT - 1
        if last:
            for s in tl.static_range(SPLIT - 1):  # a flag per ticket, after the counters
                while tl.atomic_add(flag_ptr + tiles * (1 + s) + tile, 0, sem="acquire") == 0:
                    pass
                blk_s = ws_ptr + (s * tiles + tile).to(tl.int64) * blk + offs
                acc += tl.load(blk_s, cache_modifier=".cg")
                tl.atomic_xchg(flag_ptr + tiles * (1 + s) + tile, 0)
            tl.atomic_xchg(flag_ptr + tile, 0)
        else:
            tl.store(ws_ptr + (t * tiles + tile).to(tl.int64) * blk + offs, acc)
            tl.debug_barrier()
            tl.atomic_xchg(flag_ptr + tiles * (1 + t) + tile, 1, sem="release")
    else:
        part = ws_ptr + tile.to(tl.int64) * blk + offs
        tl.atomic_add(part, acc, sem="relaxed")
        tl.debug_barrier()
        last = tl.atomic_add(flag_ptr + tile, 1, sem="acq_rel") == SPLIT - 1
        if last:
            acc = tl.load(part, cache_modifier=".cg")
            tl.store(part, tl.zeros((BM, BN), dtype=tl.int32))
            tl.atomic_xchg(flag_ptr + tile, 0)
    return acc, last


@triton.jit
def probe_kernel(
    a_ptr, b_ptr, c_ptr, sa_ptr, sb_ptr, M, N: tl.constexpr, K: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    LOAD_A: tl.constexpr, DOT: tl.constexpr, ROTATE: tl.constexpr, WS: tl.constexpr,
    SPLIT: tl.constexpr, REDUCE: tl.constexpr, ws_ptr, flag_ptr, EVICT: tl.constexpr = 0,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    STEPS: tl.constexpr = K // BK // SPLIT
    rk = tl.program_id(2) * STEPS * BK + tl.arange(0, BK)
    start = 0
    if ROTATE:
        start = (pid_n * STEPS) // tl.num_programs(1)
    m_ok = (rm < M)[:, None]
    acc = tl.zeros((BM, BN), dtype=tl.int32)
    row = tl.zeros((BM,), dtype=tl.int32)
    col = tl.zeros((BN,), dtype=tl.int32)
    for i in tl.range(STEPS, warp_specialize=WS):
        step = start + i
        step = tl.where(step >= STEPS, step - STEPS, step)
        k0 = step * BK
        if EVICT:
            b = tl.load(b_ptr + rn[:, None] * K + k0 + rk[None, :], eviction_policy="evict_first")
        else:
            b = tl.load(b_ptr + rn[:, None] * K + k0 + rk[None, :])
        if LOAD_A:
            a = tl.load(a_ptr + rm[:, None] * K + k0 + rk[None, :], mask=m_ok, other=0)
        else:
            a = tl.full((BM, BK), 1, tl.int8)
        if DOT:
            acc = tl.dot(a, tl.trans(b), acc, out_dtype=tl.int32)
        else:
            row += tl.sum(a.to(tl.int32), axis=1)
            col += tl.sum(b.to(tl.int32), axis=1)
    acc += row[:, None] + col[None, :]
    last = True
    if SPLIT > 1:
        acc, last = _reduce(acc, pid_m, pid_n, ws_ptr, flag_ptr, SPLIT, REDUCE, BM, BN)
    if last:
        sa = tl.load(sa_ptr + rm, mask=rm < M, other=0.0)
        sb = tl.load(sb_ptr + rn)
        y = acc.to(tl.float32) * sa[:, None] * sb[None, :]
        tl.store(c_ptr + rm[:, None] * N + rn[None, :], y.to(tl.bfloat16), mask=m_ok)


def run(
    a: torch.Tensor, w: torch.Tensor, c: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor,
    tile: tuple[int, ...], variant: str,
) -> None:  # fmt: skip
    bn, bk, warps, stages, split = (*tile, 1)[:5]
    m, k = a.shape
    n = w.shape[0]
    bm = min(64, max(16, triton.next_power_of_2(m)))
    if variant == "library":  # pdlkit's split-K kernel on this tile, tile counters kept
        from pdlkit.kernels.cuda._triton_splitk import SplitConfig, splitk

        cfg = SplitConfig(bm, bn, bk, split, warps, stages)
        splitk(a, sa, w, sb, c, config=cfg, counters=_WS["counters"] if split > 1 else None)
        return
    load_a, dot, rot, ws, reduce = (*VARIANTS[variant], 0)[:5]
    probe_kernel[(triton.cdiv(m, bm), n // bn, split)](
        a, w, c, sa, sb, m, N=n, K=k, BM=bm, BN=bn, BK=bk,
        LOAD_A=load_a, DOT=dot, ROTATE=rot, WS=ws, SPLIT=split, REDUCE=reduce,
        ws_ptr=_WS["zeroed" if reduce == 3 else "ws"], flag_ptr=_WS["counters"],
        EVICT=int(variant in EVICT_FIRST), num_warps=warps, num_stages=stages,
    )  # fmt: skip


def operands(
    m: int, n: int, k: int, copies: int
) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random int8 weights (``copies`` of [n, k]), int8 activations [m, k], their scales per
    row and column, and a bf16 output [m, n], on the GPU."""
    ws = [torch.randint(-127, 128, (n, k), dtype=torch.int8, device="cuda") for _ in range(copies)]
    a = torch.randint(-127, 128, (m, k), dtype=torch.int8, device="cuda")
    sa = torch.rand(m, device="cuda") * 0.01
    sb = torch.rand(n, device="cuda") * 0.01
    return ws, a, sa, sb, torch.empty(m, n, dtype=torch.bfloat16, device="cuda")


def probe_case(
    m: int, n: int, k: int, copy_gbs: float, tiles: list[tuple[int, ...]], variants: list[str]
) -> list[dict[str, Any]]:
    copies = weight_copies(n * k)
    ws, a, sa, sb, c = operands(m, n, k, copies)
    ref = ((a.float() @ ws[0].float().T) * sa[:, None] * sb).bfloat16()
    _WS["ws"] = torch.empty(m * n * 8, dtype=torch.int32, device="cuda")
    _WS["counters"] = torch.zeros(1 << 16, dtype=torch.int32, device="cuda")
    _WS["zeroed"] = torch.zeros(m * n * 8, dtype=torch.int32, device="cuda")
    floor = stream_floor(n * k, copies)["read_graph_ms"] * 1e3
    rows = []
    for tile in tiles:
        if k % (tile[1] * (*tile, 1)[4]):
            continue
        times: dict[str, float] = {}
        for _ in range(2):  # the variants interleaved, twice; the better of the two kept
            for v in variants:
                try:
                    us = _time_variant(a, ws, c, sa, sb, tile, v, ref)
                except Exception as e:  # a variant this Triton cannot build: noted, not fatal
                    print(f"{v} {tile}: {type(e).__name__}: {str(e)[:160]}", flush=True)
                    us = float("nan")
                times[v] = min(times.get(v, us), us)
        rows.append({"m": m, "n": n, "k": k, "tile": tile, "floor_us": floor,
                     "bytes_us": n * k / copy_gbs / 1e3, **times})  # fmt: skip
        print(rows[-1], flush=True)
    return rows


def _time_variant(
    a: torch.Tensor, ws: list[torch.Tensor], c: torch.Tensor, sa: torch.Tensor,
    sb: torch.Tensor, tile: tuple[int, ...], v: str, ref: torch.Tensor,
) -> float:  # fmt: skip
    """us per call of variant ``v`` in a graph; those that compute the GEMM checked first."""
    fns = [functools.partial(run, a, w, c, sa, sb, tile, v) for w in ws]
    reduced = v == "library" or len(VARIANTS[v]) > 4 or len(tile) < 5 or tile[4] == 1
    if VARIANTS[v][:2] == (1, 1) and reduced:
        c.fill_(float("nan"))
        fns[0]()
        err = ((c.float() - ref.float()).norm() / ref.float().norm()).item()
        assert err < 1e-2, f"{v} {tile}: relative error {err:.1e}"
    return graph_ms(_rotation(fns)) * 1e3


def markdown(rows: list[dict[str, Any]], copy_gbs: float) -> str:
    variants = [v for v in VARIANTS if v in rows[0]]
    head = "| M | GEMM (N x K) | tile (BN, BK, warps, stages) | read floor us | " + " | ".join(
        f"{v} us" for v in variants
    )
    lines = [f"# Decode GEMM probe on {torch.cuda.get_device_name()}", "", *host_header(), "",
             f"Copy rate {copy_gbs:.0f} GB/s.", "",
             head + " | 80% of copy us |", "|" + "---|" * (len(variants) + 5)]  # fmt: skip
    for r in rows:
        vals = " | ".join(f"{r[v]:.1f}" for v in variants)
        lines.append(f"| {r['m']} | {r['n']}x{r['k']} | {r['tile']} | {r['floor_us']:.1f} | "
                     f"{vals} | {r['bytes_us'] / 0.8:.1f} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--cases", nargs="*", help="only the cases whose 'M name' holds one of these")
    ap.add_argument("--tiles", nargs="*", help="BN,BK,warps,stages (default: TILES)")
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    a = ap.parse_args()
    tiles = [tuple(int(x) for x in t.split(",")) for t in a.tiles] if a.tiles else TILES
    cases = [c for c in CASES if not a.cases or any(w in f"{c[0]} {c[3]}" for w in a.cases)]
    gbs = copy_rate()
    rows = [r for m, n, k, _ in cases for r in probe_case(m, n, k, gbs, tiles, a.variants)]
    out = Path(a.out)
    write_report(out / "cuda_decode_probe.md", markdown(rows, gbs))
    (out / "cuda_decode_probe.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

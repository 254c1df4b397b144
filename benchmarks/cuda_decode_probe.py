"""Where a decode GEMM's time goes past its weights' bytes: variants of the split-K kernel's
one-slice loop, each leaving one thing out or changing one thing, timed as cuda_decode.py times
the GEMMs (a CUDA graph of back-to-back calls over weight copies three times L2's size).

    python benchmarks/cuda_decode_probe.py [--out DIR]

Variants of ``kernels/cuda/_triton_splitk.py``'s loop (one K slice, int8 in, int32 sums, the
bf16 epilogue of per-row and per-column scales), on the same tiles:
- ``base``: the loop as the library runs it (every program walks K from 0 in step);
- ``rotated``: program n of N starts its walk at K step n * STEPS // N and wraps around, so
  that the programs do not all read the same activation bytes from L2 at the same moment
  (int32 sums: the same result, bit for bit);
- ``no A``: the dot takes a constant activation tile from registers: no activation bytes
  read (what the weights' stream and the dots cost alone);
- ``no dot``: A and B loaded and summed per row, no tensor-core work.
Each beside the read floor of the case's weight bytes (cuda_decode.stream_floor).
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

VARIANTS = {"base": (1, 1, 0), "rotated": (1, 1, 1), "no A": (0, 1, 0), "no dot": (1, 0, 0)}
# (M, N, K, name): Llama-2-7B's o and down, Llama-3's down, at 64 and 16 rows
CASES = [
    (64, 4096, 11008, "down 4096x11008"),
    (64, 4096, 14336, "GQA down 4096x14336"),
    (64, 4096, 4096, "o 4096x4096"),
    (16, 4096, 11008, "down 4096x11008"),
]
# (BN, BK, warps, stages); BM covers the rows
TILES = [(32, 256, 4, 6), (64, 256, 4, 4), (64, 128, 4, 8)]


@triton.jit
def probe_kernel(
    a_ptr, b_ptr, c_ptr, sa_ptr, sb_ptr, M, N: tl.constexpr, K: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    LOAD_A: tl.constexpr, DOT: tl.constexpr, ROTATE: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    STEPS: tl.constexpr = K // BK
    start = 0
    if ROTATE:
        start = (pid_n * STEPS) // tl.num_programs(1)
    m_ok = (rm < M)[:, None]
    acc = tl.zeros((BM, BN), dtype=tl.int32)
    row = tl.zeros((BM,), dtype=tl.int32)
    col = tl.zeros((BN,), dtype=tl.int32)
    for i in range(STEPS):
        step = start + i
        step = tl.where(step >= STEPS, step - STEPS, step)
        k0 = step * BK
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
    sa = tl.load(sa_ptr + rm, mask=rm < M, other=0.0)
    sb = tl.load(sb_ptr + rn)
    y = acc.to(tl.float32) * sa[:, None] * sb[None, :]
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], y.to(tl.bfloat16), mask=m_ok)


def run(a, w, c, sa, sb, tile, variant) -> None:  # type: ignore[no-untyped-def]
    bn, bk, warps, stages = tile
    m, k = a.shape
    n = w.shape[0]
    bm = min(64, max(16, triton.next_power_of_2(m)))
    load_a, dot, rot = VARIANTS[variant]
    probe_kernel[(triton.cdiv(m, bm), n // bn)](
        a, w, c, sa, sb, m, N=n, K=k, BM=bm, BN=bn, BK=bk,
        LOAD_A=load_a, DOT=dot, ROTATE=rot, num_warps=warps, num_stages=stages,
    )  # fmt: skip


def probe_case(m: int, n: int, k: int, copy_gbs: float) -> list[dict[str, Any]]:
    copies = weight_copies(n * k)
    ws = [torch.randint(-127, 128, (n, k), dtype=torch.int8, device="cuda") for _ in range(copies)]
    a = torch.randint(-127, 128, (m, k), dtype=torch.int8, device="cuda")
    sa = torch.rand(m, device="cuda") * 0.01
    sb = torch.rand(n, device="cuda") * 0.01
    c = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    ref = ((a.float() @ ws[0].float().T) * sa[:, None] * sb).bfloat16()
    floor = stream_floor(n * k, copies)["read_graph_ms"] * 1e3
    rows = []
    for tile in TILES:
        if k % tile[1]:
            continue
        times: dict[str, float] = {}
        for _ in range(2):  # the variants interleaved, twice; the better of the two kept
            for v in VARIANTS:
                fns = [functools.partial(run, a, w, c, sa, sb, tile, v) for w in ws]
                if v in ("base", "rotated"):
                    c.fill_(float("nan"))
                    fns[0]()
                    err = ((c.float() - ref.float()).norm() / ref.float().norm()).item()
                    assert err < 1e-2, f"{v} {tile}: relative error {err:.1e}"
                    if v == "base":
                        base = c.clone()
                    assert v == "base" or torch.equal(c, base), "rotated differs from base"
                us = graph_ms(_rotation(fns)) * 1e3
                times[v] = min(times.get(v, us), us)
        rows.append({"m": m, "n": n, "k": k, "tile": tile, "floor_us": floor,
                     "bytes_us": n * k / copy_gbs / 1e3, **times})  # fmt: skip
        print(rows[-1], flush=True)
    return rows


def markdown(rows: list[dict[str, Any]], copy_gbs: float) -> str:
    head = "| M | GEMM (N x K) | tile (BN, BK, warps, stages) | read floor us | " + " | ".join(
        f"{v} us" for v in VARIANTS
    )
    lines = [f"# Decode GEMM probe on {torch.cuda.get_device_name()}", "", *host_header(), "",
             f"Copy rate {copy_gbs:.0f} GB/s.", "",
             head + " | 80% of copy us |", "|" + "---|" * (len(VARIANTS) + 5)]  # fmt: skip
    for r in rows:
        vals = " | ".join(f"{r[v]:.1f}" for v in VARIANTS)
        lines.append(f"| {r['m']} | {r['n']}x{r['k']} | {r['tile']} | {r['floor_us']:.1f} | "
                     f"{vals} | {r['bytes_us'] / 0.8:.1f} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results")
    a = ap.parse_args()
    gbs = copy_rate()
    rows = [r for m, n, k, _ in CASES for r in probe_case(m, n, k, gbs)]
    out = Path(a.out)
    write_report(out / "cuda_decode_probe.md", markdown(rows, gbs))
    (out / "cuda_decode_probe.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

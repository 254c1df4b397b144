"""Decode-shaped int8 GEMMs with the weights read through TMA (Hopper's tensor memory
accelerator), against the pointer loads of ``kernels/cuda/_triton_splitk.py``.

    python benchmarks/cuda_decode_tma.py [--out DIR] [--rows 64]

The question: whether the decode GEMMs' fixed 3-5 us over their bytes at the copy rate
(H200, 64 rows: the o-projection 7.9 us against 4.0, down 16.2 against 10.7;
results/cuda_decode_h200_m64_blocked_501d4fe.md) goes with the way tiles are loaded. The
pointer kernel issues each [BN, BK] tile as per-thread asynchronous copies; here one
instruction per tile copies it (``tl.make_tensor_descriptor``, device-side descriptors). Same
tiles, same epilogue (``_triton_splitk._epilogue``), one K slice a program. Timed as
``cuda_decode.py`` times its ``graph`` column: a CUDA graph of back-to-back calls over
rotating weight copies, us per call.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cuda_decode import _rotation, copy_rate, graph_ms, weight_copies  # noqa: E402
from machine import host_header  # noqa: E402
from pdlkit.kernels.cuda import _triton_splitk as S  # noqa: E402

# (name, N, K, gated): Llama-2-7B's GEMMs at decode (Q, K and V as one 12288-row weight)
SHAPES = [
    ("o 4096x4096", 4096, 4096, False),
    ("down 4096x11008", 4096, 11008, False),
    ("gate+up 2 x 11008x4096", 11008, 4096, True),
    ("QKV as one 12288x4096", 12288, 4096, False),
]
# (BN, BK, warps, stages)
CONFIGS = [
    (32, 256, 4, 4), (32, 256, 4, 6), (32, 128, 4, 6), (32, 128, 4, 8), (64, 128, 4, 4),
    (64, 128, 4, 6), (64, 256, 4, 4), (64, 256, 4, 3), (16, 256, 4, 6), (128, 128, 4, 4),
    (64, 128, 8, 6), (32, 256, 8, 6),
]  # fmt: skip


@triton.jit
def tma_kernel(
    a_ptr, b_ptr, u_ptr, c_ptr, a_scale_ptr, b_scale_ptr, u_scale_ptr, M,
    N: tl.constexpr, K: tl.constexpr, GATED: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
):  # fmt: skip
    """C[M, N] = epilogue(A[M, K] @ B[N, K]^T) (and U's for a gated pair), A and B through
    TMA descriptors; program (m, n) owns one BM x BN tile over all of K."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[K, 1], block_shape=[BN, BK])
    u_desc = tl.make_tensor_descriptor(u_ptr, shape=[N, K], strides=[K, 1], block_shape=[BN, BK])
    acc = tl.zeros((BM, BN), dtype=tl.int32)
    acc_u = tl.zeros((BM, BN), dtype=tl.int32)
    for k0 in range(0, K, BK):
        a = a_desc.load([pid_m * BM, k0])
        b = b_desc.load([pid_n * BN, k0])
        acc = tl.dot(a, tl.trans(b), acc, out_dtype=tl.int32)
        if GATED:
            u = u_desc.load([pid_n * BN, k0])
            acc_u = tl.dot(a, tl.trans(u), acc_u, out_dtype=tl.int32)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    S._epilogue(
        acc, acc_u, rm, rn, c_ptr, N, a_scale_ptr, b_scale_ptr, u_scale_ptr, b_scale_ptr, M, N,
        GATED, False,
    )  # fmt: skip


Tile = tuple[int, int, int, int]  # (BN, BK, warps, stages)


def tma(
    a: torch.Tensor,
    sa: torch.Tensor,
    b: torch.Tensor,
    sb: torch.Tensor,
    out: torch.Tensor,
    u: torch.Tensor | None = None,
    su: torch.Tensor | None = None,
    cfg: Tile = (32, 256, 4, 4),
) -> None:
    """out = the split-K kernel's epilogue of a @ b.T (and u's), through :func:`tma_kernel`."""
    bn, bk, warps, stages = cfg
    m, k = a.shape
    n = b.shape[0]
    bm = min(64, max(16, triton.next_power_of_2(m)))
    grid = (triton.cdiv(m, bm), triton.cdiv(n, bn))
    tma_kernel[grid](
        a, b, u if u is not None else b, out, sa, sb, su if su is not None else sb, m,
        N=n, K=k, GATED=u is not None, BM=bm, BN=bn, BK=bk, num_warps=warps, num_stages=stages,
    )  # fmt: skip


def case_row(name: str, m: int, n: int, k: int, gated: bool, copy_gbs: float) -> dict[str, Any]:
    nbytes = n * k * (2 if gated else 1)
    copies = weight_copies(nbytes, least=3)
    q = torch.randint(-127, 128, (m, k), dtype=torch.int8, device="cuda")
    sa = torch.rand(m, device="cuda") * 0.01
    sb, su = (torch.rand(n, device="cuda") * 0.01 for _ in range(2))
    sets = [
        [torch.randint(-127, 128, (n, k), dtype=torch.int8, device="cuda") for _ in range(1 + gated)]
        for _ in range(copies)
    ]  # fmt: skip
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    w0 = sets[0]
    ref = (q.float() @ w0[0].float().T) * sa[:, None] * sb
    if gated:
        ref = F.silu(ref) * ((q.float() @ w0[1].float().T) * sa[:, None] * su)

    def run(fn: Any, ws: list[torch.Tensor]) -> None:
        fn(q, sa, ws[0], sb, out, *((ws[1], su) if gated else ()))

    row: dict[str, Any] = {"shape": name, "m": m, "bytes": nbytes}
    kinds: dict[str, Any] = {  # the committed split-K kernel with its own pick of tiles
        "pointer pick": lambda a, sa, b, sb, out, u=None, su=None: S.splitk(
            a, sa, b, sb, out, u=u, u_scale=su
        )
    }
    kinds.update({f"tma {c}": functools.partial(tma, cfg=c) for c in CONFIGS})
    for label, fn in kinds.items():
        try:
            out.fill_(float("nan"))
            run(fn, w0)
            err = ((out.float() - ref).norm() / ref.norm()).item()
            assert err < 1e-2, f"relative error {err:.1e}"
            us = 1e3 * graph_ms(_rotation([functools.partial(run, fn, ws) for ws in sets]))
            row[label] = us
            print(
                f"  {name} m={m} {label}: {us:.1f} us ({nbytes / us / 1e3 / copy_gbs:.0%} of copy)",
                flush=True,
            )
        except Exception as e:  # noqa: BLE001 - a config that does not compile or is wrong
            print(f"  {name} m={m} {label}: {type(e).__name__}: {str(e)[:160]}", flush=True)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results"))
    p.add_argument("--rows", type=int, nargs="+", default=[64])
    args = p.parse_args()
    triton.set_allocator(
        lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda")
    )
    header = host_header()
    copy_gbs = copy_rate()
    print("\n".join(header), f"copy {copy_gbs:.0f} GB/s", flush=True)
    rows = [case_row(nm, m, n, k, g, copy_gbs) for m in args.rows for nm, n, k, g in SHAPES]
    lines = ["# Decode int8 GEMMs: TMA loads against pointer loads", "", *header, "",
             f"Copy rate {copy_gbs:.0f} GB/s (read + written). us per call in a CUDA graph.", "",
             "| M | GEMM | pointer (pick) us | best TMA us | best TMA config (BN, BK, warps, stages) | TMA / pointer |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        t = {k: v for k, v in r.items() if k.startswith("tma")}
        best = min(t, key=t.__getitem__) if t else None
        ptr = r.get("pointer pick", float("nan"))
        if best:
            lines.append(
                f"| {r['m']} | {r['shape']} | {ptr:.1f} | {t[best]:.1f} | {best[4:]} | {t[best] / ptr:.2f}x |"
            )
    Path(args.out).mkdir(parents=True, exist_ok=True)
    Path(args.out, "cuda_decode_tma.md").write_text("\n".join(lines) + "\n")
    Path(args.out, "cuda_decode_tma.json").write_text(
        json.dumps({"copy_GBs": copy_gbs, "rows": rows}, indent=1)
    )
    print("\n".join(lines))


if __name__ == "__main__":
    main()

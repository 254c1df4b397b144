"""Programmatic dependent launch (PDL) for the decode GEMMs that follow a per-token quantization:
what it would save, measured before any kernel is changed for it.

    python benchmarks/cuda_pdl.py [--out DIR] [--rows 64]

A decode layer runs ``quant_rows`` (2-3 us, 64 programs) and then an int8 GEMM that streams
16-45 MB of weights (the o- and down-projections; Q/K/V and gate/up follow ``rmsnorm_quant``
the same way). Stream order makes the GEMM wait for the quantization to finish, drain and
flush before its first program starts; at 64 rows the GEMMs run 3-5 us over their bytes at
the copy rate (results/cuda_decode_h200_m64_blocked_501d4fe.md). With PDL (Hopper) the
quantization lets its dependent launch at once (``gdc_launch_dependents``), and the GEMM's
programs wait (``gdc_wait``) only before they read the quantized rows; what they do before
that overlaps the quantization. Inductor launches user-defined Triton kernels without the
launch attribute, so this is a question for a path of pdlkit's own (captured graphs), and
this script asks it of the committed kernels' code, launched by Triton directly:

- ``library``: the library's ``quant_rows`` then ``splitk`` (as in a model today);
- ``stream order``: this script's launches of the same two bodies, in stream order;
- ``PDL``: the same two bodies, the first triggering its dependent at once, the second
  launched with ``launch_pdl=True`` and waiting before its body;
- ``PDL, trigger after the stores``: the quantization lets its dependent launch once each of
  its programs stored its row; ``PDL, implicit trigger``: once they all exited (no
  ``gdc_launch_dependents``; what is left is the launch latency);
- ``PDL + L2 prefetch``: as PDL, and each GEMM program first asks for its own weight rows in
  L2 (``cp.async.bulk.prefetch.L2``, one instruction a row), so that the weights stream while
  the quantization runs;
- ``prefetch only``: the prefetch without PDL (what the prefetch alone costs or saves);
- ``GEMM alone``: the GEMM on rows quantized once beforehand (no quantization in the chain).

Timed as ``cuda_decode.py``'s ``graph`` column: a CUDA graph of back-to-back pairs over rotating
weight copies (together over three times L2's 50 MB), us per pair; every variant's output is
compared with the stream-order one's (the same arithmetic: equal).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cuda_decode import _rotation, copy_rate, graph_ms, weight_copies  # noqa: E402
from machine import host_header  # noqa: E402
from pdlkit.kernels.cuda import _triton_gemm as G  # noqa: E402
from pdlkit.kernels.cuda import _triton_splitk as S  # noqa: E402

# (name, N, K): Llama-2-7B's GEMMs after a per-token quantization, and Llama-3's down
SHAPES = [
    ("o 4096x4096", 4096, 4096),
    ("down 4096x11008", 4096, 11008),
    ("down 4096x14336", 4096, 14336),
]
EPS, QMAX = 1e-8, 127.0


@triton.jit
def quant_trigger_kernel(
    x_ptr, q_ptr, s_ptr, stride_xm, eps: tl.constexpr, qmax: tl.constexpr,
    K: tl.constexpr, BLOCK: tl.constexpr, TRIGGER: tl.constexpr,
):  # fmt: skip
    """``quant_rows_kernel``, its dependent launched at once (TRIGGER 1), once this program
    stored its row (2), or once every program exited (0: the implicit trigger)."""
    if TRIGGER == 1:
        gdc_launch_dependents()
    G.quant_rows_kernel(x_ptr, q_ptr, s_ptr, stride_xm, eps, qmax, K, BLOCK)
    if TRIGGER == 2:
        gdc_launch_dependents()


@triton.jit
def _prefetch_rows(b_ptr, N, stride_bn: tl.constexpr, K: tl.constexpr, BN: tl.constexpr):
    """One bulk L2 prefetch per weight row of this program's column tile."""
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rows = tl.where(rn < N, rn, 0).to(tl.int64)
    size = tl.full((BN,), K, tl.int32)
    tl.inline_asm_elementwise(
        "cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0;",
        "=r,l,r",
        [b_ptr + rows * stride_bn, size],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def gemm_pdl_kernel(
    a_ptr, b_ptr, c_ptr, a_scale_ptr, b_scale_ptr, res_ptr, M, N: tl.constexpr, stride_am,
    stride_bn: tl.constexpr, stride_cm: tl.constexpr, K: tl.constexpr, K_SPLIT: tl.constexpr,
    EVEN_K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PREFETCH: tl.constexpr,
    WAIT: tl.constexpr,
):  # fmt: skip
    """``splitk_kernel`` with one K slice and a residual, after an optional prefetch of this
    program's weight rows and an optional ``gdc_wait`` (its inputs' producer finished)."""
    if PREFETCH:
        _prefetch_rows(b_ptr, N, stride_bn, K, BN)
    if WAIT:
        gdc_wait()
    S.splitk_kernel(
        a_ptr, b_ptr, None, c_ptr, None, None, a_scale_ptr, b_scale_ptr, None, None, res_ptr,
        None, M, N, stride_am, stride_bn, stride_cm, 0.0, 1.0, K, K_SPLIT, 1, EVEN_K, False, False,
        True, False, BM, BN, BK, 32,
    )  # fmt: skip


class Pair:
    """One quantize + GEMM + residual at M rows over ``copies`` weight copies."""

    def __init__(self, m: int, n: int, k: int, copies: int) -> None:
        g = torch.Generator(device="cuda").manual_seed(0)
        self.x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
        self.res = torch.randn(m, n, device="cuda", generator=g).to(torch.bfloat16)
        self.ws = [
            torch.randint(-127, 128, (n, k), dtype=torch.int8, device="cuda", generator=g)
            for _ in range(copies)
        ]
        self.sw = torch.rand(n, device="cuda", generator=g) / 100
        self.q, self.s = G.quant_rows(self.x, EPS, QMAX)
        self.out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
        self.cfg = S.pick_split_config(m, n, k, False, S._sms())
        self.m, self.n, self.k = m, n, k

    def quantize(self, trigger: int | None) -> None:
        if trigger is None:
            G.quant_rows(self.x, EPS, QMAX)  # into fresh tensors, as in a model
            return
        block = triton.next_power_of_2(self.k)
        quant_trigger_kernel[(self.m,)](
            self.x, self.q, self.s, self.x.stride(0), EPS, QMAX, K=self.k, BLOCK=block,
            TRIGGER=trigger, num_warps=G.row_warps(block),
        )  # fmt: skip

    def gemm(self, w: torch.Tensor, prefetch: bool, pdl: bool) -> None:
        c = self.cfg
        grid = (triton.cdiv(self.m, c.bm), triton.cdiv(self.n, c.bn))
        gemm_pdl_kernel[grid](
            self.q, w, self.out, self.s, self.sw, self.res, self.m, self.n, self.q.stride(0),
            w.stride(0), self.out.stride(0), K=self.k, K_SPLIT=triton.cdiv(self.k, c.bk) * c.bk,
            EVEN_K=self.k % c.bk == 0,
            BM=c.bm, BN=c.bn, BK=c.bk, PREFETCH=prefetch, WAIT=pdl,
            num_warps=c.warps, num_stages=c.stages, launch_pdl=pdl,
        )  # fmt: skip

    def library(self, w: torch.Tensor, quantize: bool = True) -> None:
        q, s = G.quant_rows(self.x, EPS, QMAX) if quantize else (self.q, self.s)
        S.splitk(q, s, w, self.sw, self.out, residual=self.res)

    def variants(self) -> dict[str, Callable[[torch.Tensor], None]]:
        def ours(trigger: int | None, prefetch: bool, pdl: bool) -> Callable[[torch.Tensor], None]:
            def run(w: torch.Tensor) -> None:
                self.quantize(trigger)
                self.gemm(w, prefetch, pdl)

            return run

        return {
            "stream order": ours(None, False, False),
            "library": self.library,
            "PDL": ours(1, False, True),
            "PDL, trigger after the stores": ours(2, False, True),
            "PDL, implicit trigger": ours(0, False, True),
            "PDL + L2 prefetch": ours(1, True, True),
            "prefetch only": ours(None, True, False),
            "GEMM alone": lambda w: self.library(w, quantize=False),
        }


def case_row(name: str, m: int, n: int, k: int, copy_gbs: float) -> dict[str, Any]:
    copies = weight_copies(n * k)
    p = Pair(m, n, k, copies)
    runs = p.variants()
    outs = {}
    for label, fn in runs.items():  # each once, outputs kept for the comparison
        fn(p.ws[0])
        torch.cuda.synchronize()
        outs[label] = p.out.clone()
    ref = outs["stream order"]
    row: dict[str, Any] = {"shape": name, "m": m, "floor_us": n * k / copy_gbs / 1e3}
    for label, fn in runs.items():
        calls = _rotation([lambda w=w, f=fn: f(w) for w in p.ws])
        row[label] = graph_ms(calls) * 1e3
        row[label + " equal"] = bool(torch.equal(outs[label], ref))
    return row


def markdown(rows: list[dict[str, Any]], copy_gbs: float, argv: str) -> str:
    labels = [
        "library",
        "stream order",
        "PDL",
        "PDL, trigger after the stores",
        "PDL, implicit trigger",
        "PDL + L2 prefetch",
        "prefetch only",
        "GEMM alone",
    ]
    head = "| shape | M | weights at the copy rate, us | " + " | ".join(labels) + " |"
    lines = [
        "# PDL for quantize -> int8 GEMM pairs (decode), us per pair in a CUDA graph",
        "",
        *host_header(),
        "",
        f"`{argv}`; copy rate {copy_gbs:.0f} GB/s (read + written). Outputs equal to stream "
        "order's: " + ("all" if all(r[f"{x} equal"] for r in rows for x in labels) else "NOT all"),
        "",
        head,
        "|" + "---|" * (3 + len(labels)),
    ]
    for r in rows:
        cells = [f"{r[x]:.1f}" for x in labels]
        lines.append(
            f"| {r['shape']} | {r['m']} | {r['floor_us']:.1f} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results"))
    ap.add_argument("--rows", type=int, nargs="+", default=[64])
    args = ap.parse_args()
    copy_gbs = copy_rate()
    rows = [case_row(name, m, n, k, copy_gbs) for m in args.rows for name, n, k in SHAPES]
    text = markdown(rows, copy_gbs, "python benchmarks/cuda_pdl.py " + " ".join(sys.argv[1:]))
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cuda_pdl.md").write_text(text)
    (out / "cuda_pdl.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

"""Triton kernels behind ``kernels/cuda/fused.py``: the fusions a Llama decoder layer needs
around its int8 GEMMs.

- ``rmsnorm_quant_kernel``: Llama's RMSNorm (``weight * (x * rsqrt(mean(x^2) + eps))``, with
  its casts back to the activation dtype) and the per-token int8 quantization of its result in
  one pass per row: the normalized row never goes to memory, and one launch replaces two (an
  Inductor reduction and ``quant_rows_kernel``).
- ``grouped_splitk_kernel``: up to three int8 GEMMs that share their activation (Q, K and V of
  an attention block; K and V narrower under GQA) in one launch: each program owns BN output
  columns of one of the weights, chosen by its program id, and streams that weight's K
  (the split-K kernel's one-slice schedule, ``_triton_splitk.py``). No weight is copied or
  concatenated: the three weights stay the tensors they are.

Rounding matches the torch ops: divisions correctly rounded (``quotient``), round-half-even,
casts to the activation dtype where the model casts. ``rsqrt`` is the GPU's approximate one in both
(a quantized code can differ by one step where a value sits on a rounding boundary).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from pdlkit.kernels.cuda._common import INTERPRET
from pdlkit.kernels.cuda._triton_gemm import ROW_BLOCK, quotient, row_warps
from pdlkit.kernels.cuda._triton_splitk import (
    SplitConfig,
    _epilogue,
    pick_grouped_config,
    tile_stages,
)
from pdlkit.runtime_abi.triton_binding import launch

_RNE = tl.constexpr(12582912.0)  # 1.5 * 2**23: (y + c) - c rounds fp32 y to nearest even


@triton.jit
def _normed(x_ptr, w_ptr, row, stride_xm, k0, cols, r, K: tl.constexpr):
    """weight * cast(x * r): one BLOCK of a row, rounded where the model rounds."""
    ok = k0 + cols < K
    x = tl.load(x_ptr + row * stride_xm + k0 + cols, mask=ok, other=0.0)
    h = (x.to(tl.float32) * r).to(x.dtype).to(tl.float32)
    w = tl.load(w_ptr + k0 + cols, mask=ok, other=0.0).to(tl.float32)
    return (w * h).to(x.dtype).to(tl.float32), ok


@triton.jit
def rmsnorm_quant_kernel(
    x_ptr, w_ptr, q_ptr, s_ptr, stride_xm,
    norm_eps: tl.constexpr, q_eps: tl.constexpr, qmax: tl.constexpr,
    K: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """y = weight * rmsnorm(x[m]); s[m] = max(amax |y|, q_eps) / qmax; q[m] = round(y / s[m]).
    The model's constants are constexprs (compiled in, not passed at every launch). A row of
    at most BLOCK values is read once and kept in registers (three passes over it waited on
    three memory latencies); longer rows take three passes of BLOCK-wide steps."""
    norm_eps = tl.cast(norm_eps, tl.float32)
    q_eps = tl.cast(q_eps, tl.float32)
    qmax = tl.cast(qmax, tl.float32)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    if K <= BLOCK:
        ok = cols < K
        xr = tl.load(x_ptr + row * stride_xm + cols, mask=ok, other=0.0)
        x = xr.to(tl.float32)
        r = tl.math.rsqrt(tl.sum(x * x, axis=0) / K + norm_eps)
        w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
        y = (w * (x * r).to(xr.dtype).to(tl.float32)).to(xr.dtype).to(tl.float32)
        s = tl.math.div_rn(tl.maximum(tl.max(tl.abs(y), axis=0), q_eps), qmax)
        tl.store(s_ptr + row, s)
        q = (quotient(y, s) + _RNE) - _RNE
        q = tl.minimum(tl.maximum(q, -qmax), qmax)
        tl.store(q_ptr + row * K + cols, q.to(tl.int8), mask=ok)
    else:
        sq = tl.zeros((BLOCK,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK):
            x = tl.load(x_ptr + row * stride_xm + k0 + cols, mask=k0 + cols < K, other=0.0)
            x = x.to(tl.float32)
            sq += x * x
        r = tl.math.rsqrt(tl.sum(sq, axis=0) / K + norm_eps)
        amax = tl.zeros((BLOCK,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK):
            y, ok = _normed(x_ptr, w_ptr, row, stride_xm, k0, cols, r, K)
            amax = tl.maximum(amax, tl.where(ok, tl.abs(y), 0.0))
        s = tl.math.div_rn(tl.maximum(tl.max(amax, axis=0), q_eps), qmax)
        tl.store(s_ptr + row, s)
        for k0 in range(0, K, BLOCK):
            y, ok = _normed(x_ptr, w_ptr, row, stride_xm, k0, cols, r, K)
            q = (quotient(y, s) + _RNE) - _RNE
            q = tl.minimum(tl.maximum(q, -qmax), qmax)
            tl.store(q_ptr + row * K + k0 + cols, q.to(tl.int8), mask=ok)


def rmsnorm_quant(
    x: torch.Tensor, weight: torch.Tensor, norm_eps: float, q_eps: float, qmax: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(q int8 [M, K], scale float32 [M, 1]) for x [M, K] (unit inner stride), weight [K]."""
    m, k = x.shape
    q = torch.empty((m, k), dtype=torch.int8, device=x.device)
    s = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    block = min(triton.next_power_of_2(k), 16 if INTERPRET else ROW_BLOCK)
    launch(rmsnorm_quant_kernel)[(m,)](
        x, weight, q, s, x.stride(0), float(norm_eps), float(q_eps), float(qmax),
        K=k, BLOCK=block, num_warps=1 if INTERPRET else row_warps(block),
    )  # fmt: skip
    return q, s


@triton.jit
def grouped_splitk_kernel(
    a_ptr, a_scale_ptr,
    b0_ptr, s0_ptr, c0_ptr, N0: tl.constexpr, TILES0: tl.constexpr,
    b1_ptr, s1_ptr, c1_ptr, N1: tl.constexpr, TILES1: tl.constexpr,
    b2_ptr, s2_ptr, c2_ptr, N2: tl.constexpr,
    M, stride_am,
    K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
):  # fmt: skip
    """C_g[M, N_g] = (A[M, K] @ B_g[N_g, K]^T) * sa * s_g for the weight g whose column tiles
    hold program (n, m): tiles [0, TILES0) are weight 0's, then TILES1 of weight 1, then 2's.
    The weights' sizes are constexprs: not passed at every launch."""
    pid_m = tl.program_id(0)  # row tiles side by side: a column tile's weights read once
    pid_n = tl.program_id(1)
    b_ptr = b0_ptr
    s_ptr = s0_ptr
    c_ptr = c0_ptr
    N = pid_n * 0 + N0  # a value of the program (the branches below give other constexprs)
    tile = pid_n
    if pid_n >= TILES0 + TILES1:
        b_ptr = b2_ptr
        s_ptr = s2_ptr
        c_ptr = c2_ptr
        N = pid_n * 0 + N2
        tile = pid_n - TILES0 - TILES1
    elif pid_n >= TILES0:
        b_ptr = b1_ptr
        s_ptr = s1_ptr
        c_ptr = c1_ptr
        N = pid_n * 0 + N1
        tile = pid_n - TILES0
    rm = pid_m * BM + tl.arange(0, BM)
    rn = tile * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    m_ok = (rm < M)[:, None]
    n_ok = (rn < N)[:, None]
    a_ptrs = a_ptr + rm[:, None] * stride_am + rk[None, :]
    b_ptrs = b_ptr + rn[:, None] * K + rk[None, :]
    acc = tl.zeros((BM, BN), dtype=tl.int32)
    for k0 in range(0, K, BK):
        k_ok = (rk + k0 < K)[None, :]
        a = tl.load(a_ptrs, mask=m_ok & k_ok, other=0)
        b = tl.load(b_ptrs, mask=n_ok & k_ok, other=0)
        acc = tl.dot(a, tl.trans(b), acc, out_dtype=tl.int32)
        a_ptrs += BK
        b_ptrs += BK
    _epilogue(
        acc, acc, rm, rn, c_ptr, N, a_scale_ptr, s_ptr, s_ptr, s_ptr, M, N, False, False,
    )  # fmt: skip


def grouped_splitk(
    a: torch.Tensor,
    a_scale: torch.Tensor,
    weights: list[torch.Tensor],
    scales: list[torch.Tensor],
    outs: list[torch.Tensor],
    config: SplitConfig | None = None,
) -> list[torch.Tensor]:
    """outs[g] = (a @ weights[g].T) * a_scale[:, None] * scales[g] for two or three weights
    [N_g, K] (contiguous int8), one launch; a [M, K] int8 with a unit inner stride.
    ``config``'s split_k is not used (one K slice a program)."""
    m, k = a.shape
    groups = len(weights)
    cfg = config or pick_grouped_config(m, [w.shape[0] for w in weights], k)
    tiles = [triton.cdiv(w.shape[0], cfg.bn) for w in weights]
    while len(weights) < 3:  # an unused third group: no tiles
        weights, scales, outs, tiles = [*weights, weights[0]], [*scales, scales[0]], [*outs, outs[0]], [*tiles, 0]  # fmt: skip
    grid = (triton.cdiv(m, cfg.bm), sum(tiles))
    stages = tile_stages(cfg, 1, False, "grouped_splitk_kernel")
    launch(grouped_splitk_kernel)[grid](
        a, a_scale,
        weights[0], scales[0], outs[0], weights[0].shape[0], tiles[0],
        weights[1], scales[1], outs[1], weights[1].shape[0], tiles[1],
        weights[2], scales[2], outs[2], weights[2].shape[0],
        m, a.stride(0),
        K=k, BM=cfg.bm, BN=cfg.bn, BK=cfg.bk, num_warps=cfg.warps, num_stages=stages,
    )  # fmt: skip
    return outs[:groups]

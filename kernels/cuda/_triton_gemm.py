"""Triton kernels behind ``kernels/cuda/gemm.py``: one GEMM with a fused epilogue, a gated
(SwiGLU) pair of GEMMs, and per-token int8 quantization.

Imported on first use only, so a machine without Triton still loads the declarations.
Loop bounds over K are ``tl.constexpr``: the interpreter (``TRITON_INTERPRET=1``, how CI
runs these on the CPU) cannot take a run-time trip count with NumPy 2.4, and a weight's K
is fixed anyway. Rounding is round-half-even through the 1.5 * 2**23 trick and divisions
are correctly rounded (``div_rn``, or ``quotient``'s equal result), so quantized outputs
equal PyTorch's bit for bit.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from pdlkit.kernels.cuda._common import INTERPRET, fit_stages
from pdlkit.runtime_abi.triton_binding import launch, size_hint

# activation name (the act= of gemm()) -> the kernels' ACT code
ACTS = {"none": 0, "relu": 1, "gelu": 2, "gelu_tanh": 3, "silu": 4}
_RNE = tl.constexpr(12582912.0)  # 1.5 * 2**23: (y + c) - c rounds fp32 y to nearest even
_INTERPRETED = tl.constexpr(INTERPRET)


@triton.jit
def quotient(x, s):
    """x / s correctly rounded (``div_rn``'s result) for a row of x over one scale s > 0:
    Markstein's correction of x * RN(1 / s), one exact division per row and three operations
    per value where ``div_rn`` takes a few dozen (a 64 x 14336 row block's quantization spent
    most of its time dividing). The interpreter's fma rounds twice: it divides."""
    if _INTERPRETED:
        return tl.math.div_rn(x, s)
    r = tl.math.div_rn(1.0, s)
    q = x * r
    return tl.fma(tl.fma(-q, s, x), r, q)


@dataclass(frozen=True)
class Config:
    bm: int
    bn: int
    bk: int
    warps: int
    stages: int
    group_m: int = 8


@functools.cache
def _sms() -> int:
    if not torch.cuda.is_available():  # traced on a host without a GPU: plan for an H100
        return 132
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


def pick_config(m: int, n: int, k: int, is_int: bool, gated: bool = False) -> Config:
    """Tile shapes measured on an H100 (benchmarks/cuda_gemm.py); tiny ones for the interpreter.

    128 x 256 tiles run fastest (1,050-1,130 TOP/s int8) once there are enough of them to
    fill every SM; smaller problems take smaller tiles so that no SM idles. A symbolic M
    (dynamic shapes) chooses by its hint, adding no guard (triton_binding.size_hint).
    """
    if INTERPRET:
        return Config(16, 16, 32, 1, 1, 2)
    m = size_hint(m)
    bk = 128 if is_int else 64
    if gated:  # two accumulators per tile: the pair is a 128 x 256 tile in all but name
        return Config(128, 128, bk, 8, 3)
    tiles = triton.cdiv(m, 128) * triton.cdiv(n, 256)
    if tiles >= _sms():
        return Config(128, 256, bk, 8, 4)
    if triton.cdiv(m, 128) * triton.cdiv(n, 128) >= _sms() // 2:
        return Config(128, 128, bk, 8, 4)
    return Config(64, 128, bk, 4, 4)


def tile_stages(cfg: Config, a_size: int, b_size: int, kernel: str) -> int:
    """``cfg``'s pipeline stages cut to this GPU's shared memory (``fit_stages``): a K step
    holds BM x BK activations of ``a_size`` bytes and BN x BK weights of ``b_size`` bytes a
    column and K position."""
    return fit_stages(cfg.stages, cfg.bk * (cfg.bm * a_size + cfg.bn * b_size), kernel)


@triton.jit
def _act(y, ACT: tl.constexpr):
    if ACT == 1:
        y = tl.maximum(y, 0.0)
    elif ACT == 2:
        y = 0.5 * y * (1.0 + tl.math.erf(y * 0.7071067811865476))
    elif ACT == 3:
        inner = 0.7978845608028654 * (y + 0.044715 * y * y * y)
        y = 0.5 * y * (1.0 + (2.0 * tl.sigmoid(2.0 * inner) - 1.0))
    elif ACT == 4:
        y = y * tl.sigmoid(y)
    return y


@triton.jit
def _tile(pid, M, N, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr):
    """This program's rows and columns of C; grouped tile order: GROUP_M row tiles share each
    column tile while it is in L2."""
    grid_m = tl.cdiv(M, BM)
    grid_n = tl.cdiv(N, BN)
    width = GROUP_M * grid_n
    group = pid // width
    first_m = group * GROUP_M
    size_m = tl.minimum(grid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % size_m
    pid_n = (pid % width) // size_m
    return pid_m * BM + tl.arange(0, BM), pid_n * BN + tl.arange(0, BN)


@triton.jit
def gemm_kernel(
    a_ptr, b_ptr, c_ptr, a_scale_ptr, b_scale_ptr, bias_ptr, wsum_ptr, res_ptr,
    M, N, stride_am, stride_bn, stride_cm,
    a_zp, a_scale_val, out_inv_scale, out_zp, qmin, qmax,
    K: tl.constexpr,
    IS_INT: tl.constexpr, UPCAST: tl.constexpr, A_U8: tl.constexpr, A_SCALE: tl.constexpr, B_SCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_WSUM: tl.constexpr, ACT: tl.constexpr, REQUANT: tl.constexpr,
    HAS_RES: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """C[M, N] = epilogue(A[M, K] @ B[N, K]^T).

    int8: acc int32; ``A_U8`` reads uint8 activations as (a - 128) in int8 and ``wsum``
    (column sums of B) carries the zero-point correction ``- a_zp * wsum``, where the caller
    passes ``a_zp - 128`` for uint8. Scales:
    A_SCALE 0 none, 1 scalar ``a_scale_val``, 2 one per row; B_SCALE per column. Then bias,
    activation, and the output cast, or requantization (REQUANT) to [qmin, qmax]; then
    a residual laid out as C (HAS_RES) added to the cast result, in fp32, rounded once.
    """
    # float arguments arrive as fp64 from Inductor's launcher (fp32 from Triton's): the
    # epilogue's arithmetic, and its rounding trick, are fp32
    a_scale_val = tl.cast(a_scale_val, tl.float32)
    out_inv_scale = tl.cast(out_inv_scale, tl.float32)
    out_zp = tl.cast(out_zp, tl.float32)
    qmin = tl.cast(qmin, tl.float32)
    qmax = tl.cast(qmax, tl.float32)
    rm, rn = _tile(tl.program_id(0), M, N, BM, BN, GROUP_M)
    rk = tl.arange(0, BK)
    a_ptrs = a_ptr + rm[:, None] * stride_am + rk[None, :]
    b_ptrs = b_ptr + rn[:, None] * stride_bn + rk[None, :]
    m_ok = rm[:, None] < M
    n_ok = rn[:, None] < N
    if IS_INT:
        acc = tl.zeros((BM, BN), dtype=tl.int32)
    else:
        acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        k_ok = (k0 + rk)[None, :] < K
        if A_U8:
            a = tl.load(a_ptrs, mask=m_ok & k_ok, other=128)
            a = (a ^ 0x80).to(tl.int8, bitcast=True)
        else:
            a = tl.load(a_ptrs, mask=m_ok & k_ok, other=0)
        b = tl.load(b_ptrs, mask=n_ok & k_ok, other=0)
        if UPCAST:  # the interpreter's bf16 dot is wrong (NumPy has no bf16); fp32 is exact
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        if IS_INT:
            acc = tl.dot(a, tl.trans(b), acc, out_dtype=tl.int32)
        else:
            acc = tl.dot(a, tl.trans(b), acc)
        a_ptrs += BK
        b_ptrs += BK
    cm = rm < M
    cn = rn < N
    if HAS_WSUM:
        wsum = tl.load(wsum_ptr + rn, mask=cn, other=0)
        acc = acc - a_zp * wsum[None, :]
    y = acc.to(tl.float32)
    if A_SCALE == 1:
        y = y * a_scale_val
    elif A_SCALE == 2:
        y = y * tl.load(a_scale_ptr + rm, mask=cm, other=0.0)[:, None]
    if B_SCALE:
        y = y * tl.load(b_scale_ptr + rn, mask=cn, other=0.0)[None, :]
    if HAS_BIAS:
        y = y + tl.load(bias_ptr + rn, mask=cn, other=0.0).to(tl.float32)[None, :]
    y = _act(y, ACT)
    c_ptrs = c_ptr + rm[:, None] * stride_cm + rn[None, :]
    if REQUANT:
        q = (y * out_inv_scale + _RNE) - _RNE + out_zp
        q = tl.minimum(tl.maximum(q, qmin), qmax)
        tl.store(c_ptrs, q.to(c_ptr.dtype.element_ty), mask=cm[:, None] & cn[None, :])
    elif HAS_RES:
        ok = cm[:, None] & cn[None, :]
        res = tl.load(res_ptr + rm[:, None] * stride_cm + rn[None, :], mask=ok, other=0.0)
        y = y.to(c_ptr.dtype.element_ty).to(tl.float32) + res.to(tl.float32)
        tl.store(c_ptrs, y.to(c_ptr.dtype.element_ty), mask=ok)
    else:
        tl.store(c_ptrs, y.to(c_ptr.dtype.element_ty), mask=cm[:, None] & cn[None, :])


@triton.jit
def gated_kernel(
    a_ptr, g_ptr, u_ptr, c_ptr, a_scale_ptr, g_scale_ptr, u_scale_ptr,
    M, N, stride_am, stride_bn, stride_cm,
    K: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """C = silu(A @ G^T * sa * sg) * (A @ U^T * sa * su): the gate and up GEMMs of a
    SwiGLU MLP share every A tile, and the product never leaves registers."""
    rm, rn = _tile(tl.program_id(0), M, N, BM, BN, GROUP_M)
    rk = tl.arange(0, BK)
    a_ptrs = a_ptr + rm[:, None] * stride_am + rk[None, :]
    g_ptrs = g_ptr + rn[:, None] * stride_bn + rk[None, :]
    u_ptrs = u_ptr + rn[:, None] * stride_bn + rk[None, :]
    m_ok = rm[:, None] < M
    n_ok = rn[:, None] < N
    acc_g = tl.zeros((BM, BN), dtype=tl.int32)
    acc_u = tl.zeros((BM, BN), dtype=tl.int32)
    for k0 in range(0, K, BK):
        k_ok = (k0 + rk)[None, :] < K
        a = tl.load(a_ptrs, mask=m_ok & k_ok, other=0)
        g = tl.load(g_ptrs, mask=n_ok & k_ok, other=0)
        u = tl.load(u_ptrs, mask=n_ok & k_ok, other=0)
        acc_g = tl.dot(a, tl.trans(g), acc_g, out_dtype=tl.int32)
        acc_u = tl.dot(a, tl.trans(u), acc_u, out_dtype=tl.int32)
        a_ptrs += BK
        g_ptrs += BK
        u_ptrs += BK
    cm = rm < M
    cn = rn < N
    sa = tl.load(a_scale_ptr + rm, mask=cm, other=0.0)[:, None]
    gate = acc_g.to(tl.float32) * sa * tl.load(g_scale_ptr + rn, mask=cn, other=0.0)[None, :]
    up = acc_u.to(tl.float32) * sa * tl.load(u_scale_ptr + rn, mask=cn, other=0.0)[None, :]
    h = gate * tl.sigmoid(gate) * up
    c_ptrs = c_ptr + rm[:, None] * stride_cm + rn[None, :]
    tl.store(c_ptrs, h.to(c_ptr.dtype.element_ty), mask=cm[:, None] & cn[None, :])


@triton.jit
def quant_rows_kernel(
    x_ptr, q_ptr, s_ptr, stride_xm, eps: tl.constexpr, qmax: tl.constexpr,
    K: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """q[m] = clamp(round(x[m] / s[m]), -qmax, qmax), s[m] = max(amax |x[m]|, eps) / qmax;
    eps and qmax, the model's constants, are constexprs (not passed at every launch).
    A row of at most BLOCK values is read once and kept in registers (one memory latency
    where two passes over it waited on two, or eight at K = 14336 in 4096-wide steps)."""
    eps = tl.cast(eps, tl.float32)
    qmax = tl.cast(qmax, tl.float32)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    if K <= BLOCK:
        ok = cols < K
        x = tl.load(x_ptr + row * stride_xm + cols, mask=ok, other=0.0).to(tl.float32)
        s = tl.math.div_rn(tl.maximum(tl.max(tl.abs(x), axis=0), eps), qmax)
        tl.store(s_ptr + row, s)
        y = (quotient(x, s) + _RNE) - _RNE
        q = tl.minimum(tl.maximum(y, -qmax), qmax)
        tl.store(q_ptr + row * K + cols, q.to(tl.int8), mask=ok)
    else:
        amax = tl.zeros((BLOCK,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK):
            x = tl.load(x_ptr + row * stride_xm + k0 + cols, mask=k0 + cols < K, other=0.0)
            amax = tl.maximum(amax, tl.abs(x.to(tl.float32)))
        s = tl.math.div_rn(tl.maximum(tl.max(amax, axis=0), eps), qmax)
        tl.store(s_ptr + row, s)
        for k0 in range(0, K, BLOCK):
            ok = k0 + cols < K
            x = tl.load(x_ptr + row * stride_xm + k0 + cols, mask=ok, other=0.0).to(tl.float32)
            y = (quotient(x, s) + _RNE) - _RNE
            q = tl.minimum(tl.maximum(y, -qmax), qmax)
            tl.store(q_ptr + row * K + k0 + cols, q.to(tl.int8), mask=ok)


def gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    *,
    a_scale: torch.Tensor | float | None = None,
    b_scale: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    wsum: torch.Tensor | None = None,
    a_zp: int = 0,
    act: str = "none",
    requant: tuple[float, int, int, int] | None = None,
    residual: torch.Tensor | None = None,
    config: Config | None = None,
) -> torch.Tensor:
    """out = epilogue(a @ b.T) for 2-D a [M, K] and b [N, K] with unit inner strides
    (``residual``, laid out as ``out``, added last)."""
    m, k = a.shape
    n = b.shape[0]
    is_int = a.dtype in (torch.int8, torch.uint8)
    cfg = config or pick_config(m, n, k, is_int)
    if isinstance(a_scale, torch.Tensor):
        a_scale_mode, a_scale_t, a_scale_v = 2, a_scale, 1.0
    elif a_scale is None:
        a_scale_mode, a_scale_t, a_scale_v = 0, a, 1.0
    else:
        a_scale_mode, a_scale_t, a_scale_v = 1, a, float(a_scale)
    os_, ozp, qmin, qmax = requant or (1.0, 0, 0, 0)
    grid = (triton.cdiv(m, cfg.bm) * triton.cdiv(n, cfg.bn),)
    stages = tile_stages(cfg, a.element_size(), b.element_size(), "gemm_kernel")
    launch(gemm_kernel)[grid](
        a, b, out, a_scale_t, b_scale if b_scale is not None else a,  # a: a pointer not read
        bias if bias is not None else a, wsum if wsum is not None else a,
        residual if residual is not None else out,
        m, n, a.stride(0), b.stride(0), out.stride(0),
        int(a_zp) - (128 if a.dtype == torch.uint8 else 0), a_scale_v,
        1.0 / os_, float(ozp), float(qmin), float(qmax),
        K=k, IS_INT=is_int, UPCAST=INTERPRET and not is_int, A_U8=a.dtype == torch.uint8, A_SCALE=a_scale_mode,
        B_SCALE=b_scale is not None, HAS_BIAS=bias is not None, HAS_WSUM=wsum is not None,
        ACT=ACTS[act], REQUANT=requant is not None, HAS_RES=residual is not None,
        BM=cfg.bm, BN=cfg.bn, BK=cfg.bk, GROUP_M=cfg.group_m,
        num_warps=cfg.warps, num_stages=stages,
    )  # fmt: skip
    return out


def gated(
    a: torch.Tensor,
    a_scale: torch.Tensor,
    g: torch.Tensor,
    g_scale: torch.Tensor,
    u: torch.Tensor,
    u_scale: torch.Tensor,
    out: torch.Tensor,
    config: Config | None = None,
) -> torch.Tensor:
    m, k = a.shape
    n = g.shape[0]
    cfg = config or pick_config(m, n, k, True, gated=True)
    grid = (triton.cdiv(m, cfg.bm) * triton.cdiv(n, cfg.bn),)
    stages = tile_stages(cfg, 1, 2, "gated_kernel")  # two int8 weights a column
    launch(gated_kernel)[grid](
        a, g, u, out, a_scale, g_scale, u_scale,
        m, n, a.stride(0), g.stride(0), out.stride(0),
        K=k, BM=cfg.bm, BN=cfg.bn, BK=cfg.bk, GROUP_M=cfg.group_m,
        num_warps=cfg.warps, num_stages=stages,
    )  # fmt: skip
    return out


# rows up to this long are quantized from registers (Llama-3's 14336-wide MLP rows too)
ROW_BLOCK = 16384


def row_warps(block: int) -> int:
    """Warps for a program that holds ``block`` values of a row: 8 for 4096 (16 values a
    thread), 16 from 8192 up (32 values a thread at 16384)."""
    return max(4, min(16, block // 512))


def quant_rows(x: torch.Tensor, eps: float, qmax: float) -> tuple[torch.Tensor, torch.Tensor]:
    m, k = x.shape
    q = torch.empty((m, k), dtype=torch.int8, device=x.device)
    s = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    block = min(triton.next_power_of_2(k), 16 if INTERPRET else ROW_BLOCK)
    launch(quant_rows_kernel)[(m,)](
        x, q, s, x.stride(0), float(eps), float(qmax), K=k, BLOCK=block,
        num_warps=1 if INTERPRET else row_warps(block),
    )  # fmt: skip
    return q, s

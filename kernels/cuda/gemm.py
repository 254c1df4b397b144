"""int8 and BF16 GEMMs with fused epilogues for NVIDIA GPUs, written in Triton.

Logical ops (patterns in ``patterns/cuda/``, reference semantics in
``kernels/ops/logical_ops.py``):

- ``quantize_per_token(x, eps, qmax) -> (q, scale)``: symmetric int8 per row.
- ``int8_linear(q, x_scale, w, w_scale, bias, dtype)``: (q @ w.T) * x_scale * w_scale + bias.
- ``int8_gated_silu(q, x_scale, wg, sg, wu, su, dtype, shape)``: silu(gate) * up of a
  SwiGLU MLP, both GEMMs in one kernel sharing the activation tiles.
- ``qlinear`` / ``qlinear_q`` / ``qlinear_dynamic`` for PT2E graphs (patterns/x86/, same ops).

BF16 linears are left to Inductor (cuBLAS): the Triton BF16 GEMM in
``kernels/_optin/cuda_bf16_linear.py`` measured 0.78-0.88x of cuBLAS on an H100.

Up to 64 rows (decode) the int8 GEMMs stream their weights with the split-K kernel of
``_triton_splitk.py``; its declarations (``*_splitk``, up to 256 rows) are also candidates of
their own for measured choice. ``torch._int_mm`` (cuBLASLt) is declared as a lower-priority
``int8_linear``.

The per-token quantization and int8 GEMMs are declared ``@launched_by_inductor``
(``runtime_abi/triton_binding.py``): a compiled graph traces their bodies, and Inductor's own
code launches the Triton kernels (no pdlkit runner, no Triton Python launcher per call).
They decline only by shape, at compile time. The PT2E kernels read zero points on the host
and stay opaque ops.

Triton launches on PyTorch's current CUDA stream, so these kernels follow the caller's
stream. Under ``TRITON_INTERPRET=1`` (set before anything imports Triton) they are declared
for the CPU instead and run in Triton's interpreter: how CI tests them without a GPU (slow;
never for production).
"""

from __future__ import annotations

import weakref
from typing import Any, cast

import torch
from pdlkit.kernels.cuda._common import (
    _CAPTURED,
    _ON,
    _decode_rows,
    _dtype,
    _splitk,
    _triton,
    one_per_row,
)
from pdlkit.runtime_abi.dtypes import quantized_dtype
from pdlkit.runtime_abi.prepack import version_of
from pdlkit.runtime_abi.triton_binding import launched_by_inductor, size_hint
from torch import Tensor

import pdlkit

# the modules whose @triton.jit kernels the declarations below launch (launched_by_inductor)
_GEMM = "pdlkit.kernels.cuda._triton_gemm"
_SPLITK = "pdlkit.kernels.cuda._triton_splitk"


def _rows(s: Tensor, m: int) -> Tensor:
    """Activation scales as one float32 per row: [M, 1], [M] (_common's one_per_row) or a
    single value, repeated for every row."""
    if s.numel() == 1 and m != 1:
        return s.reshape(1).to(torch.float32).expand(m).contiguous()
    return one_per_row(s, m)


# -- per-token quantization ---------------------------------------------------------------------


@pdlkit.kernel(
    implements="quantize_per_token",
    dtypes={"x": [torch.float32, torch.bfloat16, torch.float16]},
    shapes={"x": {"rank": 2}},
    **_CAPTURED,
)
@launched_by_inductor(_GEMM)
def quantize_per_token_triton(x: Tensor, eps: float, qmax: float) -> tuple[Tensor, Tensor]:
    """One pass per row: amax, scale, round-half-even, clamp; equal to the torch ops bit for bit."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    return _triton().quant_rows(x, eps, qmax)


# -- int8 GEMM + rescale epilogue ---------------------------------------------------------------


_INT8_LINEAR: dict[str, Any] = {
    "implements": "int8_linear",
    "dtypes": {"q": [torch.int8], "w": [torch.int8]},
    "shapes": {"q": {"rank": 2}, "w": {"rank": 2, "contiguous": True}},
}
_GATED_SILU: dict[str, Any] = {
    "implements": "int8_gated_silu",
    "dtypes": {"q": [torch.int8], "wg": [torch.int8], "wu": [torch.int8]},
    "shapes": {"q": {"rank": 2}, "wg": {"rank": 2, "contiguous": True}, "wu": {"rank": 2}},
}


@pdlkit.kernel(
    **_INT8_LINEAR,
    priority=1,
    **_CAPTURED,
)
@launched_by_inductor(_GEMM, _SPLITK)
def int8_linear_triton(
    q: Tensor, x_scale: Tensor, w: Tensor, w_scale: Tensor, bias: Tensor | None, dtype: int
) -> Tensor:
    """int8 x int8 -> int32 on the tensor cores, rescaled, biased and cast in registers;
    up to 64 rows the weight-streaming split-K kernel (faster at every Llama shape measured,
    1 and 64 rows on an H100: benchmarks/results/cuda_decode.md), tiles above."""
    m = q.shape[0]
    if size_hint(m) <= _STREAM_ROWS:  # a symbolic M by its hint: no guard on it
        return int8_linear_splitk.fn(q, x_scale, w, w_scale, bias, dtype)
    out = torch.empty((m, w.shape[0]), dtype=_dtype(dtype), device=q.device)
    return _triton().gemm(
        q if q.stride(-1) == 1 else q.contiguous(),
        w,
        out,
        a_scale=_rows(x_scale, m),
        b_scale=w_scale.to(torch.float32).contiguous(),
        bias=bias,
    )


@pdlkit.kernel(
    **_INT8_LINEAR,
    priority=0,
    traits=["deterministic"],
    device="cuda",
)
def int8_linear_cublas(
    q: Tensor, x_scale: Tensor, w: Tensor, w_scale: Tensor, bias: Tensor | None, dtype: int
) -> Tensor:
    """``torch._int_mm`` (cuBLASLt) and the rescale as separate torch ops: the peer to beat."""
    if size_hint(q.shape[0]) <= 16 or q.shape[1] % 8 or w.shape[0] % 8:
        raise pdlkit.KernelUnsupported("cuBLASLt int8 needs M > 16 and K, N multiples of 8")
    y = torch._int_mm(q, w.t()).to(torch.float32) * x_scale * w_scale
    if bias is not None:
        y = y + bias
    return y.to(_dtype(dtype))


# -- SwiGLU gate/up pair ------------------------------------------------------------------------


def _gated_out(q: Tensor, wg: Tensor, wu: Tensor, m: int, dtype: int) -> Tensor:
    """The [m, N] output of an int8_gated_silu; declines gate and up weights that differ."""
    if wu.shape != wg.shape or not wu.is_contiguous():
        raise pdlkit.KernelUnsupported("gate and up weights differ in shape or layout")
    return torch.empty((m, wg.shape[0]), dtype=_dtype(dtype), device=q.device)


@pdlkit.kernel(
    **_GATED_SILU,
    priority=1,
    **_CAPTURED,
)
@launched_by_inductor(_GEMM, _SPLITK)
def int8_gated_silu_triton(
    q: Tensor,
    x_scale: Tensor,
    wg: Tensor,
    sg: Tensor,
    wu: Tensor,
    su: Tensor,
    dtype: int,
    shape: list[int] | None,
) -> Tensor:
    """silu(q @ wg.T * x_scale * sg) * (q @ wu.T * x_scale * su), one pass over q; up to 64
    rows the split-K kernel streams both weights (as in int8_linear_triton)."""
    m = q.shape[0]
    if size_hint(m) <= _STREAM_ROWS:  # a symbolic M by its hint: no guard on it
        return int8_gated_silu_splitk.fn(q, x_scale, wg, sg, wu, su, dtype, shape)
    out = _gated_out(q, wg, wu, m, dtype)
    _triton().gated(
        q if q.stride(-1) == 1 else q.contiguous(),
        _rows(x_scale, m),
        wg,
        sg.to(torch.float32).contiguous(),
        wu,
        su.to(torch.float32).contiguous(),
        out,
    )
    return out.reshape(shape) if shape is not None else out


# -- decode-shaped GEMMs (M <= 256): weights streamed once, K split over programs --------------
# The tiled kernels above call these up to 64 rows (a fixed policy: measured faster there);
# declared on their own (priority 0) too, so that measured choice (autotune) can take them
# up to 256 rows where they win.

_STREAM_ROWS = 64  # and the tiled ones hand up to this many to them


@pdlkit.kernel(
    **_INT8_LINEAR,
    priority=0,
    **_CAPTURED,
)
@launched_by_inductor(_SPLITK)
def int8_linear_splitk(
    q: Tensor, x_scale: Tensor, w: Tensor, w_scale: Tensor, bias: Tensor | None, dtype: int
) -> Tensor:
    """int8_linear for up to 256 rows: BN-column programs over K slices stream the weight once
    (kernels/cuda/_triton_splitk.py); deterministic (int32 partial sums)."""
    m = _decode_rows(q)
    out = torch.empty((m, w.shape[0]), dtype=_dtype(dtype), device=q.device)
    return _splitk().splitk(
        q if q.stride(-1) == 1 else q.contiguous(),
        _rows(x_scale, m),
        w,
        w_scale.to(torch.float32).contiguous(),
        out,
        bias=bias,
    )


@pdlkit.kernel(
    **_GATED_SILU,
    priority=0,
    **_CAPTURED,
)
@launched_by_inductor(_SPLITK)
def int8_gated_silu_splitk(
    q: Tensor,
    x_scale: Tensor,
    wg: Tensor,
    sg: Tensor,
    wu: Tensor,
    su: Tensor,
    dtype: int,
    shape: list[int] | None,
) -> Tensor:
    """int8_gated_silu for up to 256 rows: the gate and up weights streamed side by side."""
    m = _decode_rows(q)
    out = _gated_out(q, wg, wu, m, dtype)
    _splitk().splitk(
        q if q.stride(-1) == 1 else q.contiguous(),
        _rows(x_scale, m),
        wg,
        sg.to(torch.float32).contiguous(),
        out,
        u=wu,
        u_scale=su.to(torch.float32).contiguous(),
    )
    return out.reshape(shape) if shape is not None else out


# -- PT2E int8 (quantized_decomposed dq -> linear [-> act] [-> q]), patterns in patterns/x86/ --
# uint8 activations enter the int8 tensor cores as (x - 128); the zero point moves into the
# epilogue as -(x_zp - 128) * colsum(w), with the column sums packed beside the weight.


def _pack_pt2e(w_q: Tensor, attrs: Any) -> tuple[Tensor, Tensor]:
    return w_q.contiguous(), w_q.to(torch.int32).sum(dim=1, dtype=torch.int32)


# id(weight zero points) -> (their version, all zero): an in-place write checks them again
_ZP_ZERO: dict[int, tuple[int, bool]] = {}
_POST = {("none", ""): "none", ("relu", ""): "relu", ("gelu", "none"): "gelu"}
_POST[("gelu", "tanh")] = "gelu_tanh"


def _zero_points_zero(w_zp: Tensor) -> bool:
    """Whether the weight zero points are all zero: read off the GPU once per tensor and
    version (a compiled graph passes the same constant every call)."""
    hit = _ZP_ZERO.get(id(w_zp))
    if hit is not None and hit[0] == version_of(w_zp):
        return hit[1]
    if hit is None:
        weakref.finalize(w_zp, _ZP_ZERO.pop, id(w_zp), None)
    zero = not bool(w_zp.any())
    _ZP_ZERO[id(w_zp)] = (version_of(w_zp), zero)
    return zero


def _pt2e(
    x_q: Tensor,
    x_scale: float,
    x_zp: int,
    w_q: Any,
    w_scale: Tensor,
    w_zp: Tensor,
    bias: Tensor | None,
    post_op: str,
    algorithm: str,
    requant: tuple[float, int, int, int] | None = None,
) -> Tensor:
    """One Triton GEMM for a PT2E int8 linear; ``w_q`` is the packed (weight, column sums).
    The output is float32, or uint8 / int8 when ``requant`` = (scale, zp, qmin, qmax)."""
    post = _POST.get((post_op, algorithm))
    if post is None:
        raise pdlkit.KernelUnsupported(f"post op {(post_op, algorithm)}")
    if not _zero_points_zero(w_zp):
        raise pdlkit.KernelUnsupported("asymmetric int8 weights (a non-zero weight zero point)")
    w, wsum = cast(tuple[Tensor, Tensor], w_q)
    dtype = torch.float32 if requant is None else quantized_dtype(requant[2])
    out = torch.empty((*x_q.shape[:-1], w.shape[0]), dtype=dtype, device=x_q.device)
    x2 = x_q.reshape(-1, x_q.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    _triton().gemm(
        x2,
        w,
        out.view(-1, w.shape[0]),
        a_scale=float(x_scale),
        b_scale=w_scale.to(torch.float32).contiguous(),
        bias=bias,
        wsum=wsum,
        a_zp=int(x_zp),
        act=post,
        requant=requant,
    )
    return out


# Not declared graph-capture safe: the first call per weight reads its zero points on the
# host, and no capture test covers these yet (tests/test_cuda.py does for the others).
_PT2E_KW: dict[str, Any] = {
    "dtypes": {"x_q": [torch.uint8, torch.int8], "w_q": [torch.int8]},
    "shapes": {"w_q": {"rank": 2}},
    "prepack": _pack_pt2e,
    "prepack_arg": "w_q",
    "priority": -1,  # on the CPU (interpreter only) oneDNN's kernels come first
    **_ON,
}


@pdlkit.kernel(implements="qlinear", traits=["deterministic"], **_PT2E_KW)
def qlinear_triton(x_q, x_scale, x_zp, w_q, w_scale, w_zp, bias, post_op, algorithm) -> Tensor:
    """act(dequantize(x_q) @ dequantize(w_q).T + bias) in float32, one Triton GEMM."""
    return _pt2e(x_q, x_scale, x_zp, w_q, w_scale, w_zp, bias, post_op, algorithm)


@pdlkit.kernel(implements="qlinear_q", traits=["deterministic"], **_PT2E_KW)
def qlinear_q_triton(
    x_q, x_scale, x_zp, w_q, w_scale, w_zp, bias, out_scale, out_zp, out_qmin, out_qmax,
    post_op, algorithm,
) -> Tensor:  # fmt: skip
    """quantize(act(dequantize(x_q) @ dequantize(w_q).T + bias)), requantized in registers."""
    req = (float(out_scale), int(out_zp), int(out_qmin), int(out_qmax))
    return _pt2e(x_q, x_scale, x_zp, w_q, w_scale, w_zp, bias, post_op, algorithm, req)


@pdlkit.kernel(implements="qlinear_dynamic", traits=["deterministic"], **_PT2E_KW)
def qlinear_dynamic_triton(
    x_q, x_scale, x_zp, w_q, w_scale, w_zp, bias, post_op, algorithm
) -> Tensor:
    """Dynamic PT2E: the activation's scale and zero point are one-element tensors (read once
    on the host, so this kernel is not graph-capture safe)."""
    scale, zp = float(x_scale.reshape(-1)[0]), int(x_zp.reshape(-1)[0])
    return _pt2e(x_q, scale, zp, w_q, w_scale, w_zp, bias, post_op, algorithm)

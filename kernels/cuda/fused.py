"""The fusions an int8 Llama decoder layer needs around its GEMMs, for NVIDIA GPUs (Triton).

Logical ops (patterns in ``patterns/cuda/llama.pdl.mlir``; each kernel's ``reference`` below
is the op's semantics in torch ops, the graph the pattern replaces):

- ``rmsnorm_quantize_per_token(x, weight, eps, dtype, q_eps, qmax) -> (q, scale)``: Llama's
  RMSNorm then the per-token int8 quantization that feeds the next GEMM, one kernel.
- ``int8_linear_residual(q, x_scale, w, w_scale, residual, dtype, shape)``:
  ``residual + reshape(int8_linear(...), shape)``, the residual added in the GEMM's epilogue
  (the o- and down-projections).
- ``quant_int8_linear_residual(x, eps, qmax, w, w_scale, residual, dtype, shape)``: the
  per-token quantization of ``x`` then ``int8_linear_residual``; for one row one launch (the
  GEMM quantizes the row itself), the two kernels above for more. Its pattern is
  ``patterns/cuda/quant_residual.pdl.mlir``, disabled in ``int8.yaml`` (enable it there).
- ``int8_linear3(q, x_scale, w0, s0, w1, s1, w2, s2, dtype) -> (y0, y1, y2)``: three int8
  GEMMs over one quantized activation (Q, K and V; K and V narrower under GQA) in one launch up
  to 256 rows (``grouped_splitk_kernel``), the tiled GEMM per weight above.

All are declared ``@launched_by_inductor``: a compiled graph traces their bodies and
Inductor's code launches the Triton kernels. They decline by shape and dtype only.
Under ``TRITON_INTERPRET=1`` they are declared for the CPU and run in Triton's interpreter.
"""

from __future__ import annotations

from typing import Any

import torch
from pdlkit.kernels.cuda._common import _CAPTURED, INTERPRET, _dtype, _triton, one_per_row
from pdlkit.quantization.int8_dynamic import quantize_per_token
from pdlkit.runtime_abi.triton_binding import launched_by_inductor, size_hint
from torch import Tensor

import pdlkit

_FUSED = "pdlkit.kernels.cuda._triton_fused"
_GEMM = "pdlkit.kernels.cuda._triton_gemm"
_SPLITK = "pdlkit.kernels.cuda._triton_splitk"
# Up to this many rows the weight-streaming kernels of _triton_splitk.py (one weight, and Q, K, V
# grouped in one launch), the tiled GEMM above. 256, not gemm.py's 64: measured on an H100 at
# 256 rows, the split-K sweep (benchmarks/results/cuda_decode.md) against torch.profiler's kernel
# times in the GQA model's decode step (2026-11-25): Q, K, V grouped 21.3 us against 45.5 us as
# three tiled launches (and two launches fewer a layer), the o- and down-projections 13.8 and
# 38.1 us against 16.2 and 48.9. The gated pair stays tiled at 256 rows (95 against 71.6 us).
_STREAM_ROWS = 256
# the interpreter rounds bfloat16 casts its own way (NumPy has no bfloat16): not declared there
_FLOATS = [torch.float32, torch.float16] + ([] if INTERPRET else [torch.bfloat16])


def _fused() -> Any:
    _triton()  # the same message when Triton is missing
    from pdlkit.kernels.cuda import _triton_fused

    return _triton_fused


def _splitk() -> Any:
    _triton()
    from pdlkit.kernels.cuda import _triton_splitk

    return _triton_splitk


def _some_rows(m: int) -> None:
    """An empty activation is left to the replaced ops (no launch of an empty grid)."""
    if m == 0:
        raise pdlkit.KernelUnsupported("no rows (M = 0)")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


_CODES = {torch.float32: 6, torch.bfloat16: 15, torch.float16: 5}


def _float(dtype: torch.dtype) -> tuple[torch.dtype, int]:
    """abi-check's dtype as the activation dtype and its code (float32 for an int8 one)."""
    dtype = dtype if dtype in _CODES else torch.float32
    return dtype, _CODES[dtype]


# -- RMSNorm + per-token quantization ------------------------------------------------------------


def rmsnorm_quantize_ref(
    x: Tensor, weight: Tensor, eps: float, dtype: int, q_eps: float, qmax: float
) -> tuple[Tensor, Tensor]:
    """The ops the pattern replaces: transformers' LlamaRMSNorm, flattened to rows, quantized."""
    xf = x.to(torch.float32)
    h = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    y = weight * h.to(_dtype(dtype))
    return quantize_per_token(y.reshape(-1, x.shape[-1]), q_eps, qmax)


def _meta_norm_quant(
    x: Tensor, weight: Tensor, eps: float, dtype: int, q_eps: float, qmax: float
) -> tuple[Tensor, Tensor]:
    m = x.numel() // x.shape[-1]
    return (
        x.new_empty((m, x.shape[-1]), dtype=torch.int8),
        x.new_empty((m, 1), dtype=torch.float32),
    )


def _norm_examples(dtype: torch.dtype) -> list[tuple[Any, ...]]:
    g, (dtype, code) = _gen(0), _float(dtype)
    return [
        ((torch.randn(*shape, generator=g) * 2).to(dtype), (torch.rand(shape[-1], generator=g) + 0.5).to(dtype), 1e-6, code, 1e-8, 127.0)
        for shape in [(1, 64), (3, 5, 96), (7, 40)]
    ]  # fmt: skip


@pdlkit.kernel(
    op="rmsnorm_quantize_per_token",
    dtypes={"x": _FLOATS, "weight": _FLOATS},
    shapes={"weight": {"rank": 1}},
    meta=_meta_norm_quant,
    reference=rmsnorm_quantize_ref,
    examples=_norm_examples,
    **_CAPTURED,
)
@launched_by_inductor(_FUSED)
def rmsnorm_quantize_triton(
    x: Tensor, weight: Tensor, eps: float, dtype: int, q_eps: float, qmax: float
) -> tuple[Tensor, Tensor]:
    """One pass per row: sum of squares, the normalized row cast as the model casts it,
    its absolute maximum, scale, codes; the normalized row is never stored."""
    if x.dtype != _dtype(dtype) or weight.dtype != x.dtype or weight.shape[0] != x.shape[-1]:
        raise pdlkit.KernelUnsupported(
            f"x {x.dtype}, weight {weight.dtype} [{weight.shape[0]}], cast to {_dtype(dtype)}: "
            "one dtype and the row's length"
        )
    x2 = x.reshape(-1, x.shape[-1])
    _some_rows(x2.shape[0])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    return _fused().rmsnorm_quant(x2, weight.contiguous(), eps, q_eps, qmax)


def _int_sums(q: Tensor, w: Tensor) -> Tensor:
    """q @ w.T exactly, on any device and for any M (float64 holds these int32 sums exactly;
    ``torch._int_mm`` needs M > 16 on CUDA)."""
    return (q.to(torch.float64) @ w.to(torch.float64).t()).to(torch.int32)


# -- int8 GEMM + residual ------------------------------------------------------------------------


def _residual_io(residual: Tensor, m: int, n: int, dtype: int) -> tuple[Tensor, Tensor]:
    """For a residual GEMM of ``m`` rows (declined where there are none): the residual as the
    [m, n] rows the epilogue adds (declines another dtype or size), and the [m, n] output."""
    _some_rows(m)
    if residual.dtype != _dtype(dtype) or residual.numel() != m * n or residual.shape[-1] != n:
        raise pdlkit.KernelUnsupported(
            f"residual {tuple(residual.shape)} {residual.dtype} for a {m} x {n} {_dtype(dtype)} GEMM"
        )
    res = residual.reshape(m, n)
    out = torch.empty((m, n), dtype=residual.dtype, device=residual.device)
    return (res if res.is_contiguous() else res.contiguous()), out


def int8_linear_residual_ref(
    q: Tensor, x_scale: Tensor, w: Tensor, w_scale: Tensor, residual: Tensor, dtype: int,
    shape: list[int],
) -> Tensor:  # fmt: skip
    y = (_int_sums(q, w).to(torch.float32) * x_scale * w_scale).to(_dtype(dtype))
    return residual + y.reshape(shape)


def _meta_residual(
    q: Tensor, x_scale: Tensor, w: Tensor, w_scale: Tensor, residual: Tensor, dtype: int,
    shape: list[int],
) -> Tensor:  # fmt: skip
    return torch.empty_like(residual, memory_format=torch.contiguous_format)


def _int8_args(g: torch.Generator, m: int, k: int, n: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    q = torch.randint(-127, 128, (m, k), generator=g, dtype=torch.int8)
    w = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    return q, torch.rand(m, 1, generator=g) * 0.02 + 1e-3, w, torch.rand(n, generator=g) * 0.01


def _residual_examples(dtype: torch.dtype) -> list[tuple[Any, ...]]:
    g, (dtype, code) = _gen(1), _float(dtype)
    out = []
    for b, s, k, n in [(1, 1, 64, 32), (2, 3, 40, 24), (1, 70, 96, 48)]:
        q, xs, w, ws = _int8_args(g, b * s, k, n)
        out.append((q, xs, w, ws, torch.randn(b, s, n, generator=g).to(dtype), code, [b, s, n]))
    return out


@pdlkit.kernel(
    op="int8_linear_residual",
    dtypes={"q": [torch.int8], "w": [torch.int8], "residual": _FLOATS},
    shapes={"q": {"rank": 2}, "w": {"rank": 2, "contiguous": True}},
    meta=_meta_residual,
    reference=int8_linear_residual_ref,
    examples=_residual_examples,
    **_CAPTURED,
)
@launched_by_inductor(_GEMM, _SPLITK)
def int8_linear_residual_triton(
    q: Tensor, x_scale: Tensor, w: Tensor, w_scale: Tensor, residual: Tensor, dtype: int,
    shape: list[int],
) -> Tensor:  # fmt: skip
    """int8 GEMM, rescale and cast, then + residual in the same epilogue: up to 256 rows the
    split-K kernel, the tiled GEMM above."""
    m, n = q.shape[0], w.shape[0]
    res, out = _residual_io(residual, m, n, dtype)
    q2 = q if q.stride(-1) == 1 else q.contiguous()
    sa, sw = one_per_row(x_scale, m), w_scale.to(torch.float32).contiguous()
    if size_hint(m) <= _STREAM_ROWS:  # a symbolic M by its hint: no guard on it
        _splitk().splitk(q2, sa, w, sw, out, residual=res)
    else:
        _triton().gemm(q2, w, out, a_scale=sa, b_scale=sw, residual=res)
    return out.reshape(residual.shape)


# -- per-token quantization + int8 GEMM + residual (o- and down-projections, few rows) -----------

# Up to this many rows the quantization runs inside the GEMM (``splitk(..., quantize=)``): one
# launch for the two ops, for a decode step of one sequence, host-bound without CUDA graphs.
# Every program of the GEMM quantizes the row itself, so more rows would multiply that work by
# the programs (see _triton_splitk.py); above, quant_rows and int8_linear_residual_triton, two
# launches as before. Its pattern (patterns/cuda/quant_residual.pdl.mlir) ships disabled:
# on an H200 the Llama-3 decode step of one sequence had 4 launches fewer and 13 us more GPU
# time (benchmarks/results/cuda_step_host_llama3-gqa.md's notes).
_QUANT_ROWS = 1


def quant_int8_linear_residual_ref(
    x: Tensor, eps: float, qmax: float, w: Tensor, w_scale: Tensor, residual: Tensor, dtype: int,
    shape: list[int],
) -> Tensor:  # fmt: skip
    """The ops the pattern replaces: quantize_per_token, then int8_linear_residual."""
    q, s = quantize_per_token(x, eps, qmax)
    return int8_linear_residual_ref(q, s, w, w_scale, residual, dtype, shape)


def _meta_quant_residual(
    x: Tensor, eps: float, qmax: float, w: Tensor, w_scale: Tensor, residual: Tensor, dtype: int,
    shape: list[int],
) -> Tensor:  # fmt: skip
    return torch.empty_like(residual, memory_format=torch.contiguous_format)


def _quant_residual_examples(dtype: torch.dtype) -> list[tuple[Any, ...]]:
    g, (dtype, code) = _gen(3), _float(dtype)
    out = []
    for b, s, k, n in [(1, 1, 64, 32), (2, 3, 40, 24), (1, 12, 96, 48)]:  # 12 rows: two launches
        _, _, w, ws = _int8_args(g, 1, k, n)
        x = (torch.randn(b * s, k, generator=g) * 3).to(dtype)
        out.append(
            (x, 1e-8, 127.0, w, ws, torch.randn(b, s, n, generator=g).to(dtype), code, [b, s, n])
        )
    return out


@pdlkit.kernel(
    op="quant_int8_linear_residual",
    dtypes={"x": _FLOATS, "w": [torch.int8], "residual": _FLOATS},
    shapes={"x": {"rank": 2}, "w": {"rank": 2, "contiguous": True}},
    meta=_meta_quant_residual,
    reference=quant_int8_linear_residual_ref,
    examples=_quant_residual_examples,
    **_CAPTURED,
)
@launched_by_inductor(_GEMM, _SPLITK)
def quant_int8_linear_residual_triton(
    x: Tensor, eps: float, qmax: float, w: Tensor, w_scale: Tensor, residual: Tensor, dtype: int,
    shape: list[int],
) -> Tensor:  # fmt: skip
    """Per-token int8 quantization of x, int8 GEMM, rescale, + residual: up to ``_QUANT_ROWS``
    rows in one split-K launch that quantizes the row itself, above as two launches."""
    m, n = x.shape[0], w.shape[0]
    if x.shape[1] != w.shape[1]:
        raise pdlkit.KernelUnsupported(f"x has K = {x.shape[1]}, the weight {w.shape[1]}")
    x2 = x if x.stride(-1) == 1 else x.contiguous()
    if m > _QUANT_ROWS:
        q, s = _triton().quant_rows(x2, eps, qmax)
        return int8_linear_residual_triton.fn(q, s, w, w_scale, residual, dtype, shape)
    res, out = _residual_io(residual, m, n, dtype)
    sw = w_scale.to(torch.float32).contiguous()
    _splitk().splitk(x2, None, w, sw, out, residual=res, quantize=(eps, qmax))
    return out.reshape(residual.shape)


# -- three GEMMs over one activation (Q, K, V) ---------------------------------------------------


def int8_linear3_ref(
    q: Tensor, x_scale: Tensor, w0: Tensor, s0: Tensor, w1: Tensor, s1: Tensor, w2: Tensor,
    s2: Tensor, dtype: int,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    def one(w: Tensor, s: Tensor) -> Tensor:
        return (_int_sums(q, w).to(torch.float32) * x_scale * s).to(_dtype(dtype))

    return one(w0, s0), one(w1, s1), one(w2, s2)


def _meta3(
    q: Tensor, x_scale: Tensor, w0: Tensor, s0: Tensor, w1: Tensor, s1: Tensor, w2: Tensor,
    s2: Tensor, dtype: int,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    m, dt = q.shape[0], _dtype(dtype)
    return tuple(q.new_empty((m, w.shape[0]), dtype=dt) for w in (w0, w1, w2))  # type: ignore[return-value]


def _examples3(dtype: torch.dtype) -> list[tuple[Any, ...]]:
    g, (dtype, code) = _gen(2), _float(dtype)
    out = []
    for m, k, ns in [(1, 64, (64, 16, 16)), (5, 40, (24, 24, 24)), (70, 96, (48, 16, 16))]:
        q, xs, w0, s0 = _int8_args(g, m, k, ns[0])
        _, _, w1, s1 = _int8_args(g, 1, k, ns[1])
        _, _, w2, s2 = _int8_args(g, 1, k, ns[2])
        out.append((q, xs, w0, s0, w1, s1, w2, s2, code))
    return out


@pdlkit.kernel(
    op="int8_linear3",
    dtypes={"q": [torch.int8], "w0": [torch.int8], "w1": [torch.int8], "w2": [torch.int8]},
    shapes={
        "q": {"rank": 2},
        "w0": {"rank": 2, "contiguous": True},
        "w1": {"rank": 2, "contiguous": True},
        "w2": {"rank": 2, "contiguous": True},
    },
    meta=_meta3,
    reference=int8_linear3_ref,
    examples=_examples3,
    **_CAPTURED,
)
@launched_by_inductor(_FUSED, _GEMM)
def int8_linear3_triton(
    q: Tensor, x_scale: Tensor, w0: Tensor, s0: Tensor, w1: Tensor, s1: Tensor, w2: Tensor,
    s2: Tensor, dtype: int,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """Up to 256 rows one launch streams the three weights (program ids split among them);
    above, the tiled GEMM once per weight (prefill is not launch-bound)."""
    m, dt = q.shape[0], _dtype(dtype)
    _some_rows(m)
    if not w0.shape[1] == w1.shape[1] == w2.shape[1] == q.shape[1]:
        raise pdlkit.KernelUnsupported("the three weights' K differ from the activation's")
    q2 = q if q.stride(-1) == 1 else q.contiguous()
    sa = one_per_row(x_scale, m)
    ws, ss = [w0, w1, w2], [s.to(torch.float32).contiguous() for s in (s0, s1, s2)]
    outs = [torch.empty((m, w.shape[0]), dtype=dt, device=q.device) for w in ws]
    if size_hint(m) <= _STREAM_ROWS:  # a symbolic M by its hint: no guard on it
        _fused().grouped_splitk(q2, sa, ws, ss, outs)
    else:
        for w, s, o in zip(ws, ss, outs, strict=True):
            _triton().gemm(q2, w, o, a_scale=sa, b_scale=s)
    return outs[0], outs[1], outs[2]

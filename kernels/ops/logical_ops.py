"""The shipped logical ops: parameters and types, output shapes (meta), reference semantics
and example inputs, each declared once with :func:`pdlkit.op`.

A kernel says ``implements="qlinear_q"`` and takes its parameter names, schema, meta and
reference from here (:mod:`pdlkit.runtime_abi.ops`). Each op's examples spread shapes over
edge sizes: M = 1, K not a multiple of 4 or 16, odd N, 3-D activations. The int8 linear ops
take ``(x_q, x_scale, x_zp, w_q, ...)``; a requantized output's range ``[out_qmin, out_qmax]``
selects uint8 or int8.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from pdlkit.quantization.int8_dynamic import quantize_per_token as per_token
from pdlkit.runtime_abi.dtypes import dtype_from_code, quantized_dtype
from torch import Tensor

import pdlkit

# -- output shapes and dtypes (meta): the op's, whichever kernel runs it


def _rows_by(x: Tensor, w: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """[..., N] for activations [..., K] and weights [N, K]."""
    return x.new_empty((*x.shape[:-1], w.shape[0]), dtype=dtype)


def linear_meta(x: Tensor, weight: Tensor, *rest: Any) -> Tensor:
    return _rows_by(x, weight)


def qlinear_meta(x_q: Tensor, x_scale: Any, x_zp: Any, w_q: Tensor, *rest: Any) -> Tensor:
    """float32 [..., N]."""
    return _rows_by(x_q, w_q, torch.float32)


def qlinear_q_meta(x_q: Tensor, x_scale: Any, x_zp: Any, w_q: Tensor, *rest: Any) -> Tensor:
    """uint8 or int8 [..., N]: ``rest[5]`` is ``out_qmin`` (the 10th argument)."""
    return _rows_by(x_q, w_q, quantized_dtype(rest[5]))


def _codes_meta(x_q: Tensor, x_scale: Any, x_zp: Any, w_q: Tensor, *rest: Any) -> Tensor:
    """uint8 or int8 [..., N] where ``out_qmin`` is the next to last argument."""
    return _rows_by(x_q, w_q, quantized_dtype(rest[-2]))


def _ln_q_meta(
    x_q: Tensor, x_scale: Any, x_zp: Any, w_q: Tensor, *rest: Any
) -> tuple[Tensor, Tensor]:
    """float32 [..., N] (the LayerNorm's result) and its uint8 or int8 codes."""
    return _rows_by(x_q, w_q, torch.float32), _codes_meta(x_q, x_scale, x_zp, w_q, *rest)


_GEMM_SHAPES = [(1, 1, 1), (1, 7, 3), (5, 16, 9), (17, 33, 8), (64, 256, 128)]


def _linear_examples(dtype: torch.dtype, extra: tuple = ()) -> list[tuple]:
    g = torch.Generator().manual_seed(0)
    out = []
    for m, k, n in _GEMM_SHAPES:
        x = torch.randn(m, k, generator=g).to(dtype)
        w = torch.randn(n, k, generator=g).to(dtype)
        b = torch.randn(n, generator=g).to(dtype)
        out.append((x, w, b, *extra))
    x3 = torch.randn(2, 3, 8, generator=g).to(dtype)
    out.append((x3, torch.randn(4, 8, generator=g).to(dtype), None, *extra))
    return out


@pdlkit.op(
    meta=linear_meta,
    examples=lambda dtype: _linear_examples(dtype, ("none",)) + _linear_examples(dtype, ("tanh",)),
)
def linear_gelu(x: Tensor, weight: Tensor, bias: Tensor | None, approximate: str) -> Tensor:
    return F.gelu(F.linear(x, weight, bias), approximate=approximate)


@pdlkit.op(meta=linear_meta, examples=_linear_examples)
def linear_relu(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    return torch.relu(F.linear(x, weight, bias))


def _int_mm_examples(dtype: torch.dtype) -> list[tuple]:
    g = torch.Generator().manual_seed(0)
    return [
        (
            torch.randint(-128, 128, (m, k), generator=g, dtype=torch.int8),
            torch.randint(-128, 128, (k, n), generator=g, dtype=torch.int8),
        )
        for m, k, n in _GEMM_SHAPES
    ]


def _int_mm_meta(a: Tensor, b: Tensor) -> Tensor:
    return a.new_empty((a.shape[0], b.shape[1]), dtype=torch.int32)


@pdlkit.op(meta=_int_mm_meta, examples=_int_mm_examples)
def int_mm(a: Tensor, b: Tensor) -> Tensor:
    return torch._int_mm(a, b)


def _outer_examples(dtype: torch.dtype) -> list[tuple]:
    g = torch.Generator().manual_seed(0)
    return [
        (torch.randn(b, m, 1, generator=g).to(dtype), torch.randn(b, 1, n, generator=g).to(dtype))
        for b, m, n in [(1, 64, 1), (1, 64, 2048), (2, 8, 5), (3, 1, 7)]
    ]


def _outer_meta(a: Tensor, b: Tensor) -> Tensor:
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return a.new_empty((*batch, a.shape[-2], b.shape[-1]))


@pdlkit.op(meta=_outer_meta, examples=_outer_examples)
def matmul_outer(a: Tensor, b: Tensor) -> Tensor:
    """A matmul of inner dimension 1 (``a`` [..., M, 1], ``b`` [..., 1, N], batch dims
    broadcast): each batch's outer product of a column and a row. transformers' rotary
    embeddings (Llama's up to 5.17) compute their frequencies this way: inverse frequencies
    @ positions."""
    return torch.matmul(a, b)


def _qd():  # quantized_decomposed ops are registered by torchao's PT2E module
    import torchao.quantization.pt2e  # noqa: F401

    return torch.ops.quantized_decomposed


def _x_range(x_q):  # u8 activations (x86 PT2E) or s8 (Arm / XNNPACK quantizers)
    return (0, 255, torch.uint8) if x_q.dtype == torch.uint8 else (-128, 127, torch.int8)


def _qlinear_ref(x_q, x_scale, x_zp, w_q, w_scale, w_zp, bias, post_op, algorithm):
    qd = _qd()
    x = qd.dequantize_per_tensor(x_q, x_scale, x_zp, *_x_range(x_q))
    w = qd.dequantize_per_channel(w_q, w_scale, w_zp, 0, -128, 127, torch.int8)
    y = F.linear(x, w, bias)
    if post_op == "relu":
        y = torch.relu(y)
    elif post_op == "gelu":
        y = F.gelu(y, approximate=algorithm)
    return y


def _qlinear_examples(dtype: torch.dtype, quantized_out: bool) -> list[tuple]:
    g = torch.Generator().manual_seed(0)
    out = []
    for (m, k, n), post in zip(
        _GEMM_SHAPES + [(3, 24, 40)], ["none", "relu", "gelu", "none", "relu", "gelu"], strict=True
    ):
        x_q = torch.randint(0, 256, (m, k), generator=g, dtype=torch.uint8)
        w_q = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
        w_scale = torch.rand(n, generator=g) * 0.01 + 1e-3
        w_zp = torch.zeros(n, dtype=torch.int64)
        bias = torch.randn(n, generator=g)
        algo = "tanh" if post == "gelu" and m % 2 else ("none" if post == "gelu" else "")
        args = (x_q, 0.02, 128, w_q, w_scale, w_zp, bias)
        out.append((*args, 0.05, 3, 0, 255, post, algo) if quantized_out else (*args, post, algo))
    return out


@pdlkit.op(meta=qlinear_meta, examples=lambda dtype: _qlinear_examples(dtype, False))
def qlinear(
    x_q: Tensor, x_scale: float, x_zp: int, w_q: Tensor, w_scale: Tensor, w_zp: Tensor,
    bias: Tensor | None, post_op: str, algorithm: str,
) -> Tensor:  # fmt: skip
    return _qlinear_ref(x_q, x_scale, x_zp, w_q, w_scale, w_zp, bias, post_op, algorithm)


@pdlkit.op(meta=qlinear_q_meta, examples=lambda dtype: _qlinear_examples(dtype, True))
def qlinear_q(
    x_q: Tensor, x_scale: float, x_zp: int, w_q: Tensor, w_scale: Tensor, w_zp: Tensor,
    bias: Tensor | None, out_scale: float, out_zp: int, out_qmin: int, out_qmax: int,
    post_op: str, algorithm: str,
) -> Tensor:  # fmt: skip
    y = _qlinear_ref(x_q, x_scale, x_zp, w_q, w_scale, w_zp, bias, post_op, algorithm)
    dtype = quantized_dtype(out_qmin)
    return _qd().quantize_per_tensor(y, out_scale, out_zp, out_qmin, out_qmax, dtype)


def _qlinear_dynamic_examples(dtype: torch.dtype) -> list[tuple]:
    out = []
    for args in _qlinear_examples(dtype, False):
        x_q, x_scale, x_zp, *rest = args
        out.append((x_q, torch.tensor([x_scale], dtype=torch.float64), torch.tensor([x_zp]), *rest))
    return out


@pdlkit.op(meta=qlinear_meta, examples=_qlinear_dynamic_examples)
def qlinear_dynamic(
    x_q: Tensor, x_scale: Tensor, x_zp: Tensor, w_q: Tensor, w_scale: Tensor, w_zp: Tensor,
    bias: Tensor | None, post_op: str, algorithm: str,
) -> Tensor:  # fmt: skip
    qd = _qd()
    x = qd.dequantize_per_tensor.tensor(x_q, x_scale, x_zp, *_x_range(x_q))
    w = qd.dequantize_per_channel(w_q, w_scale, w_zp, 0, -128, 127, torch.int8)
    y = F.linear(x, w, bias)
    if post_op == "relu":
        y = torch.relu(y)
    elif post_op == "gelu":
        y = F.gelu(y, approximate=algorithm)
    return y


@pdlkit.op(meta=linear_meta, examples=_linear_examples)
def linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    return F.linear(x, weight, bias)


def _qlinear_add_examples(dtype: torch.dtype) -> list[tuple]:
    g = torch.Generator().manual_seed(1)
    out = []
    for args in _qlinear_examples(dtype, False):
        x_q, xs, xzp, w_q, w_scale, w_zp, bias, *_ = args
        other = torch.randn(*x_q.shape[:-1], w_q.shape[0], generator=g)
        out.append((x_q, xs, xzp, w_q, w_scale, w_zp, bias, other))
    return out


@pdlkit.op(meta=qlinear_meta, examples=_qlinear_add_examples)
def qlinear_add(
    x_q: Tensor, x_scale: float, x_zp: int, w_q: Tensor, w_scale: Tensor, w_zp: Tensor,
    bias: Tensor | None, other: Tensor,
) -> Tensor:  # fmt: skip
    return _qlinear_ref(x_q, x_scale, x_zp, w_q, w_scale, w_zp, bias, "none", "") + other


# A transformer block's output projection: qlinear -> + residual -> LayerNorm [-> quantize]
# (patterns/x86/qlinear_add_layer_norm.pdl.mlir).


def _qlinear_add_ln_examples(dtype: torch.dtype, quantized_out: bool) -> list[tuple]:
    """N up to 256 (one LayerNorm row over several 64-column panels), N not a multiple of 16,
    M not a multiple of 6, 3-D activations, LayerNorms without weight or bias, int8 codes."""
    g = torch.Generator().manual_seed(2)
    out = []
    for i, (m, k, n) in enumerate([(1, 7, 3), (5, 16, 9), (17, 33, 72), (13, 256, 256)]):
        x_q = torch.randint(0, 256, (m, k), generator=g, dtype=torch.uint8)
        if i == 3:
            x_q = x_q.view(1, m, k)
        w_q = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
        w_scale = torch.rand(n, generator=g) * 0.01 + 1e-3
        w_zp = torch.zeros(n, dtype=torch.int64)
        bias = torch.randn(n, generator=g)
        res = torch.randn(*x_q.shape[:-1], n, generator=g)
        gamma = None if i == 1 else torch.rand(n, generator=g) + 0.5
        beta = None if i == 2 else torch.randn(n, generator=g) * 0.1
        args = (
            x_q,
            0.02,
            128,
            w_q,
            w_scale,
            w_zp,
            bias,
            res,
            [n],
            gamma,
            beta,
            1e-12 if i else 1e-5,
        )
        qrange = (-128, 127) if i == 2 else (0, 255)
        out.append((*args, 0.03, 0 if i == 2 else 128, *qrange) if quantized_out else args)
    return out


@pdlkit.op(meta=qlinear_meta, examples=lambda dtype: _qlinear_add_ln_examples(dtype, False))
def qlinear_add_layer_norm(
    x_q: Tensor, x_scale: float, x_zp: int, w_q: Tensor, w_scale: Tensor, w_zp: Tensor,
    bias: Tensor | None, residual: Tensor, normalized_shape: list[int], ln_weight: Tensor | None,
    ln_bias: Tensor | None, eps: float,
) -> Tensor:  # fmt: skip
    """layer_norm(qlinear(...) + residual)."""
    y = _qlinear_ref(x_q, x_scale, x_zp, w_q, w_scale, w_zp, bias, "none", "") + residual
    return F.layer_norm(y, normalized_shape, ln_weight, ln_bias, eps)


@pdlkit.op(meta=_ln_q_meta, examples=lambda dtype: _qlinear_add_ln_examples(dtype, True))
def qlinear_add_layer_norm_q(
    x_q: Tensor, x_scale: float, x_zp: int, w_q: Tensor, w_scale: Tensor, w_zp: Tensor,
    bias: Tensor | None, residual: Tensor, normalized_shape: list[int], ln_weight: Tensor | None,
    ln_bias: Tensor | None, eps: float, out_scale: float, out_zp: int, out_qmin: int,
    out_qmax: int,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """``(y, quantize_per_tensor(y))`` for ``y = layer_norm(qlinear(...) + residual)``: the
    float32 result feeds the next residual add, the codes the next int8 GEMM."""
    y = qlinear_add_layer_norm(
        x_q, x_scale, x_zp, w_q, w_scale, w_zp, bias, residual, normalized_shape, ln_weight,
        ln_bias, eps,
    )  # fmt: skip
    dtype = quantized_dtype(out_qmin)
    return y, _qd().quantize_per_tensor(y, out_scale, out_zp, out_qmin, out_qmax, dtype)


# int8 dynamic per-token (pdlkit.quantization.int8_dynamic): what patterns/cuda/ rewrites.


def _per_token_examples(dtype: torch.dtype) -> list[tuple]:
    g = torch.Generator().manual_seed(0)
    out = [(torch.randn(m, k, generator=g).to(dtype), 1e-8, 127.0) for m, k, _ in _GEMM_SHAPES]
    out.append((torch.zeros(3, 5).to(dtype), 1e-8, 127.0))  # all-zero rows: scale = eps / 127
    return out


def _per_token_meta(x: Tensor, eps: float, qmax: float) -> tuple[Tensor, Tensor]:
    return x.new_empty(x.shape, dtype=torch.int8), x.new_empty((x.shape[0], 1), dtype=torch.float32)


@pdlkit.op(meta=_per_token_meta, examples=_per_token_examples)
def quantize_per_token(x: Tensor, eps: float, qmax: float) -> tuple[Tensor, Tensor]:
    return per_token(x, eps, qmax)


def _int8_examples(dtype: torch.dtype, gated: bool = False) -> list[tuple]:
    g = torch.Generator().manual_seed(0)
    out: list[tuple[Any, ...]] = []
    for m, k, n in _GEMM_SHAPES:
        q = torch.randint(-127, 128, (m, k), generator=g, dtype=torch.int8)
        xs = torch.rand(m, 1, generator=g) * 0.02 + 1e-3
        w = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
        ws = torch.rand(n, generator=g) * 0.01 + 1e-3
        if gated:
            wu = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
            us = torch.rand(n, generator=g) * 0.01 + 1e-3
            out.append((q, xs, w, ws, wu, us, 15, None))
        else:
            out.append((q, xs, w, ws, torch.randn(n, generator=g) if n % 2 else None, 15))
    return out


def _int8_linear_meta(q: Tensor, x_scale: Tensor, w: Tensor, *rest: Any) -> Tensor:
    """[M, N] in the dtype whose code is the last argument."""
    return q.new_empty((q.shape[0], w.shape[0]), dtype=dtype_from_code(rest[-1]))


@pdlkit.op(meta=_int8_linear_meta, examples=_int8_examples)
def int8_linear(
    q: Tensor, x_scale: Tensor, w: Tensor, w_scale: Tensor, bias: Tensor | None, dtype: int
) -> Tensor:
    y = (q.to(torch.int32) @ w.to(torch.int32).T).to(torch.float32) * x_scale * w_scale
    if bias is not None:
        y = y + bias
    return y.to(dtype_from_code(dtype))


def _gated_meta(
    q: Tensor, x_scale: Tensor, wg: Tensor, sg: Tensor, wu: Tensor, su: Tensor, dtype: int,
    shape: list[int] | None,
) -> Tensor:  # fmt: skip
    out = q.new_empty((q.shape[0], wg.shape[0]), dtype=dtype_from_code(dtype))
    return out.reshape(shape) if shape is not None else out


@pdlkit.op(meta=_gated_meta, examples=lambda dtype: _int8_examples(dtype, gated=True))
def int8_gated_silu(
    q: Tensor, x_scale: Tensor, wg: Tensor, sg: Tensor, wu: Tensor, su: Tensor, dtype: int,
    shape: list[int] | None,
) -> Tensor:  # fmt: skip
    gate = int8_linear(q, x_scale, wg, sg, None, dtype)
    up = int8_linear(q, x_scale, wu, su, None, dtype)
    h = F.silu(gate) * up
    return h.reshape(shape) if shape is not None else h


# -- int8 linear with the weight quantized per tensor (ArmInductorQuantizer graphs): the
# weight's scale and zero point are numbers, not per-channel tensors.


def _qlinear_pt_ref(x, w_q, w_scale, w_zp, bias, post_op, algorithm):
    w = _qd().dequantize_per_tensor(w_q, w_scale, w_zp, -128, 127, torch.int8)
    y = F.linear(x, w, bias)
    if post_op == "relu":
        y = torch.relu(y)
    elif post_op == "gelu":
        y = F.gelu(y, approximate=algorithm or "none")
    return y


def _qlinear_pt_examples(dtype: torch.dtype, quantized_out: bool) -> list[tuple]:
    out = []
    for args in _qlinear_examples(dtype, quantized_out):
        x_q, xs, xzp, w_q, w_scale, w_zp, bias, *rest = args
        x_s8 = (x_q.to(torch.int16) - 128).to(torch.int8)  # Arm graphs: s8 activations
        out.append((x_s8, xs, xzp - 128, w_q, float(w_scale[0]), 0, bias, *rest))
    return out


@pdlkit.op(meta=qlinear_meta, examples=lambda dtype: _qlinear_pt_examples(dtype, False))
def qlinear_pt(
    x_q: Tensor, x_scale: float, x_zp: int, w_q: Tensor, w_scale: float, w_zp: int,
    bias: Tensor | None, post_op: str, algorithm: str,
) -> Tensor:  # fmt: skip
    x = _qd().dequantize_per_tensor(x_q, x_scale, x_zp, *_x_range(x_q))
    return _qlinear_pt_ref(x, w_q, w_scale, w_zp, bias, post_op, algorithm)


@pdlkit.op(meta=qlinear_q_meta, examples=lambda dtype: _qlinear_pt_examples(dtype, True))
def qlinear_q_pt(
    x_q: Tensor, x_scale: float, x_zp: int, w_q: Tensor, w_scale: float, w_zp: int,
    bias: Tensor | None, out_scale: float, out_zp: int, out_qmin: int, out_qmax: int,
    post_op: str, algorithm: str,
) -> Tensor:  # fmt: skip
    y = qlinear_pt(x_q, x_scale, x_zp, w_q, w_scale, w_zp, bias, post_op, algorithm)
    dtype = quantized_dtype(out_qmin)
    return _qd().quantize_per_tensor(y, out_scale, out_zp, out_qmin, out_qmax, dtype)


def _qlinear_dynamic_pt_examples(dtype: torch.dtype) -> list[tuple]:
    out = []
    for x_q, xs, xzp, *rest in _qlinear_pt_examples(dtype, False):
        out.append((x_q, torch.tensor([xs], dtype=torch.float64), torch.tensor([xzp]), *rest))
    return out


@pdlkit.op(meta=qlinear_meta, examples=_qlinear_dynamic_pt_examples)
def qlinear_dynamic_pt(
    x_q: Tensor, x_scale: Tensor, x_zp: Tensor, w_q: Tensor, w_scale: float, w_zp: int,
    bias: Tensor | None, post_op: str, algorithm: str,
) -> Tensor:  # fmt: skip
    x = _qd().dequantize_per_tensor.tensor(x_q, x_scale, x_zp, *_x_range(x_q))
    return _qlinear_pt_ref(x, w_q, w_scale, w_zp, bias, post_op, algorithm)


# -- attention + quantize_per_tensor (PT2E int8 attention: patterns/x86/attention.pdl.mlir)


def _attention_examples(dtype: torch.dtype) -> list[tuple]:
    """Edge shapes: odd Sq / Sk, D not a multiple of 16 (and odd), Sk != Sq, D up to 256;
    bool (broadcast over heads and rows, stride 0), float and no masks, fully masked rows,
    causal, q / k / v as head views of [B, S, H * D] activations, u8 and s8 outputs, scale None
    (0.0). out_scale is calibrated on the output (as PT2E's observers do), so one code is 1/255
    of the output's range."""
    g = torch.Generator().manual_seed(0)
    cases = [  # B, H, Sq, Sk, D, mask, causal, scale, strided, signed
        (1, 1, 1, 1, 1, "none", 0, 0.5, False, False),
        (2, 3, 7, 9, 5, "bool", 0, 0.0, False, False),
        (2, 2, 17, 33, 19, "float", 0, 0.2, True, False),
        (1, 2, 13, 13, 40, "none", 1, 0.0, True, True),
        (2, 4, 16, 16, 64, "bool_rows", 0, 0.125, True, False),
        (1, 2, 5, 70, 256, "float", 0, 0.0, False, True),
    ]

    def make(b: int, h: int, s: int, d: int, strided: bool) -> torch.Tensor:
        if strided:  # a head view of a [B, S, H * D] linear output
            return torch.randn(b, s, h * d, generator=g).view(b, s, h, d).transpose(1, 2)
        return torch.randn(b, h, s, d, generator=g)

    out = []
    for b, h, sq, sk, d, mask, causal, scale, strided, signed in cases:
        q, k, v = (make(b, h, s, d, strided) for s in (sq, sk, sk))
        m = None
        if mask == "bool":  # HF BERT: [B, 1, 1, Sk] expanded over the query rows
            m = (torch.rand(b, 1, 1, sk, generator=g) > 0.3).expand(b, 1, sq, sk)
        elif mask == "bool_rows":  # every mask element its own, a fully masked row
            m = torch.rand(b, h, sq, sk, generator=g) > 0.5
            m[0, 0, 1] = False
        elif mask == "float":
            m = torch.randn(b, 1, sq, sk, generator=g)
            m[:, :, 0] = float("-inf")  # fully masked rows: zeros, as torch gives
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=m, is_causal=bool(causal), scale=scale or None
        )
        lo, hi = y.min().item(), y.max().item()
        o_scale = max(hi - lo, 1e-6) / 255
        qmin, qmax = (-128, 127) if signed else (0, 255)
        zp = max(qmin, min(qmax, qmin - round(lo / o_scale)))
        out.append((q, k, v, m, causal, scale, o_scale, zp, qmin, qmax))
    return out


def _attention_meta(q: Tensor, *rest: Any) -> Tensor:
    return q.new_empty(q.shape[:-1] + rest[1].shape[-1:], dtype=quantized_dtype(rest[-2]))


def _merged_meta(q: Tensor, k: Tensor, v: Tensor, *rest: Any) -> Tensor:
    b, h, s, _ = q.shape
    return q.new_empty((b, s, h * v.shape[-1]), dtype=quantized_dtype(rest[-2]))


@pdlkit.op(meta=_attention_meta, examples=_attention_examples)
def attention_q(
    q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, is_causal: int, scale: float,
    out_scale: float, out_zp: int, out_qmin: int, out_qmax: int,
) -> Tensor:  # fmt: skip
    """quantize_per_tensor(scaled_dot_product_attention(...)); ``scale <= 0`` means None."""
    y = F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, is_causal=bool(is_causal), scale=scale if scale > 0 else None
    )
    dtype = quantized_dtype(out_qmin)
    return _qd().quantize_per_tensor(y, out_scale, out_zp, out_qmin, out_qmax, dtype)


@pdlkit.op(meta=_merged_meta, examples=_attention_examples)
def attention_q_merged(
    q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, is_causal: int, scale: float,
    out_scale: float, out_zp: int, out_qmin: int, out_qmax: int,
) -> Tensor:  # fmt: skip
    """attention_q with the heads merged: [B, H, Sq, D] -> [B, Sq, H * D] (PT2E BERT)."""
    y = attention_q(q, k, v, attn_mask, is_causal, scale, out_scale, out_zp, out_qmin, out_qmax)
    b, h, s, d = y.shape
    return y.transpose(1, 2).reshape(b, s, h * d)


# -- Q, K, V projections + attention + quantize (patterns/x86/qkv_attention.pdl.mlir)


def _qkv_attention_examples(dtype: torch.dtype) -> list[tuple]:
    """[B, S, K] activations whose three projections are split into heads by ``view(B, S, -1,
    D)``: K not a multiple of 4, one head, S = 1, a head dim not a multiple of 16, no bias,
    HF BERT's broadcast bool mask, a float mask, causal, int8 output; out_scale calibrated on
    the reference output."""
    g = torch.Generator().manual_seed(1)
    cases = [  # B, S, K, H, D, mask, causal, bias, signed
        (1, 1, 5, 1, 3, "none", 0, True, False),
        (2, 7, 30, 2, 8, "bool", 0, True, False),
        (1, 9, 16, 3, 5, "float", 1, False, True),
        (2, 16, 64, 4, 16, "bool", 0, True, False),
    ]
    out = []
    for b, s, k, h, d, mask, causal, bias, signed in cases:
        n = h * d
        x_q = torch.randint(0, 256, (b, s, k), generator=g, dtype=torch.uint8)
        ws = []
        for _ in range(3):
            w = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
            # q, k of about unit size, as trained models have them: BF16 attention on logits
            # in the tens moves codes by more than one step (see attention.c, Precision)
            sc = (torch.rand(n, generator=g) + 0.5) * 0.01 / k**0.5
            ws += [
                w,
                sc,
                torch.zeros(n, dtype=torch.int64),
                torch.randn(n, generator=g) if bias else None,
            ]
        m = None
        if mask == "bool":  # HF BERT: [B, 1, 1, S] expanded over the query rows
            m = torch.rand(b, 1, 1, s, generator=g) > 0.3
            m[..., 0] = True  # no fully masked row
            m = m.expand(b, 1, s, s)
        elif mask == "float":
            m = torch.randn(b, 1, s, s, generator=g)
        args = (x_q, 0.02, 128, *ws, [b, s, -1, d], m, causal, 0.3)
        f = _qkv_attention_float(*args)  # calibrated on, as PT2E's observers do
        lo, hi = f.min().item(), f.max().item()
        qmin, qmax = (-128, 127) if signed else (0, 255)
        o_scale = max(hi - lo, 1e-6) / 255
        zp = max(qmin, min(qmax, qmin - round(lo / o_scale)))
        out.append((*args, o_scale, zp, qmin, qmax))
    return out


def _qkv_attention_float(
    x_q, x_scale, x_zp, wq, sq, zq, bq, wk, sk, zk, bk, wv, sv, zv, bv, head_shape, attn_mask,
    is_causal, scale,
):  # fmt: skip
    q, k, v = (
        _qlinear_ref(x_q, x_scale, x_zp, w, s, z, bias, "none", "").view(head_shape).transpose(1, 2)
        for w, s, z, bias in ((wq, sq, zq, bq), (wk, sk, zk, bk), (wv, sv, zv, bv))
    )
    y = F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, is_causal=bool(is_causal), scale=scale
    )
    b, h, s, d = y.shape
    return y.transpose(1, 2).reshape(b, s, h * d)


@pdlkit.op(meta=_codes_meta, examples=_qkv_attention_examples)
def qkv_attention_q_merged(
    x_q: Tensor, x_scale: float, x_zp: int, wq: Tensor, sq: Tensor, zq: Tensor, bq: Tensor | None,
    wk: Tensor, sk: Tensor, zk: Tensor, bk: Tensor | None, wv: Tensor, sv: Tensor, zv: Tensor,
    bv: Tensor | None, head_shape: list[int], attn_mask: Tensor | None, is_causal: int,
    scale: float, out_scale: float, out_zp: int, out_qmin: int, out_qmax: int,
) -> Tensor:  # fmt: skip
    """A self-attention block of a PT2E int8 transformer up to its output projection's input:
    ``q, k, v = (qlinear(x, w*, ...).view(head_shape).transpose(1, 2))``, then
    ``attention_q_merged(q, k, v, attn_mask, is_causal, scale, out_scale, ...)`` ([B, S, H * D]
    codes)."""
    y = _qkv_attention_float(
        x_q, x_scale, x_zp, wq, sq, zq, bq, wk, sk, zk, bk, wv, sv, zv, bv, head_shape, attn_mask,
        is_causal, scale,
    )  # fmt: skip
    dtype = quantized_dtype(out_qmin)
    return _qd().quantize_per_tensor(y, out_scale, out_zp, out_qmin, out_qmax, dtype)

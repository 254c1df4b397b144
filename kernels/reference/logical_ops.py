"""Reference semantics and example inputs of the shipped logical ops (for ``pdlkit abi-check``).

Each op's examples spread shapes over edge sizes: M = 1, K not a multiple of 4 or 16,
odd N, 3-D activations.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pdlkit.kernels._qlinear_meta import quantized_dtype
from pdlkit.matcher.to_mlir import dtype_from_code
from pdlkit.quantization.int8_dynamic import quantize_per_token as per_token

import pdlkit

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


@pdlkit.reference(
    "linear_gelu",
    examples=lambda dtype: _linear_examples(dtype, ("none",)) + _linear_examples(dtype, ("tanh",)),
)
def linear_gelu(x, weight, bias, approximate):
    return F.gelu(F.linear(x, weight, bias), approximate=approximate)


@pdlkit.reference("linear_relu", examples=_linear_examples)
def linear_relu(x, weight, bias):
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


@pdlkit.reference("int_mm", examples=_int_mm_examples)
def int_mm(a, b):
    return torch._int_mm(a, b)


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


@pdlkit.reference("qlinear", examples=lambda dtype: _qlinear_examples(dtype, False))
def qlinear(x_q, x_scale, x_zp, w_q, w_scale, w_zp, bias, post_op, algorithm):
    return _qlinear_ref(x_q, x_scale, x_zp, w_q, w_scale, w_zp, bias, post_op, algorithm)


@pdlkit.reference("qlinear_q", examples=lambda dtype: _qlinear_examples(dtype, True))
def qlinear_q(
    x_q,
    x_scale,
    x_zp,
    w_q,
    w_scale,
    w_zp,
    bias,
    out_scale,
    out_zp,
    out_qmin,
    out_qmax,
    post_op,
    algorithm,
):
    y = _qlinear_ref(x_q, x_scale, x_zp, w_q, w_scale, w_zp, bias, post_op, algorithm)
    dtype = quantized_dtype(out_qmin)
    return _qd().quantize_per_tensor(y, out_scale, out_zp, out_qmin, out_qmax, dtype)


def _qlinear_dynamic_examples(dtype: torch.dtype) -> list[tuple]:
    out = []
    for args in _qlinear_examples(dtype, False):
        x_q, x_scale, x_zp, *rest = args
        out.append((x_q, torch.tensor([x_scale], dtype=torch.float64), torch.tensor([x_zp]), *rest))
    return out


@pdlkit.reference("qlinear_dynamic", examples=_qlinear_dynamic_examples)
def qlinear_dynamic(x_q, x_scale, x_zp, w_q, w_scale, w_zp, bias, post_op, algorithm):
    qd = _qd()
    x = qd.dequantize_per_tensor.tensor(x_q, x_scale, x_zp, *_x_range(x_q))
    w = qd.dequantize_per_channel(w_q, w_scale, w_zp, 0, -128, 127, torch.int8)
    y = F.linear(x, w, bias)
    if post_op == "relu":
        y = torch.relu(y)
    elif post_op == "gelu":
        y = F.gelu(y, approximate=algorithm)
    return y


@pdlkit.reference("linear", examples=_linear_examples)
def linear(x, weight, bias):
    return F.linear(x, weight, bias)


def _qlinear_add_examples(dtype: torch.dtype) -> list[tuple]:
    g = torch.Generator().manual_seed(1)
    out = []
    for args in _qlinear_examples(dtype, False):
        x_q, xs, xzp, w_q, w_scale, w_zp, bias, *_ = args
        other = torch.randn(*x_q.shape[:-1], w_q.shape[0], generator=g)
        out.append((x_q, xs, xzp, w_q, w_scale, w_zp, bias, other))
    return out


@pdlkit.reference("qlinear_add", examples=_qlinear_add_examples)
def qlinear_add(x_q, x_scale, x_zp, w_q, w_scale, w_zp, bias, other):
    return _qlinear_ref(x_q, x_scale, x_zp, w_q, w_scale, w_zp, bias, "none", "") + other


# int8 dynamic per-token (pdlkit.quantization.int8_dynamic): what patterns/cuda/ rewrites.


def _per_token_examples(dtype: torch.dtype) -> list[tuple]:
    g = torch.Generator().manual_seed(0)
    out = [(torch.randn(m, k, generator=g).to(dtype), 1e-8, 127.0) for m, k, _ in _GEMM_SHAPES]
    out.append((torch.zeros(3, 5).to(dtype), 1e-8, 127.0))  # all-zero rows: scale = eps / 127
    return out


@pdlkit.reference("quantize_per_token", examples=_per_token_examples)
def quantize_per_token(x, eps, qmax):
    return per_token(x, eps, qmax)


def _int8_examples(dtype: torch.dtype, gated: bool = False) -> list[tuple]:
    g = torch.Generator().manual_seed(0)
    out = []
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


@pdlkit.reference("int8_linear", examples=_int8_examples)
def int8_linear(q, x_scale, w, w_scale, bias, dtype):
    y = (q.to(torch.int32) @ w.to(torch.int32).T).to(torch.float32) * x_scale * w_scale
    if bias is not None:
        y = y + bias
    return y.to(dtype_from_code(dtype))


@pdlkit.reference("int8_gated_silu", examples=lambda dtype: _int8_examples(dtype, gated=True))
def int8_gated_silu(q, x_scale, wg, sg, wu, su, dtype, shape):
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


@pdlkit.reference("qlinear_pt", examples=lambda dtype: _qlinear_pt_examples(dtype, False))
def qlinear_pt(x_q, x_scale, x_zp, w_q, w_scale, w_zp, bias, post_op, algorithm):
    x = _qd().dequantize_per_tensor(x_q, x_scale, x_zp, *_x_range(x_q))
    return _qlinear_pt_ref(x, w_q, w_scale, w_zp, bias, post_op, algorithm)


@pdlkit.reference("qlinear_q_pt", examples=lambda dtype: _qlinear_pt_examples(dtype, True))
def qlinear_q_pt(
    x_q, x_scale, x_zp, w_q, w_scale, w_zp, bias, out_scale, out_zp, out_qmin, out_qmax,
    post_op, algorithm,
):  # fmt: skip
    y = qlinear_pt(x_q, x_scale, x_zp, w_q, w_scale, w_zp, bias, post_op, algorithm)
    dtype = quantized_dtype(out_qmin)
    return _qd().quantize_per_tensor(y, out_scale, out_zp, out_qmin, out_qmax, dtype)


def _qlinear_dynamic_pt_examples(dtype: torch.dtype) -> list[tuple]:
    out = []
    for x_q, xs, xzp, *rest in _qlinear_pt_examples(dtype, False):
        out.append((x_q, torch.tensor([xs], dtype=torch.float64), torch.tensor([xzp]), *rest))
    return out


@pdlkit.reference("qlinear_dynamic_pt", examples=_qlinear_dynamic_pt_examples)
def qlinear_dynamic_pt(x_q, x_scale, x_zp, w_q, w_scale, w_zp, bias, post_op, algorithm):
    x = _qd().dequantize_per_tensor.tensor(x_q, x_scale, x_zp, *_x_range(x_q))
    return _qlinear_pt_ref(x, w_q, w_scale, w_zp, bias, post_op, algorithm)

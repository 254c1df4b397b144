"""The int8 convolution ops (``qconv``, ``qconv_q``, ``qconv_add_q``)
that ``patterns/x86/qconv.pdl.mlir`` calls: the PT2E chain itself, dequantize ->
``conv2d`` [-> + dequantized residual] [-> ReLU] [-> quantize]. Examples cover 1x1 and 3x3
kernels, stride 2, dilation 2, grouped and depthwise convolutions, a batch of one and odd
sizes."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from pdlkit.runtime_abi.dtypes import quantized_dtype
from torch import Tensor

import pdlkit

# (N, C, H, W, O, kernel, stride, padding, dilation, groups)
_SHAPES = [
    (1, 3, 9, 7, 8, 3, 1, 1, 1, 1),
    (2, 16, 8, 8, 16, 1, 1, 0, 1, 1),
    (1, 8, 11, 11, 12, 3, 2, 1, 1, 1),
    (2, 8, 10, 10, 8, 3, 1, 2, 2, 1),
    (1, 8, 6, 6, 16, 3, 1, 1, 1, 4),
    (1, 8, 7, 7, 8, 3, 1, 1, 1, 8),
]


def conv_shape(x_q: Tensor, w_q: Tensor, stride: Any, padding: Any, dilation: Any) -> list[Any]:
    """[N, O, H', W'] of a convolution of [N, C, H, W] by [O, C / groups, kH, kW]."""
    out = [x_q.shape[0], w_q.shape[0]]
    for i in range(2):
        k = dilation[i] * (w_q.shape[2 + i] - 1) + 1
        out.append((x_q.shape[2 + i] + 2 * padding[i] - k) // stride[i] + 1)
    return out


def _meta(x_q: Tensor, x_scale: Any, x_zp: Any, w_q: Tensor, w_scale: Any, w_zp: Any, bias: Any,
          stride: Any, padding: Any, dilation: Any, groups: int, *rest: Any) -> Tensor:  # fmt: skip
    """float32 (``qconv``: ``rest`` is ``(post_op,)``) or uint8 / int8 by ``out_qmin`` (the
    third argument from the end)."""
    dtype = torch.float32 if len(rest) == 1 else quantized_dtype(rest[-3])
    return x_q.new_empty(conv_shape(x_q, w_q, stride, padding, dilation), dtype=dtype)


def _qd():  # quantized_decomposed ops are registered by torch's PT2E helpers
    import torch.ao.quantization.fx._decomposed  # noqa: F401

    return torch.ops.quantized_decomposed


def _conv(x_q, x_scale, x_zp, w_q, w_scale, w_zp, bias, stride, padding, dilation, groups):
    qd = _qd()
    x = qd.dequantize_per_tensor(x_q, x_scale, x_zp, 0, 255, torch.uint8)
    w = qd.dequantize_per_channel(w_q, w_scale, w_zp, 0, -128, 127, torch.int8)
    return F.conv2d(x, w, bias, stride, padding, dilation, groups)


def _act(y, post_op):
    return torch.relu(y) if post_op == "relu" else y


def _examples(dtype: torch.dtype, quantized: bool, residual: bool = False) -> list[tuple]:
    g = torch.Generator().manual_seed(0)
    out = []
    for i, (n, c, h, w, o, k, s, p, d, groups) in enumerate(_SHAPES):
        x_q = torch.randint(0, 256, (n, c, h, w), generator=g, dtype=torch.uint8)
        w_q = torch.randint(-127, 128, (o, c // groups, k, k), generator=g, dtype=torch.int8)
        w_scale = torch.rand(o, generator=g) * 0.01 + 0.001
        bias = torch.randn(o, generator=g) if i % 2 == 0 else None
        conv: tuple[Any, ...] = (x_q, 0.02, 120, w_q, w_scale, torch.zeros(o, dtype=torch.int64),
                                 bias, [s, s], [p, p], [d, d], groups)  # fmt: skip
        if residual:
            ho = (h + 2 * p - d * (k - 1) - 1) // s + 1
            wo = (w + 2 * p - d * (k - 1) - 1) // s + 1
            r_q = torch.randint(0, 256, (n, o, ho, wo), generator=g, dtype=torch.uint8)
            conv = (*conv, r_q, 0.05, 128)
        out_q = (0.1, 3, 0, 255) if quantized else ()
        for post in ("none", "relu"):
            out.append((*conv, *out_q, post))
    return out


@pdlkit.op(meta=_meta, examples=lambda dtype: _examples(dtype, False))
def qconv(
    x_q: Tensor, x_scale: float, x_zp: int, w_q: Tensor, w_scale: Tensor, w_zp: Tensor,
    bias: Tensor | None, stride: list[int], padding: list[int], dilation: list[int], groups: int,
    post_op: str,
) -> Tensor:  # fmt: skip
    conv = _conv(x_q, x_scale, x_zp, w_q, w_scale, w_zp, bias, stride, padding, dilation, groups)
    return _act(conv, post_op)


@pdlkit.op(meta=_meta, examples=lambda dtype: _examples(dtype, True))
def qconv_q(
    x_q: Tensor, x_scale: float, x_zp: int, w_q: Tensor, w_scale: Tensor, w_zp: Tensor,
    bias: Tensor | None, stride: list[int], padding: list[int], dilation: list[int], groups: int,
    out_scale: float, out_zp: int, out_qmin: int, out_qmax: int, post_op: str,
) -> Tensor:  # fmt: skip
    conv = _conv(x_q, x_scale, x_zp, w_q, w_scale, w_zp, bias, stride, padding, dilation, groups)
    dtype = torch.uint8 if out_qmin >= 0 else torch.int8
    y = _act(conv, post_op)
    return _qd().quantize_per_tensor(y, out_scale, out_zp, out_qmin, out_qmax, dtype)


@pdlkit.op(meta=_meta, examples=lambda dtype: _examples(dtype, True, residual=True))
def qconv_add_q(
    x_q: Tensor, x_scale: float, x_zp: int, w_q: Tensor, w_scale: Tensor, w_zp: Tensor,
    bias: Tensor | None, stride: list[int], padding: list[int], dilation: list[int], groups: int,
    accum_q: Tensor, accum_scale: float, accum_zp: int, out_scale: float, out_zp: int,
    out_qmin: int, out_qmax: int, post_op: str,
) -> Tensor:  # fmt: skip
    conv = _conv(x_q, x_scale, x_zp, w_q, w_scale, w_zp, bias, stride, padding, dilation, groups)
    residual = _qd().dequantize_per_tensor(accum_q, accum_scale, accum_zp, 0, 255, torch.uint8)
    y = _act(conv + residual, post_op)
    return _qd().quantize_per_tensor(y, out_scale, out_zp, out_qmin, out_qmax, torch.uint8)

"""int8 2-D convolution for PT2E graphs on x86, through oneDNN (``torch.ops.onednn``).

The patterns of ``patterns/x86/qconv.pdl.mlir`` replace ``dequantize_per_tensor(x)``,
``dequantize_per_channel(w)`` -> ``conv2d`` [-> ``relu``] [-> ``quantize_per_tensor``] (what
X86InductorQuantizer makes of a CNN's convolutions, batch norms folded in) by one call:
the u8 x s8 convolution, the dequantization by the activation and per-channel weight scales,
the bias, ReLU and, for ``qconv_q``, the requantization to uint8 / int8. Weights are packed
once into oneDNN's blocked layout through the pre-pack cache (the packing reads the weight
scales and the activation's quantization, hence ``prepack_with``). Outputs are channels-last,
as oneDNN writes them and as the next convolution reads them best; PyTorch's own int8 path
(Inductor with freezing) calls the same oneDNN primitive.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from pdlkit.runtime_abi.dtypes import quantized_dtype
from torch import Tensor

import pdlkit

_POST_OPS = ("none", "relu")


def _out_shape(x_q: Tensor, w_q: Tensor, stride: Sequence[int], padding: Sequence[int],
               dilation: Sequence[int]) -> list[Any]:  # fmt: skip
    """[N, O, H', W'] of a convolution of [N, C, H, W] by [O, C / groups, kH, kW]."""
    out = [x_q.shape[0], w_q.shape[0]]
    for i in range(2):
        k = dilation[i] * (w_q.shape[2 + i] - 1) + 1
        out.append((x_q.shape[2 + i] + 2 * padding[i] - k) // stride[i] + 1)
    return out


def _meta(x_q: Tensor, x_scale: Any, x_zp: Any, w_q: Tensor, w_scale: Any, w_zp: Any,
          bias: Any, stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int],
          groups: int, *rest: Any) -> Tensor:  # fmt: skip
    """float32 (``qconv``) or uint8 / int8 (``qconv_q``: ``rest`` starts with out_scale,
    out_zp, out_qmin), channels-last."""
    dtype = torch.float32 if len(rest) == 1 else quantized_dtype(rest[2])
    return _channels_last(x_q, _out_shape(x_q, w_q, stride, padding, dilation), dtype)


def _channels_last(x_q: Tensor, shape: list[Any], dtype: torch.dtype) -> Tensor:
    """An empty [N, C, H, W] tensor in channels-last strides, written out: asking torch to
    make one checks sizes, and such checks on symbolic sizes would become shape guards."""
    n, c, h, w = shape
    return x_q.new_empty_strided(shape, (h * w * c, 1, w * c, c), dtype=dtype)


def _pack(w_q: Tensor, attrs: Mapping[str, Any]) -> Tensor:
    return torch.ops.onednn.qconv_prepack(
        w_q,
        attrs["w_scale"],
        attrs["x_scale"],
        attrs["x_zp"],
        attrs["stride"],
        attrs["padding"],
        attrs["dilation"],
        attrs["groups"],
        None,
    )


_ONEDNN: dict[str, Any] = {
    "device": "cpu",
    "dtypes": {"x_q": [torch.uint8], "w_q": [torch.int8]},
    "shapes": {"x_q": {"rank": 4}, "w_q": {"rank": 4}},
    "requires": ["avx512_vnni"],
    "prepack": _pack,
    "prepack_arg": "w_q",
    "prepack_with": ("w_scale",),
    "traits": ["deterministic"],
}


def _check(post_op: str, padding: Sequence[int]) -> None:
    if post_op not in _POST_OPS:
        raise pdlkit.KernelUnsupported(f"post op {post_op!r}")
    if len(padding) != 2:
        raise pdlkit.KernelUnsupported(f"padding {list(padding)}")


@pdlkit.kernel(implements="qconv_q", meta=_meta, **_ONEDNN)
def qconv_q_onednn(
    x_q, x_scale, x_zp, w_q, w_scale, w_zp, bias, stride, padding, dilation, groups, out_scale,
    out_zp, out_qmin, out_qmax, post_op,
) -> Tensor:  # fmt: skip
    """quantize(act(conv2d(dequantize(x_q), dequantize(w_q), bias))) in one oneDNN call;
    w_q arrives packed."""
    _check(post_op, padding)
    if (out_qmin, out_qmax) not in ((0, 255), (-128, 127)):
        raise pdlkit.KernelUnsupported(f"output range [{out_qmin}, {out_qmax}]")
    dtype = quantized_dtype(out_qmin)
    return torch.ops.onednn.qconv_pointwise(
        x_q, x_scale, x_zp, w_q, w_scale, w_zp, bias, stride, padding, dilation, groups,
        out_scale, out_zp, dtype, post_op, [], "",
    )  # fmt: skip


@pdlkit.kernel(implements="qconv", meta=_meta, **_ONEDNN)
def qconv_onednn(
    x_q, x_scale, x_zp, w_q, w_scale, w_zp, bias, stride, padding, dilation, groups, post_op
) -> Tensor:
    """act(conv2d(dequantize(x_q), dequantize(w_q), bias)) in float32, in one oneDNN call."""
    _check(post_op, padding)
    return torch.ops.onednn.qconv_pointwise(
        x_q, x_scale, x_zp, w_q, w_scale, w_zp, bias, stride, padding, dilation, groups,
        1.0, 0, torch.float32, post_op, [], "",
    )  # fmt: skip


def _add_meta(x_q: Tensor, x_scale: Any, x_zp: Any, w_q: Tensor, w_scale: Any, w_zp: Any,
              bias: Any, stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int],
              groups: int, accum_q: Tensor, accum_scale: Any, accum_zp: Any, out_scale: Any,
              out_zp: Any, out_qmin: int, *rest: Any) -> Tensor:  # fmt: skip
    """uint8 / int8 by ``out_qmin``, the convolution's shape, channels-last."""
    dtype = quantized_dtype(out_qmin)
    return _channels_last(x_q, _out_shape(x_q, w_q, stride, padding, dilation), dtype)


@pdlkit.kernel(implements="qconv_add_q", meta=_add_meta, **_ONEDNN)
def qconv_add_q_onednn(
    x_q, x_scale, x_zp, w_q, w_scale, w_zp, bias, stride, padding, dilation, groups, accum_q,
    accum_scale, accum_zp, out_scale, out_zp, out_qmin, out_qmax, post_op,
) -> Tensor:  # fmt: skip
    """quantize(act(conv2d(dequantize(x_q), dequantize(w_q), bias) + dequantize(accum_q)))
    in one oneDNN call (its "sum" post op). oneDNN sums into the residual's codes in place,
    so they are copied first: other readers of the residual keep theirs."""
    _check(post_op, padding)
    if (out_qmin, out_qmax) != (0, 255) or accum_q.dtype != torch.uint8:
        raise pdlkit.KernelUnsupported(
            f"output range [{out_qmin}, {out_qmax}], {accum_q.dtype} residual"
        )
    accum = accum_q.clone(memory_format=torch.channels_last)
    return torch.ops.onednn.qconv2d_pointwise.binary(
        x_q, x_scale, x_zp, w_q, w_scale, w_zp, accum, bias, stride, padding, dilation, groups,
        out_scale, out_zp, torch.uint8, accum_scale, accum_zp, "sum", 1.0, post_op, [], "",
    )  # fmt: skip

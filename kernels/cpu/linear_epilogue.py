"""Linear with a fused activation epilogue, for CPU.

The GEMM is one BLAS call (``torch.addmm``: oneDNN / MKL) and the activation then runs in
place on its output with ATen's vectorized kernel: no second output tensor is allocated
and the activation reads the GEMM result while it is still in cache. Measured on one
thread, [512, 256] x [256, 1024]: 3.39 ms against 3.61 ms for eager linear + gelu.
linear and linear_relu declare a backward, so they are also substituted in training graphs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

import pdlkit

_FLOATS = [torch.float32, torch.bfloat16]


def _linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    if x.dtype != weight.dtype or (bias is not None and bias.dtype != x.dtype):
        raise pdlkit.KernelUnsupported("mixed dtypes")
    x2 = x.reshape(-1, x.shape[-1])
    return torch.addmm(bias, x2, weight.t()) if bias is not None else x2 @ weight.t()


# -- gradients: linear and linear_relu may run in graphs that train -----------------------------


def _save_inputs(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    x, weight, bias = inputs[:3]
    ctx.has_bias = bias is not None
    ctx.save_for_backward(x, weight)


def _save_inputs_and_output(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    x, weight, bias = inputs[:3]
    ctx.has_bias = bias is not None
    ctx.save_for_backward(x, weight, output)


def _linear_grads(ctx: Any, g: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """Gradients of x @ weight.T + bias for the gradient ``g`` at its output."""
    x, weight = ctx.saved_tensors[:2]
    g2, x2 = g.reshape(-1, g.shape[-1]), x.reshape(-1, x.shape[-1])
    need = ctx.needs_input_grad
    gx = (g2 @ weight).reshape(x.shape) if need[0] else None
    gw = g2.t() @ x2 if need[1] else None
    gb = g2.sum(0) if ctx.has_bias and need[2] else None
    return gx, gw, gb


def _linear_backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
    return _linear_grads(ctx, grad)


def _linear_relu_backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
    out = ctx.saved_tensors[2]
    return _linear_grads(ctx, grad * (out > 0))  # relu passes the gradient where it was positive


_LINEAR_GRAD = {"backward": _linear_backward, "setup_context": _save_inputs}
_RELU_GRAD = {"backward": _linear_relu_backward, "setup_context": _save_inputs_and_output}


@pdlkit.kernel(implements="linear_gelu", device="cpu", dtypes={"x": _FLOATS, "weight": _FLOATS})
def linear_gelu_addmm(x: Tensor, weight: Tensor, bias: Tensor | None, approximate: str) -> Tensor:
    """gelu(x @ weight.T + bias, approximate): addmm, then GELU in place on its output."""
    if approximate not in ("none", "tanh"):
        raise pdlkit.KernelUnsupported(f"approximate={approximate!r}")
    out = torch.ops.aten.gelu_(_linear(x, weight, bias), approximate=approximate)
    return out.reshape(*x.shape[:-1], weight.shape[0])


@pdlkit.kernel(
    implements="linear_relu",
    device="cpu",
    dtypes={"x": _FLOATS, "weight": _FLOATS},
    **_RELU_GRAD,
)
def linear_relu_addmm(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """relu(x @ weight.T + bias): addmm, then ReLU in place on its output."""
    return _linear(x, weight, bias).relu_().reshape(*x.shape[:-1], weight.shape[0])


# -- oneDNN with a pre-packed weight: preferred where torch has mkldnn -------------------------
# The weight is reordered once into oneDNN's blocked layout (pre-pack cache) and the
# activation runs as a oneDNN post-op inside the GEMM. One thread, [512, 256] x [256, 1024]:
# bf16 0.70 ms against 0.89 ms for addmm; bf16 + GELU 0.93 ms against 1.38 ms for
# addmm + gelu_; fp32 2.65 ms against 3.06 ms.


def _pack(weight: Tensor, attrs: object) -> Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight, None)


def _onednn(x: Tensor, packed: Tensor, bias: Tensor | None, post: str, algorithm: str) -> Tensor:
    if bias is not None and bias.dtype != x.dtype:
        raise pdlkit.KernelUnsupported("bias dtype differs from the input's")
    x2 = x.reshape(-1, x.shape[-1])
    y = torch.ops.mkldnn._linear_pointwise(x2, packed, bias, post, [], algorithm)
    return y.reshape(*x.shape[:-1], y.shape[-1])


# oneDNN's BF16 matmul needs avx512bw/vl/dq or avx_ne_convert (an AVX2-only CPU such as an AMD
# EPYC 7003 lacks both: the weight's reorder raises there); torch's own check says which,
# so on such a host these kernels take FP32 only and BF16 sites keep Inductor's code.
_ONEDNN_FLOATS = _FLOATS if torch.ops.mkldnn._is_mkldnn_bf16_supported() else [torch.float32]

if torch.backends.mkldnn.is_available():
    _PACKED = {"prepack": _pack, "prepack_arg": "weight", "priority": 1, "device": "cpu"}

    @pdlkit.kernel(
        implements="linear_gelu", dtypes={"x": _ONEDNN_FLOATS, "weight": _ONEDNN_FLOATS}, **_PACKED
    )
    def linear_gelu_onednn(
        x: Tensor, weight: Tensor, bias: Tensor | None, approximate: str
    ) -> Tensor:
        """gelu(x @ weight.T + bias) as one oneDNN matmul with a GELU post-op; weight pre-packed."""
        if approximate not in ("none", "tanh") or x.dtype != weight.dtype:
            raise pdlkit.KernelUnsupported(
                f"approximate={approximate!r}, {x.dtype} x {weight.dtype}"
            )
        return _onednn(x, weight, bias, "gelu", approximate)

    @pdlkit.kernel(
        implements="linear_relu",
        dtypes={"x": _ONEDNN_FLOATS, "weight": _ONEDNN_FLOATS},
        **_PACKED,
        **_RELU_GRAD,
    )
    def linear_relu_onednn(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        """relu(x @ weight.T + bias) as one oneDNN matmul with a ReLU post-op; weight pre-packed."""
        if x.dtype != weight.dtype:
            raise pdlkit.KernelUnsupported(f"{x.dtype} x {weight.dtype}")
        return _onednn(x, weight, bias, "relu", "")

    @pdlkit.kernel(
        implements="linear",
        dtypes={"x": _ONEDNN_FLOATS, "weight": _ONEDNN_FLOATS},
        **_PACKED,
        **_LINEAR_GRAD,
    )
    def linear_onednn(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        """x @ weight.T + bias as one oneDNN matmul; weight pre-packed."""
        if x.dtype != weight.dtype:
            raise pdlkit.KernelUnsupported(f"{x.dtype} x {weight.dtype}")
        return _onednn(x, weight, bias, "none", "")

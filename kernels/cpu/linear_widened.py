"""BF16 linears computed in FP32, for CPUs where torch has no fast BF16 GEMM.

    before: a BF16 model on a CPU whose oneDNN has no BF16 matmul (no avx512bw/vl/dq and no
            avx_ne_convert: an AVX2-only AMD EPYC): ATen's BF16 GEMM, which Inductor's code
            calls too, took 16.7 ms for [512, 256] x [256, 1024] on 2 threads
    after:  the weight widened to FP32 once (its pre-pack), the activations per call, one FP32
            GEMM (``torch.addmm``: MKL), the activation in place on the FP32 result, one
            rounding to BF16 at the end: 1.8 ms (13.1 -> 2.2 ms for [512, 1024] x [1024, 256])

The sums are FP32 either way; the result differs from ATen's BF16 GEMM by its last bit at most.
The widened weight costs twice the BF16 weight's memory (the pre-pack cache holds it, within
its bound). Declared only where ``torch.ops.mkldnn._is_mkldnn_bf16_supported()`` is false:
elsewhere oneDNN's and the AMX kernels (``linear_epilogue.py``, ``kernels/x86``) compute BF16
natively, and measured choice weighs them against Inductor's code.
"""

from __future__ import annotations

import torch
from torch import Tensor

import pdlkit


def _widen(weight: Tensor, attrs: object) -> Tensor:
    return weight.to(torch.float32).contiguous()


def _gemm(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """x @ weight.T + bias in FP32 (``weight``: widened, or BF16 in a call that bypassed the
    pre-pack), as a 2-D FP32 tensor."""
    if x.dtype != torch.bfloat16 or (bias is not None and bias.dtype != torch.bfloat16):
        raise pdlkit.KernelUnsupported(f"{x.dtype} input, bias {getattr(bias, 'dtype', None)}")
    x2 = x.reshape(-1, x.shape[-1]).to(torch.float32)
    w = weight.to(torch.float32)
    if bias is None:
        return x2 @ w.t()
    return torch.addmm(bias.to(torch.float32), x2, w.t())


def _bf16(y: Tensor, x: Tensor) -> Tensor:
    return y.to(torch.bfloat16).reshape(*x.shape[:-1], y.shape[-1])


if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
    _WIDENED = {
        "device": "cpu",
        "dtypes": {"x": [torch.bfloat16], "weight": [torch.bfloat16]},
        "prepack": _widen,
        "prepack_arg": "weight",
        "priority": 2,  # ahead of linear_epilogue.py's BF16 addmm kernels, which ATen runs slowly
    }

    @pdlkit.kernel(implements="linear", **_WIDENED)
    def linear_bf16_widened(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        """x @ weight.T + bias for BF16 x and weight: one FP32 GEMM, rounded to BF16 once."""
        return _bf16(_gemm(x, weight, bias), x)

    @pdlkit.kernel(implements="linear_relu", **_WIDENED)
    def linear_relu_bf16_widened(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        """relu(x @ weight.T + bias) for BF16 x and weight: one FP32 GEMM, ReLU in place."""
        return _bf16(_gemm(x, weight, bias).relu_(), x)

    @pdlkit.kernel(implements="linear_gelu", **_WIDENED)
    def linear_gelu_bf16_widened(
        x: Tensor, weight: Tensor, bias: Tensor | None, approximate: str
    ) -> Tensor:
        """gelu(x @ weight.T + bias) for BF16 x and weight: one FP32 GEMM, GELU in place on
        the FP32 result (ATen's BF16 GELU also computes in FP32), one rounding."""
        if approximate not in ("none", "tanh"):
            raise pdlkit.KernelUnsupported(f"approximate={approximate!r}")
        y = torch.ops.aten.gelu_(_gemm(x, weight, bias), approximate=approximate)
        return _bf16(y, x)

"""BF16 / FP16 linear (+ ReLU / GELU epilogue) as one Triton GEMM: opt-in.

Not loaded by default: on an H100 it ran at 0.78-0.88x of cuBLAS (benchmarks/cuda_gemm.py,
results in benchmarks/results/cuda_gemm.md), so Inductor's cuBLAS call with a fused epilogue
is faster for BF16 models. Load it to try it on other GPUs or shapes:

    PDLKIT_KERNEL_PATH=@shipped:$(python -c "import pdlkit.kernels, os; print(os.path.dirname(pdlkit.kernels.__file__))")/_optin
"""

from __future__ import annotations

from typing import Any

import torch
from pdlkit.kernels.cuda._common import _ON, _triton
from torch import Tensor

import pdlkit


def _bf16_linear(x: Tensor, weight: Tensor, bias: Tensor | None, act: str) -> Tensor:
    if not weight.is_contiguous():
        raise pdlkit.KernelUnsupported("weight is not contiguous")
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty((x2.shape[0], weight.shape[0]), dtype=x.dtype, device=x.device)
    _triton().gemm(x2, weight, out, bias=bias, act=act)
    return out.reshape(*x.shape[:-1], weight.shape[0])


_HALF = [torch.bfloat16, torch.float16]
_HALF_KW: dict[str, Any] = {
    "dtypes": {"x": _HALF, "weight": _HALF},
    "shapes": {"weight": {"rank": 2}},
    "traits": ["deterministic"],  # not covered by a capture test
    **_ON,
}


@pdlkit.kernel(implements="linear", **_HALF_KW)
def linear_triton(x, weight, bias) -> Tensor:
    """x @ weight.T + bias, fp32 accumulation, one rounding to the input dtype."""
    return _bf16_linear(x, weight, bias, "none")


@pdlkit.kernel(implements="linear_relu", **_HALF_KW)
def linear_relu_triton(x, weight, bias) -> Tensor:
    """relu(x @ weight.T + bias) with the ReLU in the GEMM's epilogue."""
    return _bf16_linear(x, weight, bias, "relu")


@pdlkit.kernel(implements="linear_gelu", **_HALF_KW)
def linear_gelu_triton(x, weight, bias, approximate) -> Tensor:
    """gelu(x @ weight.T + bias), erf or tanh, in the GEMM's epilogue."""
    return _bf16_linear(x, weight, bias, "gelu_tanh" if approximate == "tanh" else "gelu")

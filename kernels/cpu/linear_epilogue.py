"""Linear with a fused activation epilogue, for CPU float32.

The GEMM is one BLAS call (``torch.addmm``: oneDNN / MKL); the activation runs in place on
its output in one numba pass, instead of a second kernel reading and writing a new tensor.
"""

from __future__ import annotations

import math

import numba
import numpy as np
import torch
from torch import Tensor

import pdlkit

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


@numba.njit(cache=True, fastmath=False, nogil=True)
def _gelu_erf_inplace(a: np.ndarray) -> None:
    for i in range(a.size):
        v = a.flat[i]
        a.flat[i] = 0.5 * v * (1.0 + math.erf(v * 0.7071067811865476))


@numba.njit(cache=True, fastmath=False, nogil=True)
def _gelu_tanh_inplace(a: np.ndarray) -> None:
    for i in range(a.size):
        v = a.flat[i]
        a.flat[i] = 0.5 * v * (1.0 + math.tanh(_SQRT_2_OVER_PI * (v + 0.044715 * v * v * v)))


def _linear_out(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    x2 = x.reshape(-1, x.shape[-1])
    out = torch.addmm(bias, x2, weight.t()) if bias is not None else x2 @ weight.t()
    return out


def _meta(x: Tensor, weight: Tensor, bias: Tensor | None, *rest: object) -> Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@pdlkit.kernel(
    op="linear_gelu",
    device="cpu",
    dtypes={"x": [torch.float32], "weight": [torch.float32], "bias": [torch.float32]},
    meta=_meta,
)
def linear_gelu_numba(x: Tensor, weight: Tensor, bias: Tensor | None, approximate: str) -> Tensor:
    """gelu(x @ weight.T + bias) with the GELU applied in place by numba."""
    if approximate not in ("none", "tanh"):
        raise pdlkit.KernelUnsupported(f"approximate={approximate!r}")
    out = _linear_out(x, weight, bias)
    a = out.numpy()
    (_gelu_erf_inplace if approximate == "none" else _gelu_tanh_inplace)(a.reshape(-1))
    return out.reshape(*x.shape[:-1], weight.shape[0])


@pdlkit.kernel(
    op="linear_relu",
    device="cpu",
    dtypes={"x": [torch.float32, torch.bfloat16], "weight": [torch.float32, torch.bfloat16]},
    meta=_meta,
)
def linear_relu_addmm(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """relu(x @ weight.T + bias): one addmm, then ReLU in place on its output."""
    if x.dtype != weight.dtype or (bias is not None and bias.dtype != x.dtype):
        raise pdlkit.KernelUnsupported("mixed dtypes")
    return _linear_out(x, weight, bias).relu_().reshape(*x.shape[:-1], weight.shape[0])

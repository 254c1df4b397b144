"""Reference semantics and example inputs of the shipped logical ops (for ``pdlkit abi-check``).

Each op's examples spread shapes over edge sizes: M = 1, K not a multiple of 4 or 16,
odd N, 3-D activations.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

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

"""Accuracy measures for a quantized model's outputs against a reference (usually FP32)."""

from __future__ import annotations

import torch


def _flat64(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}")
    # float64: the sums of a large activation tensor lose digits in float32 / bfloat16.
    return a.detach().reshape(-1).double(), b.detach().reshape(-1).double()


def cosine_similarity(a: torch.Tensor, b: torch.Tensor) -> float:
    """Cosine similarity of ``a`` and ``b`` flattened, in float64 (1.0 = same direction).

    Two all-zero tensors count as identical (1.0); one all-zero tensor against another gives 0.0.
    """
    x, y = _flat64(a, b)
    nx, ny = x.norm(), y.norm()
    if nx == 0 or ny == 0:
        return 1.0 if nx == ny else 0.0
    return float(torch.dot(x, y) / (nx * ny))


def max_abs_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest elementwise ``|a - b|``, in float64 (0.0 for empty tensors)."""
    x, y = _flat64(a, b)
    if x.numel() == 0:
        return 0.0
    return float((x - y).abs().max())

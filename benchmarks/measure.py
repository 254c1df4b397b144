"""Small measuring helpers shared by the model benchmarks (x86_bert.py, x86_models.py)."""

from __future__ import annotations

import statistics
from typing import Any

import torch


def last_hidden(out: Any) -> torch.Tensor:
    """A model's main output: the tensor itself, or the first field of a ModelOutput / tuple
    (``last_hidden_state`` for transformers' base models)."""
    if isinstance(out, torch.Tensor):
        return out
    return out[0]


def p10(values: list[float]) -> float:
    """10th percentile: the latency when no other job shared the core."""
    if len(values) < 10:
        return min(values)
    return statistics.quantiles(values, n=10)[0]

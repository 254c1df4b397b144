"""Output shapes and dtypes of the int8 linear ops that the PT2E patterns call.

The ops are `qlinear`, `qlinear_dynamic`, `qlinear_q`, `qlinear_add`,
`qlinear_add_layer_norm[_q]` and the per-tensor `_pt` variants. Their output depends on the
op, not on the kernel, so every target's kernel files (x86, aarch64, cuda) use these functions
as ``meta=`` instead of each keeping its own copy. Every op takes ``(x_q, x_scale, x_zp, w_q,
...)``. qlinear_q's requantized output range starts at its 10th argument, ``out_qmin``, which
selects uint8 or int8.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def quantized_dtype(qmin: int) -> torch.dtype:
    """The integer dtype of a quantized output whose range starts at ``qmin``."""
    return torch.uint8 if qmin >= 0 else torch.int8


def qlinear_meta(x_q: Tensor, x_scale: Any, x_zp: Any, w_q: Tensor, *rest: Any) -> Tensor:
    """float32 [..., N] for activations [..., K] and weights [N, K]."""
    return x_q.new_empty((*x_q.shape[:-1], w_q.shape[0]), dtype=torch.float32)


def qlinear_q_meta(
    x_q: Tensor,
    x_scale: Any,
    x_zp: Any,
    w_q: Tensor,
    w_scale: Any,
    w_zp: Any,
    bias: Any,
    out_scale: Any,
    out_zp: Any,
    out_qmin: int,
    *rest: Any,
) -> Tensor:
    """uint8 or int8 [..., N]: the output range ``[out_qmin, out_qmax]`` selects which."""
    return x_q.new_empty((*x_q.shape[:-1], w_q.shape[0]), dtype=quantized_dtype(out_qmin))


def qlinear_add_layer_norm_q_meta(
    x_q: Tensor, x_scale: Any, x_zp: Any, w_q: Tensor, *rest: Any
) -> tuple[Tensor, Tensor]:
    """float32 [..., N] (the LayerNorm's result) and its uint8 or int8 codes: ``rest[-2]`` is
    ``out_qmin``."""
    shape = (*x_q.shape[:-1], w_q.shape[0])
    codes = x_q.new_empty(shape, dtype=quantized_dtype(rest[-2]))
    return x_q.new_empty(shape, dtype=torch.float32), codes


def qkv_attention_q_merged_meta(
    x_q: Tensor, x_scale: Any, x_zp: Any, wq: Tensor, *rest: Any
) -> Tensor:
    """uint8 or int8 [B, S, H * D] for activations [B, S, K] and weights [H * D, K]: the
    heads merged back as the output projection reads them; ``rest[-2]`` is ``out_qmin``."""
    return x_q.new_empty((*x_q.shape[:-1], wq.shape[0]), dtype=quantized_dtype(rest[-2]))

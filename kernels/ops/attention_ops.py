"""The float attention op (``attention``) that ``patterns/cuda/attention.pdl.mlir`` calls:
``aten.scaled_dot_product_attention`` itself, grouped-query attention included
(``enable_gqa``), dropout 0. The quantized x86 attention ops (``attention_q``, ...) are in
``logical_ops.py``.

Examples cover what a decode step gives (one query token per sequence over a cache), GQA
groups of 1, 2 and 4 query heads per key/value head, bool and float masks broadcast over heads
(stride 0) or per head, a fully masked row, odd cache lengths and head dims, a query that is a
head view of a [B, S, H * D] activation, and prefill shapes (a decode kernel declines those).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

import pdlkit


def _attention_meta(q: Tensor, k: Tensor, v: Tensor, *rest: Any) -> Tensor:
    """[B, Hq, Sq, Dv] in the query's dtype, contiguous."""
    return q.new_empty((*q.shape[:-1], v.shape[-1]))


# B, Hq, Hkv, Sq, L, D, mask, gqa
_CASES = [
    (1, 1, 1, 1, 1, 16, "none", False),
    (3, 8, 2, 1, 33, 32, "none", True),
    (2, 4, 4, 1, 70, 16, "bool", False),
    (2, 6, 3, 1, 19, 24, "float_heads", True),
    (1, 8, 8, 1, 9, 64, "float_masked_row", False),
    (2, 4, 2, 5, 12, 16, "none", True),  # prefill: five query tokens
]


def _mask(kind: str, b: int, h: int, sq: int, length: int, g: torch.Generator) -> Tensor | None:
    if kind == "bool":  # a padding mask over the cache, shared by the heads (stride 0)
        m = torch.rand(b, 1, sq, length, generator=g) > 0.3
        m[..., 0] = True
        return m
    if kind == "float_heads":  # an additive bias of its own for every head
        return torch.randn(b, h, sq, length, generator=g)
    if kind == "float_masked_row":  # every position masked: zeros, as torch gives
        m = torch.zeros(b, 1, sq, length)
        m[..., length // 2 :] = float("-inf")
        m[0] = float("-inf")
        return m
    return None


def _attention_examples(dtype: torch.dtype) -> list[tuple]:
    g = torch.Generator().manual_seed(0)
    dtype = dtype if dtype.is_floating_point else torch.float32
    out = []
    for b, hq, hkv, sq, length, d, mask, gqa in _CASES:
        # the query as transformers makes it: [B, S, Hq * D] viewed as heads, then transposed
        q = torch.randn(b, sq, hq * d, generator=g).view(b, sq, hq, d).transpose(1, 2)
        k, v = (torch.randn(b, hkv, length, d, generator=g) for _ in range(2))
        m = _mask(mask, b, hq, sq, length, g)
        m = m if m is None or m.dtype == torch.bool else m.to(dtype)
        out.append((q.to(dtype), k.to(dtype), v.to(dtype), m, 0, d**-0.5, int(gqa)))
    return out


@pdlkit.op(meta=_attention_meta, examples=_attention_examples)
def attention(
    q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, is_causal: int, scale: float,
    enable_gqa: int,
) -> Tensor:  # fmt: skip
    """``scaled_dot_product_attention(q, k, v, attn_mask, 0.0, is_causal, scale, enable_gqa)``
    for q [B, Hq, Sq, D], k [B, Hkv, L, D], v [B, Hkv, L, Dv]; ``scale <= 0`` means None
    (``1 / sqrt(D)``). The result is contiguous."""
    y = F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, is_causal=bool(is_causal),
        scale=scale if scale > 0 else None, enable_gqa=bool(enable_gqa),
    )  # fmt: skip
    return y.contiguous()

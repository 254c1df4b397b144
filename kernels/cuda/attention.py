"""Attention of a decode step on NVIDIA GPUs (Triton): logical op ``attention``
(``kernels/ops/attention_ops.py``: ``scaled_dot_product_attention``, GQA included), pattern
``patterns/cuda/attention.pdl.mlir``.

``decode_attention_triton`` takes one query token per sequence over a key/value cache, as
transformers' Llama gives it at decode with a static cache: q [B, Hq, 1, D], the cache's
k, v [B, Hkv, L, D] with ``enable_gqa`` (Hq a multiple of Hkv) or Hq = Hkv, a mask that is
None, bool or additive float broadcastable to [B, Hq, 1, L], dropout 0, not causal. One program
per (sequence, key/value head, slice of the cache) reads that slice's keys and values once
for its Hq / Hkv query heads; a second small kernel merges the slices where there are
several (``_triton_attention.py``). On an H200 at Llama-3's heads over 129 cached tokens,
bfloat16: 11.8 us for 64 sequences against 18.3 us for cuDNN's SDPA (what Inductor calls),
4.6 against 5.7 us for one; at Llama-2-7B's (32 over 32) 36.4 against 53.7 us for 64
(``benchmarks/results/cuda_attention_h200_*.md``). A growing cache
(transformers' ``DynamicCache``) is taken too: the cache's length is a run-time argument of
the kernels, so a new length compiles no kernel (only a new power-of-two bucket of its tiles
does), and a graph compiled for dynamic shapes is not specialized on it.

It declines (the site keeps ``aten.scaled_dot_product_attention``): more than one query
token (prefill: the flash kernels are built for it), ``is_causal`` (with one query token it
attends to the first key alone, no decode graph asks for that), value head dims unlike the
keys', head dims above 256, a cache whose rows are not unit-stride, a mask of another shape.
Declared ``@launched_by_inductor``: Inductor's code launches the kernels, inside its CUDA
graphs too. Under ``TRITON_INTERPRET=1`` it is declared for the CPU and runs in Triton's
interpreter.
"""

from __future__ import annotations

import math

import torch
from pdlkit.kernels.cuda._common import _CAPTURED, INTERPRET, _triton
from pdlkit.runtime_abi.triton_binding import launched_by_inductor
from torch import Tensor

import pdlkit

_ATTENTION = "pdlkit.kernels.cuda._triton_attention"
# the interpreter rounds bfloat16 casts its own way (NumPy has no bfloat16): not declared there
_FLOATS = [torch.float32, torch.float16] + ([] if INTERPRET else [torch.bfloat16])


def _attention_kernel():
    _triton()  # the same message when Triton is missing
    from pdlkit.kernels.cuda import _triton_attention

    return _triton_attention


def _mask_view(mask: Tensor | None, b: int, hq: int, length: int) -> Tensor | None:
    """The mask as a [B, Hq, 1, L] view (broadcast dims of stride 0), or a decline."""
    if mask is None:
        return None
    if mask.dim() != 4 or mask.shape[2] != 1 or mask.shape[3] != length:
        raise pdlkit.KernelUnsupported(f"mask of shape {tuple(mask.shape)} for {length} keys")
    if mask.shape[0] not in (1, b) or mask.shape[1] not in (1, hq):
        raise pdlkit.KernelUnsupported(f"mask of shape {tuple(mask.shape)} for {b} x {hq} heads")
    return mask.expand(b, hq, 1, length)


def _decode_shapes(q: Tensor, k: Tensor, v: Tensor, is_causal: int, enable_gqa: int) -> None:
    """Decline what the decode kernel does not compute (see the module's docstring)."""
    b, hq, sq, d = q.shape
    hkv, length = k.shape[1], k.shape[2]
    if sq != 1:
        raise pdlkit.KernelUnsupported(f"{sq} query tokens: the decode kernel takes one")
    if is_causal:
        raise pdlkit.KernelUnsupported("is_causal with one query token (attends to key 0 alone)")
    if k.shape[0] != b or tuple(v.shape[:3]) != (b, hkv, length) or k.shape[3] != d:
        raise pdlkit.KernelUnsupported(f"k {tuple(k.shape)}, v {tuple(v.shape)} for q {tuple(q.shape)}")  # fmt: skip
    if v.shape[3] != d or d > 256:
        raise pdlkit.KernelUnsupported(f"head dims {d} (keys) and {v.shape[3]} (values): equal, at most 256")  # fmt: skip
    if hq != hkv and not (enable_gqa and hq % hkv == 0):
        raise pdlkit.KernelUnsupported(f"{hq} query heads over {hkv} key/value heads")
    if length == 0 or k.stride(-1) != 1 or v.stride(-1) != 1:
        raise pdlkit.KernelUnsupported("an empty cache, or a cache whose rows are not unit-stride")


@pdlkit.kernel(
    implements="attention",
    dtypes={"q": _FLOATS, "k": _FLOATS, "v": _FLOATS},
    shapes={"q": {"rank": 4}, "k": {"rank": 4}, "v": {"rank": 4}},
    **_CAPTURED,
)
@launched_by_inductor(_ATTENTION)
def decode_attention_triton(
    q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, is_causal: int, scale: float,
    enable_gqa: int,
) -> Tensor:  # fmt: skip
    """One query token per sequence over a cache, GQA heads grouped onto their key/value
    head; declines other shapes (the module's docstring)."""
    if not q.dtype == k.dtype == v.dtype:
        raise pdlkit.KernelUnsupported(f"q {q.dtype}, k {k.dtype}, v {v.dtype}: one dtype")
    _decode_shapes(q, k, v, is_causal, enable_gqa)
    b, hq, _, d = q.shape
    mask = _mask_view(attn_mask, b, hq, k.shape[2])
    if mask is not None and mask.dtype != torch.bool and mask.dtype != q.dtype:
        raise pdlkit.KernelUnsupported(f"a {mask.dtype} mask for {q.dtype} attention")
    q2 = q if q.stride(-1) == 1 else q.contiguous()
    s = scale if scale > 0 else 1.0 / math.sqrt(d)
    return _attention_kernel().decode_attention(q2, k, v, mask, s)

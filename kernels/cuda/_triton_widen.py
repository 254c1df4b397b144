"""The Triton kernel behind prefill-sized weight-only linears (``kernels/cuda/weight_only.py``):
an int8 weight widened to the activations' dtype, exactly, for cuBLAS to take.

A Triton launch rather than ``w.to(dtype)``: in a traced body Inductor's weight-only pattern
(``fx_passes/quantization.py``) would turn ``mm(x, w.to(dtype).t()) * scale`` into
``aten._weight_int8pack_mm``, whose CUDA kernel took 1.8 s for a 2048-row prefill of a
2-layer Llama-2-7B on an H200 (torchao's graph compiled by Inductor, 2026-11-30).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from pdlkit.runtime_abi.triton_binding import launch

_BLOCK = 8192  # int8 values a program widens: 32 a thread at 8 warps


@triton.jit
def widen_kernel(w_ptr, out_ptr, numel, BLOCK: tl.constexpr):
    """out[i] = w[i] as out's dtype (every int8 value is exact in bf16 and fp16)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < numel
    w = tl.load(w_ptr + offs, mask=ok, other=0)
    tl.store(out_ptr + offs, w.to(out_ptr.dtype.element_ty), mask=ok)


def widen(w: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A new contiguous tensor: the contiguous int8 ``w`` in ``dtype``."""
    out = torch.empty(w.shape, dtype=dtype, device=w.device)
    numel = w.numel()
    launch(widen_kernel)[(triton.cdiv(numel, _BLOCK),)](w, out, numel, BLOCK=_BLOCK, num_warps=8)
    return out

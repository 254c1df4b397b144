"""What the two ctypes GEMM kernel files of this folder (``qlinear_vnni.py``,
``linear_bf16.py``) do alike with their tensors. Not a kernel file (the registry skips
``_*.py``)."""

from __future__ import annotations

from torch import Tensor


def storage_alias(t: Tensor) -> Tensor:
    """A tensor over ``t``'s storage that holds no reference to ``t`` itself: a pre-pack can
    keep it (for oneDNN's packed copy, made on first need) while the pre-pack cache still
    drops the entry when ``t`` dies, and an in-place update of ``t`` still bumps the version
    the cache checks."""
    return t.new_empty(0).set_(t.untyped_storage(), t.storage_offset(), t.shape, t.stride())


def rows(x: Tensor, k: int) -> tuple[Tensor, int]:
    """``(x, ldx)`` for a C GEMM that reads rows of ``k`` contiguous elements ``ldx`` apart:
    a 2-D ``x`` whose rows are contiguous is read in place (BERT's pooler input ``x[:, 0]``
    is a strided ``[B, K]`` view); anything else is made contiguous (a copy only if it is not)."""
    if x.dim() == 2 and x.stride(1) == 1 and x.stride(0) >= k:
        return x, x.stride(0)
    return (x if x.is_contiguous() else x.contiguous()), k

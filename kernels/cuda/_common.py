"""What the CUDA kernel files share: where they run and how they reach Triton."""

from __future__ import annotations

import os
from typing import Any, cast

import torch
from pdlkit.runtime_abi.dtypes import dtype_from_code
from pdlkit.runtime_abi.triton_binding import size_hint

import pdlkit

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

# where the kernels run: the GPU, or the CPU under Triton's interpreter
_ON: dict[str, Any] = (
    {"device": "cpu", "requires": []} if INTERPRET else {"device": "cuda", "requires": ["sm_80"]}
)
# what every Triton kernel declares beside its op: deterministic, safe in a CUDA graph, where
_CAPTURED: dict[str, Any] = {"traits": ["deterministic", "graph_capture_safe"], **_ON}
_OUT_DTYPES = (torch.float16, torch.float32, torch.bfloat16)  # what the epilogues store


def _triton() -> Any:
    try:
        from pdlkit.kernels.cuda import _triton_gemm
    except ImportError as e:  # a CUDA machine without Triton: every call falls back
        raise pdlkit.KernelUnsupported(f"Triton is not importable ({e}); pip install triton") from e
    return _triton_gemm


def _splitk() -> Any:
    """kernels/cuda/_triton_splitk.py (the decode GEMMs), or why not (no Triton)."""
    _triton()  # the same message when Triton is missing
    from pdlkit.kernels.cuda import _triton_splitk

    return _triton_splitk


_DECODE_ROWS = 256  # the split-K declarations take up to this many rows


def _decode_rows(a: torch.Tensor) -> int:
    """The rows of a decode GEMM's activation ``a``, or KernelUnsupported past _DECODE_ROWS
    (a symbolic row count by its hint: no guard on it)."""
    m = a.shape[0]
    if size_hint(m) > _DECODE_ROWS:
        raise pdlkit.KernelUnsupported(
            f"{m} rows: the split-K kernels take {_DECODE_ROWS} or fewer"
        )
    return m


def one_per_row(s: torch.Tensor, m: int) -> torch.Tensor:
    """One float32 activation scale per row, as the kernels index them: contiguous float32
    scales as they are (no view for Inductor's code to make at each call); another count of
    scales than rows is declined."""
    if s.numel() != m:
        raise pdlkit.KernelUnsupported(f"activation scale of shape {tuple(s.shape)} for {m} rows")
    s = s.to(torch.float32)
    return s if s.is_contiguous() else s.reshape(m).contiguous()


def _dtype(code: int) -> torch.dtype:
    """A dtype operand (the importer's integer code) as one of the dtypes the kernels write."""
    try:
        dtype = dtype_from_code(code)
    except ValueError:
        dtype = None
    if dtype not in _OUT_DTYPES:
        raise pdlkit.KernelUnsupported(f"output dtype code {code} (float16/32 and bfloat16 only)")
    return cast(torch.dtype, dtype)

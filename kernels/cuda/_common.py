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


def _widen() -> Any:
    """kernels/cuda/_triton_widen.py (an int8 weight widened whole), or why not (no Triton)."""
    _triton()  # the same message when Triton is missing
    from pdlkit.kernels.cuda import _triton_widen

    return _triton_widen


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


_HOPPER_SHARED = 232448  # bytes of shared memory one program may take on an H100 / H200


def shared_limit() -> tuple[int, int]:
    """(compute capability's major, bytes of shared memory one program may opt into) of the
    current GPU; an H100's where there is none (a trace on a host without one plans for it)."""
    if INTERPRET or not torch.cuda.is_available():
        return 9, _HOPPER_SHARED
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return props.major, int(getattr(props, "shared_memory_per_block_optin", _HOPPER_SHARED))


def fit_stages(stages: int, stage_bytes: int, kernel: str) -> int:
    """``stages`` (the pipeline depth of a kernel whose K step holds ``stage_bytes`` of tiles
    in shared memory) cut until its buffers fit this GPU, or KernelUnsupported where two do
    not (the site keeps its subgraph). The tiles were measured on Hopper (227 KB a program);
    an A100 gives 163 KB, an sm_86 / sm_89 GPU (A10, L4, L40S, RTX 30x0 / 40x0) 99 KB, where
    several fail to launch. Buffers, as Triton 3.6 compiles these kernels (their shared
    memory read from binaries built for sm_80, sm_86 and sm_90): ``stages`` on Hopper, plus
    up to 8 KB for an epilogue's layout change; ``stages - 1`` before. Even on Hopper a
    128 x 32 int8 tile with K steps of 256 and six stages (``pick_split_config``'s for 65 to
    128 rows of a 4096-wide weight) takes 245,760 bytes: more than an H100 has."""
    major, limit = shared_limit()

    def need(s: int) -> int:
        return s * stage_bytes + 8192 if major >= 9 else (s - 1) * stage_bytes

    while stages > 2 and need(stages) > limit:
        stages -= 1
    if need(stages) > limit:
        raise pdlkit.KernelUnsupported(
            f"{kernel}: {need(stages)} bytes of shared memory at {stages} stages, more than "
            f"this GPU's {limit}"
        )
    return stages


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

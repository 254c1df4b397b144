"""What the rotary embedding of transformers' Llama (5.17 and earlier) computes before the
layers, for NVIDIA GPUs: its frequencies, ``inv_freq[None, :, None] @ positions[:, None, :]``,
a matmul of inner dimension 1 (``matmul_outer``, ``patterns/cuda/rope.pdl.mlir``).

    before: a cuBLAS SGEMM call (2.8 us on an H200) and two Inductor kernels that make its
            expanded inputs contiguous, each decode step
    after:  ``a * b``, traced into the graph (``@launched_by_inductor`` with no Triton
            kernel), which Inductor fuses into the kernel that takes the frequencies' cos and
            sin and rotates Q and K

The products are the ones the matmul computes (one per output, nothing summed), so the
numbers are equal. Newer transformers multiply instead; there the pattern finds nothing. The
matmul sits in an ``autocast(enabled=False)`` region, whose sites take static priority (not
measured: a multiply that Inductor fuses against a library call and two copies).
"""

from __future__ import annotations

import torch
from pdlkit.kernels.cuda._common import _CAPTURED
from pdlkit.runtime_abi.triton_binding import launched_by_inductor
from torch import Tensor

import pdlkit

_FLOATS = [torch.float32, torch.float16, torch.bfloat16]


@pdlkit.kernel(
    implements="matmul_outer",
    dtypes={"a": _FLOATS, "b": _FLOATS},
    shapes={"a": {"rank": 3}, "b": {"rank": 3}},
    **_CAPTURED,
)
@launched_by_inductor()
def matmul_outer_pointwise(a: Tensor, b: Tensor) -> Tensor:
    """The outer products as a broadcast multiply (batch dims broadcast as matmul's do),
    which Inductor fuses with what reads it."""
    if a.shape[-1] != 1 or b.shape[-2] != 1 or a.dtype != b.dtype:
        raise pdlkit.KernelUnsupported(
            f"a {tuple(a.shape)} {a.dtype}, b {tuple(b.shape)} {b.dtype}: needs [..., M, 1] "
            "and [..., 1, N] of one dtype"
        )
    return a * b

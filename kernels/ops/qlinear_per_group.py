"""The logical op ``qlinear_per_group``: a linear whose weight is quantized per group
of input channels (``quantized_decomposed.dequantize_per_channel_group``, e.g. int4-range
weight-only quantization).

``patterns/x86/qlinear_unsupported.pdl.mlir`` routes such linears to this op, which no
shipped kernel implements: every match is reported as a near miss and the GEMM stays with
the default code generator. A kernel declaring ``implements="qlinear_per_group"``
takes them over, and ``pdlkit abi-check`` checks it against this function.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401 (registers quantized_decomposed)
import torch.nn.functional as F
from torch import Tensor

import pdlkit


def _examples(dtype: torch.dtype) -> list[tuple]:
    g = torch.Generator().manual_seed(0)
    out = []
    for m, k, n, group in ((1, 32, 3, 32), (5, 64, 8, 16)):
        x = torch.randn(m, k, generator=g).to(dtype)
        wq = torch.randint(-8, 8, (n, k), generator=g, dtype=torch.int8)
        ws = torch.rand(n, k // group, generator=g) * 0.1
        wzp = torch.zeros(n, k // group, dtype=torch.int64)
        out.append((x, wq, ws, wzp, -8, 7, group, torch.randn(n, generator=g).to(dtype)))
    return out


def _meta(x: Tensor, wq: Tensor, *rest: Any) -> Tensor:
    return x.new_empty((*x.shape[:-1], wq.shape[0]))


@pdlkit.op(meta=_meta, examples=_examples)
def qlinear_per_group(
    x: Tensor, wq: Tensor, w_scales: Tensor, w_zps: Tensor, w_qmin: int, w_qmax: int,
    group_size: int, bias: Tensor | None,
) -> Tensor:  # fmt: skip
    w = torch.ops.quantized_decomposed.dequantize_per_channel_group(
        wq, w_scales, w_zps, w_qmin, w_qmax, wq.dtype, group_size, x.dtype
    )
    return F.linear(x, w, bias)

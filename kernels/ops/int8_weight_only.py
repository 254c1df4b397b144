"""The logical op ``int8_weight_only_linear``: float activations times int8 weights quantized
per output channel, the float32 sums scaled per channel (weight-only quantization:
torchao's ``Int8WeightOnlyConfig``; ``patterns/cuda/torchao_weight_only.pdl.mlir`` calls it).

    y = ((x @ w.T) * w_scale.to(x.dtype) [+ bias]).to(x.dtype)   # x [M, K] float, w [N, K] int8

in float32 until the last cast; the scales [N] (or [N, 1]) are rounded to x's dtype first, as
torchao rounds them. torchao's own graph also rounds ``x @ w.T`` to x's dtype before the
scale: the op (and its kernels) round once, at the end.
"""

from __future__ import annotations

import torch
from torch import Tensor

import pdlkit


def _examples(dtype: torch.dtype) -> list[tuple]:
    g = torch.Generator().manual_seed(0)
    out: list[tuple] = []
    # 80 rows: kernels/cuda/weight_only.py's widened path declines 64 rows and fewer
    for m, k, n in ((1, 7, 3), (5, 64, 16), (17, 96, 40), (64, 256, 128), (80, 64, 24)):
        x = torch.randn(m, k, generator=g).to(dtype)
        w = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
        ws = torch.rand(n, 1, generator=g) * 0.01 + 1e-4  # float32, as torchao keeps them
        out.append((x, w, ws, torch.randn(n, generator=g).to(dtype) if n % 2 else None))
    return out


def _meta(x: Tensor, w: Tensor, w_scale: Tensor, bias: Tensor | None) -> Tensor:
    return x.new_empty((x.shape[0], w.shape[0]))


@pdlkit.op(meta=_meta, examples=_examples)
def int8_weight_only_linear(x: Tensor, w: Tensor, w_scale: Tensor, bias: Tensor | None) -> Tensor:
    s = w_scale.reshape(-1).to(x.dtype).to(torch.float32)
    y = (x.to(torch.float32) @ w.to(torch.float32).T) * s
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(x.dtype)

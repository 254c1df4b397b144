"""int8 weight-only linears for NVIDIA GPUs (``int8_weight_only_linear``, kernels/ops/int8_weight_only.py).

torchao's ``Int8WeightOnlyConfig`` keeps activations in bf16 and weights in int8 with a
scale per output channel; its linear is ``mm(x, w.t().to(bf16)) * scale``. Compiled as
torchao writes it, Inductor took 58 ms for a 64-row decode step of a 2-layer Llama-2-7B on an
H200 (88 kernels; 3.2 ms at one row). Here the split-K streaming kernel
(``_triton_splitk.py``, ``W8``) reads each int8 weight tile once and widens it in registers,
bf16 x bf16 on the tensor cores with float32 sums, the scale (and bias) in the epilogue: one
byte a weight streamed, half of what a BF16 model streams, with tiles measured for these
calls (``w8_config``). On an H200 (benchmarks/results/cuda_llama_torchao_w8_h200_*.md) a
decode step took 0.22 ms at one row (1.39x BF16 Inductor; Llama-3 GQA 1.41x), 0.42 ms at 64
rows (0.98x; its GEMMs 0.76-1.01x of BF16 cuBLAS's there) and 0.97 ms at 256 (0.81x), where
torchao's graph compiled by Inductor took 58 ms (64 rows) and 231 ms (256), growing with
the rows.

Past 256 rows (prefill) the weight is widened to the activations' dtype by a Triton kernel
(``_triton_widen.py``, exact) and multiplied by cuBLAS, the scale and bias in Inductor's
epilogue: the streaming kernel's 128-row tiles took 5.4 ms for a 2048-row prefill of that
Llama (0.60x BF16 Inductor's graph; torchao's graph compiled by Inductor 1,804 ms), this path
3.5 ms (0.93x; Llama-3 GQA 0.95x; cuda_llama_*_torchao_w8_prefill_h200_*.md). This
path rounds the product to x's dtype before the scale, as torchao's own graph does. It is
declared on its own too (``int8_weight_only_widened``, from 65 rows), so that measured
choice can weigh it below that line: on an H200 the streaming tiles win or tie there (128
and 256 rows; at 512 the widened path is 1.3-1.6x faster and at 2048 up to 2.2x:
cuda_weight_only_h200_widened_*.md).
"""

from __future__ import annotations

from typing import Any

import torch
from pdlkit.kernels.cuda._common import _CAPTURED, _splitk, _widen
from pdlkit.runtime_abi.triton_binding import launched_by_inductor, size_hint
from torch import Tensor

import pdlkit

_FLOATS = [torch.bfloat16, torch.float16]
_WEIGHT_ONLY: dict[str, Any] = {
    "implements": "int8_weight_only_linear",
    "dtypes": {"x": _FLOATS, "w": [torch.int8]},
    "shapes": {"x": {"rank": 2}, "w": {"rank": 2, "contiguous": True}},
    **_CAPTURED,
}
_SPLITK = "pdlkit.kernels.cuda._triton_splitk"
_WIDEN = "pdlkit.kernels.cuda._triton_widen"
_STREAM_ROWS = 256  # the streaming kernel takes up to this many rows, the widened path more
_WIDEN_ROWS = 64  # and the widened path, declared alone, from past this many


def _widened(x: Tensor, w: Tensor, w_scale: Tensor, bias: Tensor | None) -> Tensor:
    y = torch.mm(x, _widen().widen(w, x.dtype).t()) * w_scale.reshape(-1).to(x.dtype)
    return y if bias is None else y + bias


@pdlkit.kernel(**_WEIGHT_ONLY, priority=1)
@launched_by_inductor(_SPLITK, _WIDEN)
def int8_weight_only_triton(x: Tensor, w: Tensor, w_scale: Tensor, bias: Tensor | None) -> Tensor:
    """(x @ w.T) * w_scale (+ bias) with each int8 weight tile widened in registers; float32
    sums, the scales rounded to x's dtype, one rounding of the result at the end. Past 256
    rows, and on a GPU whose shared memory the tiles do not fit (fit_stages): the weight
    widened whole, then cuBLAS (:func:`int8_weight_only_widened`), which beats torchao's graph
    compiled by Inductor at any row count (3.2 ms for one row of that Llama's step)."""
    m = x.shape[0]
    if size_hint(m) > _STREAM_ROWS:  # a symbolic M by its hint: no guard on it
        return _widened(x, w, w_scale, bias)
    out = torch.empty((m, w.shape[0]), dtype=x.dtype, device=x.device)
    try:
        return _splitk().splitk(
            x if x.stride(-1) == 1 else x.contiguous(),
            None,
            w,
            w_scale.reshape(-1).contiguous(),  # rounded to x's dtype in the epilogue
            out,
            bias=bias,
            weight_only=True,
        )
    except pdlkit.KernelUnsupported:  # its tiles do not fit this GPU's shared memory (no
        # Triton at all raises again below, with the same message)
        return _widened(x, w, w_scale, bias)  # still far faster than torchao's graph


@pdlkit.kernel(**_WEIGHT_ONLY, priority=0)
@launched_by_inductor(_WIDEN)
def int8_weight_only_widened(x: Tensor, w: Tensor, w_scale: Tensor, bias: Tensor | None) -> Tensor:
    """The int8 weight widened to x's dtype by one Triton kernel (exact), then ``mm`` (cuBLAS)
    and the scale and bias as torch ops: the product rounded to x's dtype before the scale,
    as torchao's graph rounds it. From 65 rows: below, streaming the int8 weight once is
    faster than reading it, writing it widened and reading that again."""
    if size_hint(x.shape[0]) <= _WIDEN_ROWS:
        raise pdlkit.KernelUnsupported(
            f"{x.shape[0]} rows: the widened weight-only path takes more than {_WIDEN_ROWS}"
        )
    return _widened(x, w, w_scale, bias)

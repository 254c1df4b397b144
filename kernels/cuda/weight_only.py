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
the rows. So prefill-sized calls take the kernel too (``w8_config``'s 128-row tiles; their
speed is not measured yet: on a GPU the whole-graph check times them against Inductor's).
"""

from __future__ import annotations

import torch
from pdlkit.kernels.cuda._common import _CAPTURED, _splitk
from pdlkit.runtime_abi.triton_binding import launched_by_inductor
from torch import Tensor

import pdlkit

_FLOATS = [torch.bfloat16, torch.float16]


@pdlkit.kernel(
    implements="int8_weight_only_linear",
    dtypes={"x": _FLOATS, "w": [torch.int8]},
    shapes={"x": {"rank": 2}, "w": {"rank": 2, "contiguous": True}},
    **_CAPTURED,
)
@launched_by_inductor("pdlkit.kernels.cuda._triton_splitk")
def int8_weight_only_triton(x: Tensor, w: Tensor, w_scale: Tensor, bias: Tensor | None) -> Tensor:
    """(x @ w.T) * w_scale (+ bias) with each int8 weight tile widened in registers; float32
    sums, the scales rounded to x's dtype, one rounding of the result at the end."""
    m = x.shape[0]
    out = torch.empty((m, w.shape[0]), dtype=x.dtype, device=x.device)
    return _splitk().splitk(
        x if x.stride(-1) == 1 else x.contiguous(),
        None,
        w,
        w_scale.reshape(-1).contiguous(),  # rounded to x's dtype in the epilogue
        out,
        bias=bias,
        weight_only=True,
    )

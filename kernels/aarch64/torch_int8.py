"""PyTorch's own AArch64 int8 path, declared as the lower-priority kernel of the qlinear ops.

The int8 GEMM is ``torch._int_mm`` (s8 x s8 -> s32), which PyTorch's AArch64 builds run
through oneDNN with the Arm Compute Library; the epilogue (zero-point correction,
dequantization, bias, ReLU / GELU, requantization) is plain torch ops. Chosen where no
a64_* kernel is eligible: priority 0 against 10 (SDOT) and 20 (i8mm), and only declared
when the installed torch has ``torch._int_mm``. It requires asimddp, the baseline of every
server-class AArch64 core, so that it is not chosen for x86 targets, whose own oneDNN
kernels (kernels/x86) are the better choice there. The arithmetic is the same on any host,
so tests/test_aarch64_plan.py checks it on this one against the reference semantics.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from pdlkit.runtime_abi.dtypes import quantized_dtype
from torch import Tensor

import pdlkit


def _pack(w_q: Tensor, attrs: Mapping[str, Any]) -> tuple[Tensor, Tensor]:
    """[N, K] int8 -> ([K, N] int8 for _int_mm, per-column sums for the zero-point term)."""
    return w_q.t().contiguous(), w_q.sum(dim=1, dtype=torch.int32)


def _float_out(
    x_q: Tensor, x_scale: Any, x_zp: Any, packed: Any, w_scale: Any, w_zp: Any,
    bias: Tensor | None, post_op: str, algorithm: str,
) -> Tensor:  # fmt: skip
    if post_op not in ("none", "relu", "gelu") or (
        post_op == "gelu" and algorithm not in ("none", "tanh", "")
    ):
        raise pdlkit.KernelUnsupported(f"post op {post_op!r} ({algorithm!r})")
    if bool(w_zp.ne(0).any()) if isinstance(w_zp, Tensor) else w_zp != 0:
        raise pdlkit.KernelUnsupported("weight zero points must be 0 (symmetric)")
    w_t, colsum = packed
    k = x_q.shape[-1]
    x2 = x_q.reshape(-1, k)
    zp = x_zp.reshape(()).to(torch.int32) if isinstance(x_zp, Tensor) else int(x_zp)
    if x2.dtype == torch.uint8:  # _int_mm is s8 x s8: shift u8 to s8, and the zero point with it
        x2, zp = (x2.to(torch.int16) - 128).to(torch.int8), zp - 128
    acc = torch._int_mm(x2.contiguous(), w_t) - zp * colsum
    xs = x_scale.float().reshape(()) if isinstance(x_scale, Tensor) else float(x_scale)
    scale = (w_scale.float() if isinstance(w_scale, Tensor) else float(w_scale)) * xs
    y = acc.float() * scale
    if bias is not None:
        y = y + bias
    if post_op == "relu":
        y = torch.relu(y)
    elif post_op == "gelu":
        y = F.gelu(y, approximate=algorithm or "none")
    return y.reshape(*x_q.shape[:-1], w_t.shape[1])


def _requantize(y: Tensor, scale: float, zp: int, qmin: int, qmax: int) -> Tensor:
    """quantize_per_tensor's arithmetic: round(y / scale) + zp, clamped, as uint8 or int8."""
    q = torch.round(y * (1.0 / scale)) + zp
    return q.clamp_(qmin, qmax).to(quantized_dtype(qmin))


_COMMON: dict[str, Any] = {
    "device": "cpu",
    "dtypes": {"x_q": [torch.uint8, torch.int8], "w_q": [torch.int8]},
    "shapes": {"w_q": {"rank": 2}},
    "requires": ["asimddp"],
    "prepack": _pack,
    "prepack_arg": "w_q",
    "traits": ["deterministic"],
}


def _float(*args: Any) -> Tensor:
    """act(dequantize(x_q) @ dequantize(w_q).T + bias): torch._int_mm (oneDNN + ACL) + torch
    epilogue; the activation's scale and zero point numbers or (dynamic) tensors."""
    return _float_out(*args)


def _requantized(*args: Any) -> Tensor:
    """quantize_per_tensor(qlinear(...)): torch._int_mm + torch epilogue, u8 or s8 out."""
    y = _float_out(*args[:7], *args[11:])  # (x_q, ..., bias) and (post_op, algorithm)
    return _requantize(y, *args[7:11])  # out_scale, out_zp, out_qmin, out_qmax


# the ops' parameters (kernels/ops/logical_ops.py) reach the kernels as *args; the _pt ops
# take the weight quantized per tensor (ArmInductorQuantizer graphs): scale and zero point
# are numbers
_OPS = (
    "qlinear",
    "qlinear_dynamic",
    "qlinear_q",
    "qlinear_pt",
    "qlinear_dynamic_pt",
    "qlinear_q_pt",
)

if hasattr(torch, "_int_mm"):
    for _op in _OPS:
        _name = f"torch_{_op}_aarch64"
        _fn = _requantized if _op.startswith("qlinear_q") else _float
        globals()[_name] = pdlkit.kernel(implements=_op, name=_name, **_COMMON)(_fn)

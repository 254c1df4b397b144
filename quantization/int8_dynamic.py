"""int8 dynamic per-token quantization in plain torch ops (the GPU inference form).

Each ``nn.Linear`` becomes :class:`Int8DynamicLinear`: weights quantized once per output
channel (symmetric, int8), activations quantized per token (per row) at run time, one int8 x
int8 -> int32 ``torch._int_mm`` and a float rescale. This is the graph PyTorch users write or
get from torchao's int8 dynamic configs once decomposed; the shipped CUDA patterns
(``patterns/cuda/``) rewrite its three parts (per-token quantize, ``_int_mm`` + rescale, the
SiLU-gated pair of a Llama MLP) into fused kernels. Without pdlkit it runs as is, on any device.

    model = pdlkit.quantization.quantize(model, (x,), scheme="int8-dynamic-per-token")
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

# amax is clamped so an all-zero row gets a finite scale (its int8 values are all 0)
_EPS = 1e-8


def quantize_per_token(x: Tensor, eps: float = _EPS, qmax: float = 127.0) -> tuple[Tensor, Tensor]:
    """Symmetric int8 quantization of each row of a 2-D tensor: (int8 values, float32 [M, 1] scales).

    ``x ~= q * scale``; the pattern ``patterns/cuda/int8_dynamic.pdl.mlir`` matches exactly
    these ops, so keep them in step. This is also the reference semantics of the logical op
    ``quantize_per_token`` (``kernels/ops/logical_ops.py``).
    """
    xf = x.to(torch.float32)
    scale = xf.abs().amax(dim=-1, keepdim=True).clamp(min=eps) / qmax
    q = torch.clamp(torch.round(xf / scale), -qmax, qmax).to(torch.int8)
    return q, scale


def int8_linear(
    q: Tensor, scale: Tensor, w_t: Tensor, w_scale: Tensor, bias: Tensor | None, dtype: torch.dtype
) -> Tensor:
    """(q @ w_t) * scale * w_scale + bias, in ``dtype``; ``w_t`` is the [K, N] view of [N, K] weights."""
    y = torch._int_mm(q, w_t).to(torch.float32) * scale * w_scale
    if bias is not None:
        y = y + bias
    return y.to(dtype)


class Int8DynamicLinear(nn.Module):
    """``nn.Linear`` with int8 per-channel weights and int8 per-token activations."""

    w_q: Tensor
    w_scale: Tensor
    bias: Tensor | None

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        w = linear.weight.detach().to(torch.float32)
        w_scale = w.abs().amax(dim=1).clamp(min=_EPS) / 127.0
        self.register_buffer(
            "w_q", torch.clamp(torch.round(w / w_scale[:, None]), -127, 127).to(torch.int8)
        )
        self.register_buffer("w_scale", w_scale)
        b = linear.bias
        self.register_buffer("bias", None if b is None else b.detach().to(torch.float32))
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.dtype = linear.weight.dtype

    def forward(self, x: Tensor) -> Tensor:
        x2 = x.reshape(-1, self.in_features)
        q, scale = quantize_per_token(x2)
        y = int8_linear(q, scale, self.w_q.t(), self.w_scale, self.bias, x.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)


def quantize_int8_dynamic(model: nn.Module) -> nn.Module:
    """Replace every ``nn.Linear`` in ``model`` (in place) by :class:`Int8DynamicLinear`."""
    for name, child in list(model.named_children()):
        if isinstance(child, nn.Linear):
            setattr(model, name, Int8DynamicLinear(child))
        else:
            quantize_int8_dynamic(child)
    return model

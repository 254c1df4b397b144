"""What ``quantize`` quantized: every GEMM with a weight, int8 or left in float.

``quantize`` attaches the summary to the model it returns and warns when a GEMM stayed in
float, so a model that is "int8" only in name is said to be so::

    q = quantize(gpt2, (ids,))
    print(q.pdlkit_quantization)
    # int8-static: 9 of 9 GEMMs with int8 weights (linear 9); 8 addmm / mm / matmul made
    # linear first; dynamic: input 0 dims 0, 1
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx

aten = torch.ops.aten
_LINEAR = (aten.linear.default,)
_CONV = (aten.conv1d.default, aten.conv2d.default, aten.conv3d.default, aten.convolution.default)
_MATMUL = (aten.mm.default, aten.addmm.default, aten.matmul.default)


@dataclass
class QuantizationSummary:
    scheme: str
    quantized: list[str] = field(default_factory=list)  # GEMMs with int8 weights, by module
    left: list[str] = field(default_factory=list)  # GEMMs with float weights
    kinds: dict[str, int] = field(default_factory=dict)  # "linear" / "conv" -> int8 count
    prepared: dict[str, int] = field(default_factory=dict)  # prepare.py: pass -> changes
    dynamic: str = ""  # the input dims that stay dynamic

    @property
    def total(self) -> int:
        return len(self.quantized) + len(self.left)

    def __str__(self) -> str:
        kinds = ", ".join(f"{k} {n}" for k, n in self.kinds.items())
        text = f"{self.scheme}: {len(self.quantized)} of {self.total} GEMMs with int8 weights"
        text += f" ({kinds})" if kinds else ""
        if self.left:
            text += f"; left in float: {', '.join(self.left)}"
        linear = self.prepared.get("GEMMs as linear", 0)
        if linear:
            text += f"; {linear} addmm / mm / matmul made linear first"
        return text + f"; dynamic: {self.dynamic or 'none (the example shapes only)'}"


def _module_path(node: fx.Node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    if stack:
        path = str(list(stack.values())[-1][0])
        return path.removeprefix("L['self'].").removeprefix("L__self__.") or node.name
    return node.name


def _from_dequantize(v: Any) -> bool:
    """``v`` is (a view of) a dequantized tensor."""
    seen = 0
    while isinstance(v, fx.Node) and seen < 4:
        if "dequantize" in str(v.target):
            return True
        if v.op != "call_function" or not v.args:
            return False
        v, seen = v.args[0], seen + 1
    return False


def _weight_of(node: fx.Node) -> Any:
    if node.target in _LINEAR or node.target in _CONV:
        return node.args[1] if len(node.args) > 1 else None
    if node.target is aten.addmm.default:
        return node.args[2]
    return node.args[1] if len(node.args) > 1 else None


def _is_parameter(v: Any) -> bool:
    seen = 0
    while isinstance(v, fx.Node) and seen < 4:
        if v.op == "get_attr":
            return True
        if v.op != "call_function" or not v.args:
            return False
        v, seen = v.args[0], seen + 1
    return False


def summarize(
    gm: fx.GraphModule, scheme: str, prepared: dict[str, int], dynamic: str
) -> QuantizationSummary:
    """Each linear / convolution of the converted graph, and each matmul whose right
    operand is a parameter, with int8 weights (read through a dequantize) or not."""
    out = QuantizationSummary(scheme, prepared=prepared, dynamic=dynamic)
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in (*_LINEAR, *_CONV, *_MATMUL):
            continue
        weight = _weight_of(node)
        if _from_dequantize(weight):
            kind = (
                "linear" if node.target in _LINEAR else "conv" if node.target in _CONV else "matmul"
            )
            out.kinds[kind] = out.kinds.get(kind, 0) + 1
            out.quantized.append(_module_path(node))
        elif _is_parameter(weight):
            out.left.append(f"{_module_path(node)} ({str(node.target).split('.')[1]})")
    return out

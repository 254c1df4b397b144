"""FX graph -> Torch dialect, with torch-mlir's FxImporter.

Each op's location is its FX node's name (``loc("gelu")``) and block argument *i* is the
graph's *i*-th input, so whatever MLIR matches maps back to FX nodes by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from torch_mlir import ir
from torch_mlir.dialects import torch as torch_dialect
from torch_mlir.extras.fx_importer import TORCH_DTYPE_TO_INT, ContextCache, FxImporter

_DTYPE_OF_CODE = {code: dtype for dtype, code in TORCH_DTYPE_TO_INT.items()}


def dtype_from_code(code: int) -> torch.dtype:
    """The torch dtype behind an integer dtype operand (``to.dtype(x, 15)`` is bfloat16): a
    dtype constant reaches a kernel through ``pdlkit_call`` as the importer numbered it."""
    if code not in _DTYPE_OF_CODE:
        raise ValueError(f"{code} is not a dtype code of the Torch dialect")
    return _DTYPE_OF_CODE[code]


class _NameLocations(ContextCache):
    def get_node_location(self, node: fx.Node) -> ir.Location:
        return ir.Location.name(node.name, context=self._c)


def new_context() -> ir.Context:
    ctx = ir.Context()
    torch_dialect.register_dialect(ctx)
    return ctx


@dataclass
class Imported:
    module: ir.Module
    func: ir.Operation
    inputs: list[fx.Node]  # block argument i -> FX node (placeholders, then lifted get_attrs)


def _lift_get_attrs(gm: fx.GraphModule) -> tuple[fx.Graph, list[fx.Node]]:
    """A graph for import where tensor constants (get_attr) are inputs, not inlined literals.

    Inlining would copy every constant's data into MLIR; the matcher only needs its type.
    """
    graph = gm.graph
    attrs = [n for n in graph.nodes if n.op == "get_attr"]
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if not attrs:
        return graph, placeholders
    new = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for n in placeholders + attrs:
        p = new.placeholder(n.name)
        p.name = n.name
        val = n.meta.get("val")
        if val is None and n.op == "get_attr":
            val = getattr(gm, str(n.target))
        p.meta["val"] = val
        env[n] = p
    for n in graph.nodes:
        if n.op not in ("placeholder", "get_attr"):
            env[n] = new.node_copy(n, lambda x: env[x])
            env[n].name = n.name
    return new, placeholders + attrs


_CACHES: dict[int, _NameLocations] = {}


def import_graph(gm: fx.GraphModule, ctx: ir.Context) -> Imported:
    """Import ``gm`` (pre-dispatch ATen, with ``meta["val"]`` on every node) into ``ctx``.

    The type cache lives as long as the context, so repeated compilations against one
    pattern set do not rebuild the same tensor types.
    """
    graph, inputs = _lift_get_attrs(gm)
    importer = FxImporter(context=ctx, config_check=False)
    cc = _CACHES.get(id(ctx))
    if cc is None or cc._c is not ctx:
        cc = _CACHES[id(ctx)] = _NameLocations(ctx, py_attr_tracker=importer._py_attr_tracker)
    importer._cc = cc
    func = importer.import_stateless_graph(graph)
    return Imported(importer.module, func.operation, inputs)


def is_tensor_val(v: Any) -> bool:
    return isinstance(v, torch.Tensor)

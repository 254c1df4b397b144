"""FX graph -> Torch dialect, with torch-mlir's FxImporter.

Each op's location is its FX node's name (``loc("gelu")``) and block argument *i* is the
graph's *i*-th input, so whatever MLIR matches maps back to FX nodes by name.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from pdlkit.matcher.pdl_checks import register_torch_dialect
from torch_mlir import ir
from torch_mlir.extras.fx_importer import (
    ContextCache,
    FxImporter,
    is_builtin_function_or_method,
    is_symbolic,
)

from pdlkit.distributed import has_opaque_argument, is_collective, is_opaque_object


class _NameLocations(ContextCache):
    def get_node_location(self, node: fx.Node) -> ir.Location:
        return ir.Location.name(node.name, context=self._c)


def new_context() -> ir.Context:
    ctx = ir.Context()
    register_torch_dialect(ctx)
    return ctx


@dataclass
class Imported:
    module: ir.Module
    func: ir.Operation
    inputs: list[fx.Node]  # block argument i -> FX node (placeholders, then lifted values)


def _importable(node: fx.Node) -> bool:
    """Whether the FxImporter has a Torch-dialect form for ``node``'s own call: ATen ops,
    symbolic size arithmetic and ``getitem``. Higher-order ops (a ``torch.no_grad()`` or
    ``torch.autocast`` region wrapped as ``wrap_with_set_grad_enabled`` /
    ``wrap_with_autocast``, ...), collectives (``_c10d_functional.*``, ``wait_tensor``), ops
    taking an opaque object (a process group) and other Python calls are not matched into;
    neither is an input holding an opaque object (the Torch dialect has no type for it)."""
    if node.op == "placeholder":
        return not is_opaque_object(node.meta.get("val"))
    if node.op == "output":
        return True
    if node.op == "get_attr":
        return True
    if node.op != "call_function":
        return False
    target = node.target
    if target is operator.getitem:
        return True
    if isinstance(target, torch._ops.OpOverload):  # collectives stay with Inductor
        return not (is_collective(node) or has_opaque_argument(node))
    return is_symbolic(node.meta.get("val")) and is_builtin_function_or_method(target)


def _graph_for_import(gm: fx.GraphModule) -> tuple[fx.Graph, list[fx.Node]]:
    """The graph to import, and the FX node behind each function input.

    Tensor constants (get_attr) become inputs, not inlined literals: inlining would copy
    every constant's data into MLIR, and the matcher only needs its type. Nodes the importer
    has no form for are left out; a tensor one of them produces for an imported node
    becomes an input too (an opaque value, like a graph input), so the rest still matches.
    """
    graph = gm.graph
    opaque = {n for n in graph.nodes if not _importable(n)}
    attrs = [n for n in graph.nodes if n.op == "get_attr"]
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if not attrs and not opaque:
        return graph, placeholders
    for n in graph.nodes:  # getitem of a left-out tuple, a read of a non-tensor left-out value
        if n not in opaque and n.op == "call_function":
            if any(a in opaque and not is_tensor_val(a.meta.get("val")) for a in n.all_input_nodes):
                opaque.add(n)
    inputs = [n for n in placeholders if n not in opaque]
    for n in graph.nodes:
        if n.op == "get_attr" or n in opaque:
            if isinstance(_value(gm, n), torch.Tensor) and any(u not in opaque for u in n.users):
                inputs.append(n)
    new = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for n in inputs:
        p = new.placeholder(n.name)
        p.name = n.name
        p.meta["val"] = _value(gm, n)
        env[n] = p
    for n in graph.nodes:
        if n.op == "output":
            outs = [a for a in _flat(n.args[0]) if not isinstance(a, fx.Node) or a in env]
            new.output(tuple(env[a] if isinstance(a, fx.Node) else a for a in outs))
        elif n not in env and n.op != "get_attr" and n not in opaque:
            env[n] = new.node_copy(n, lambda x: env[x])
            env[n].name = n.name
    return new, inputs


def _value(gm: fx.GraphModule, n: fx.Node) -> Any:
    val = n.meta.get("val")
    if val is None and n.op == "get_attr":
        val = getattr(gm, str(n.target))
    return val


def _flat(a: Any) -> list[Any]:
    return [x for item in a for x in _flat(item)] if isinstance(a, tuple | list) else [a]


class GraphImporter:
    """Imports graphs into one context, with one type and location cache for all of them:
    repeated compilations against one pattern set do not rebuild the same tensor types.
    Whoever owns the context holds this (``MatchContext.importer``), so the cache is freed
    with the context (it was a process-wide table keyed by ``id(ctx)`` before)."""

    def __init__(self, ctx: ir.Context) -> None:
        self.ctx = ctx
        self._cache: _NameLocations | None = None

    def import_graph(self, gm: fx.GraphModule) -> Imported:
        """Import ``gm`` (pre-dispatch ATen, with ``meta["val"]`` on every node)."""
        graph, inputs = _graph_for_import(gm)
        importer = FxImporter(context=self.ctx, config_check=False)
        if self._cache is None:
            self._cache = _NameLocations(self.ctx, py_attr_tracker=importer._py_attr_tracker)
        importer._cc = self._cache
        func = importer.import_stateless_graph(graph)
        return Imported(importer.module, func.operation, inputs)


def import_graph(gm: fx.GraphModule, ctx: ir.Context) -> Imported:
    """Import ``gm`` into ``ctx`` once (a context used for one graph: gen-pattern, tests)."""
    return GraphImporter(ctx).import_graph(gm)


def is_tensor_val(v: Any) -> bool:
    return isinstance(v, torch.Tensor)

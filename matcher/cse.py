"""Common-subexpression elimination on the pre-dispatch graph, before matching.

Dynamo keeps each module call's ops, so two linears reading one activation quantize it twice
(``quantize_per_token(x)`` in the gate and in the up projection of a SwiGLU MLP); a pattern
that wants both GEMMs to share one quantized input only matches once the copies are one
node. Inductor does the same CSE later, so results do not change.

Only exact: a node is merged with an earlier one when both call the same ATen overload, with
the same arguments, the op is functional and not random (a random op, such as attention with
its dropout, is itself never merged, and stops nothing else). Where the graph mutates a
tensor (a KV cache written in place), no read of that tensor or of a view of it is merged:
an in-place op between two reads would make them differ.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import fx


def _pure(node: fx.Node) -> bool:
    op = node.target
    if op is operator.getitem:  # an output of a multi-output op (torchao's choose_qparams)
        return True
    return (
        isinstance(op, torch._ops.OpOverload)
        and not op._schema.is_mutable
        and torch.Tag.nondeterministic_seeded not in op.tags
    )


def _key(node: fx.Node) -> Any:
    def freeze(a: Any) -> Any:
        if isinstance(a, list | tuple):
            return (type(a).__name__, tuple(freeze(x) for x in a))
        if isinstance(a, dict):
            return tuple(sorted((k, freeze(v)) for k, v in a.items()))
        if isinstance(a, fx.Node):
            return ("node", a.name)
        return (type(a).__name__, a)

    return (node.target, freeze(node.args), freeze(node.kwargs))


# ops whose output may share memory with their first argument
_VIEWS = frozenset(
    {
        "view", "reshape", "slice", "select", "t", "transpose", "permute", "expand", "unsqueeze",
        "squeeze", "alias", "detach", "as_strided", "narrow", "unflatten", "flatten", "split",
        "chunk", "unbind", "diagonal", "view_as", "expand_as", "numpy_T", "_reshape_alias",
    }
)  # fmt: skip


def _base(node: fx.Node) -> fx.Node:
    while (
        node.op == "call_function"
        and isinstance(node.target, torch._ops.OpOverload)
        and node.target._schema.name.split("::")[-1] in _VIEWS
        and node.args
        and isinstance(node.args[0], fx.Node)
    ):
        node = node.args[0]
    return node


def _tainted(nodes: list[fx.Node]) -> set[fx.Node] | None:
    """The nodes that read a tensor some op writes in place, or a view of one: two such reads
    may see different values. (A value computed from such a read is a fresh tensor, and two
    equal computations from it agree.) None where the graph calls modules or methods."""
    if any(n.op in ("call_module", "call_method") for n in nodes):
        return None
    written: set[fx.Node] = set()
    for n in nodes:
        op = n.target
        if isinstance(op, torch._ops.OpOverload) and op._schema.is_mutable:
            for i, spec in enumerate(op._schema.arguments):
                a = n.args[i] if i < len(n.args) else n.kwargs.get(spec.name)
                if isinstance(a, fx.Node) and spec.alias_info and spec.alias_info.is_write:
                    written.add(_base(a))
    if not written:
        return set()
    return {n for n in nodes if any(_base(a) in written for a in n.all_input_nodes)}


def eliminate_common_subexpressions(gm: fx.GraphModule) -> int:
    """Merge duplicate pure ATen nodes of ``gm`` in place; returns how many were removed.

    before: q1 = abs(x); q2 = abs(x); y = add(q1, q2)
    after:  q1 = abs(x); y = add(q1, q1)
    """
    nodes = list(gm.graph.nodes)
    tainted = _tainted(nodes)
    if tainted is None:
        return 0
    seen: dict[Any, fx.Node] = {}
    removed = 0
    for n in nodes:
        if n.op != "call_function" or not _pure(n) or n in tainted:
            continue
        try:
            key = _key(n)
            hash(key)
        except TypeError:  # an unhashable constant argument: keep the node
            continue
        first = seen.setdefault(key, n)
        if first is not n:
            n.replace_all_uses_with(first)
            gm.graph.erase_node(n)
            removed += 1
    if removed:
        gm.recompile()
    return removed

"""Common-subexpression elimination on the pre-dispatch graph, before matching.

Dynamo keeps each module call's ops, so two linears reading one activation quantize it twice
(``quantize_per_token(x)`` in the gate and in the up projection of a SwiGLU MLP); a pattern
that wants both GEMMs to share one quantized input only matches once the copies are one
node. Inductor does the same CSE later, so results do not change.

Only exact: a node is merged with an earlier one when both call the same ATen overload, with
the same arguments, the op is functional and not random; and nothing is merged in a graph
that mutates any tensor (an in-place op between two reads would make them differ).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx


def _pure(node: fx.Node) -> bool:
    op = node.target
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


def eliminate_common_subexpressions(gm: fx.GraphModule) -> int:
    """Merge duplicate pure ATen nodes of ``gm`` in place; returns how many were removed.

    before: q1 = abs(x); q2 = abs(x); y = add(q1, q2)
    after:  q1 = abs(x); y = add(q1, q1)
    """
    nodes = list(gm.graph.nodes)
    if any(
        n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload) and not _pure(n)
        for n in nodes
    ) or any(n.op == "call_module" or n.op == "call_method" for n in nodes):
        return 0
    seen: dict[Any, fx.Node] = {}
    removed = 0
    for n in nodes:
        if n.op != "call_function" or not _pure(n):
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

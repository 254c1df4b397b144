"""Reading and building FX nodes of a pre-dispatch ATen graph with ``meta["val"]``: the
helpers the canonicalization rules (``canonicalize.py``, ``canonical_int8.py``) share."""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

NOTE = "pdlkit_canonical"  # node.meta key: how to undo an inexact rewrite

# -- reading FX nodes ---------------------------------------------------------------------------


def value_of(n: Any) -> Any:
    return n.meta.get("val") if isinstance(n, fx.Node) else n


def is_call(n: Any, *targets: Any) -> bool:
    return isinstance(n, fx.Node) and n.op == "call_function" and n.target in targets


def arg(node: fx.Node, i: int, name: str) -> Any:
    """Argument ``name`` (position ``i``) of an ATen call, its schema default when omitted."""
    if i < len(node.args):
        return node.args[i]
    if name in node.kwargs:
        return node.kwargs[name]
    schema = node.target._schema  # type: ignore[union-attr]
    for a in schema.arguments:
        if a.name == name:
            return a.default_value if a.has_default_value() else None
    raise KeyError(name)


def known_equal(a: Any, b: Any) -> bool:
    return bool(statically_known_true(a == b))


def shape_is(t: Any, shape: tuple[Any, ...]) -> bool:
    return (
        isinstance(t, torch.Tensor)
        and t.dim() == len(shape)
        and all(known_equal(x, y) for x, y in zip(t.shape, shape, strict=True))
    )


# -- building nodes -----------------------------------------------------------------------------


def call(
    graph: fx.Graph,
    target: Any,
    args: tuple[Any, ...],
    like: fx.Node,
    same: bool = False,
    val: Any = None,
) -> fx.Node:
    """A new node before ``like`` with ``like``'s user-facing meta and a fake value
    (``like``'s own when ``same``: it computes the same tensor, and fake dispatch is slow)."""
    with graph.inserting_before(like):
        n = graph.create_node("call_function", target, args, name=target.overloadpacket.__name__)
    for k in ("stack_trace", "nn_module_stack", "source_fn_stack", "from_node"):
        if k in like.meta:
            n.meta[k] = like.meta[k]
    if val is None:
        val = (
            like.meta["val"] if same and "val" in like.meta else target(*fx.map_arg(args, value_of))
        )
    n.meta["val"] = val
    return n

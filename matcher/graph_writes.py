"""What a graph writes in place, and whether running it again could be seen by its caller.

    before: a graph with any in-place write (an LLM decode step writing its KV cache, a mask
            built with ``&=``) was never run again to time it as a whole, so its sites' own
            choices stood unchecked
    after:  a write that reaches a graph input (through views of it) is harmless on a copy:
            the whole-graph check runs such graphs on scratch copies of the inputs they
            write (:func:`scratch_inputs`); a write into a module constant (``get_attr``), or
            one whose target cannot be traced, still stops the check (:func:`unseen_writes`)

A value made inside the graph (``torch.zeros``, a product) may be written freely: the caller
never sees it. Tracing a write's target back goes through every op's first graph value (a
view is always of its first argument; an op that makes a new tensor only makes the trace
copy an input that did not need it, which costs memory, not correctness).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx

# Python's in-place operators (``x &= m`` traces to ``operator.iand``) and item assignment;
# ``operator.and_`` / ``or_`` / ``not_`` end with "_" but return a new value (transformers'
# GPT-2 and Llama build their attention masks with ``&``)
_WRITING_OPERATORS = frozenset(
    getattr(operator, n)
    for n in "iadd iand iconcat ifloordiv ilshift imatmul imod imul ior ipow irshift isub "
    "itruediv ixor setitem delitem".split()
)

# the copies of written inputs the whole-graph check may make (bytes): a KV cache larger than
# this is not copied, and its graph keeps its sites' own choices
SCRATCH_MAX_BYTES = 1 << 30


def writes(n: fx.Node) -> bool:
    """Whether ``n`` may write in place: a mutable schema, an in-place method or function
    (named with a trailing "_", as ``add_``; of the special methods, the in-place operators'
    and item assignment's), or one of Python's in-place operators."""
    if n.op not in ("call_function", "call_method"):
        return False
    if n.target in (torch._C._set_grad_enabled, torch.Tensor.__setitem__):
        return True
    if getattr(n.target, "__module__", None) == "_operator":
        return n.target in _WRITING_OPERATORS
    schema = getattr(n.target, "_schema", None)
    name = target_name(n)
    if name.startswith("__") and name.endswith("__"):  # a special method: "__eq__" returns
        return getattr(operator, name.strip("_"), None) in _WRITING_OPERATORS  # "__iand__"
    return (schema is not None and schema.is_mutable) or name.endswith("_")


def target_name(n: fx.Node) -> str:
    return str(n.target if isinstance(n.target, str) else getattr(n.target, "__name__", ""))


def _written(n: fx.Node) -> list[Any]:
    """The arguments ``n`` may write: those its schema marks written, else its first
    argument (``self``: in-place methods, operators, item assignment) and an ``out=``."""
    schema = getattr(n.target, "_schema", None)
    if schema is not None:
        marked = [
            n.args[i] if i < len(n.args) else n.kwargs.get(a.name)
            for i, a in enumerate(schema.arguments)
            if a.alias_info is not None and a.alias_info.is_write
        ]
        if marked:
            return marked
    first = n.args[0] if n.args else None
    return [first, n.kwargs["out"]] if "out" in n.kwargs else [first]


def _root(v: Any) -> fx.Node | None:
    """The node a written value comes from: a placeholder or ``get_attr`` reached through
    first graph arguments, or the first node made from no graph value (a fresh tensor);
    None for something that is not a graph value."""
    while isinstance(v, fx.Node) and v.op not in ("placeholder", "get_attr"):
        first = next((a for a in (*v.args, *v.kwargs.values()) if isinstance(a, fx.Node)), None)
        if first is None:
            return v
        v = first
    return v if isinstance(v, fx.Node) else None


def _written_roots(gm: fx.GraphModule) -> tuple[set[fx.Node], str]:
    """The placeholders that in-place writes reach, or why a write would be seen."""
    roots: set[fx.Node] = set()
    for n in gm.graph.nodes:
        if not writes(n):
            continue
        for v in _written(n):
            r = _root(v)
            if r is None or r.op == "get_attr":
                return set(), f"node {n.name} ({target_name(n)}) may write in place"
            if r.op == "placeholder":
                roots.add(r)
    return roots, ""


def written_inputs(gm: fx.GraphModule) -> list[int]:
    """Positions of the graph inputs its in-place writes reach (see :func:`scratch_inputs`)."""
    roots, _ = _written_roots(gm)
    places = [n for n in gm.graph.nodes if n.op == "placeholder"]
    return [i for i, p in enumerate(places) if p in roots]


def unseen_writes(gm: fx.GraphModule, example_inputs: Sequence[Any], captured: bool = False) -> str:
    """Why running ``gm`` again, its written inputs copied, could still be seen ("" when it
    could not): a write into a module constant or an untraceable target, a written input
    that shares memory with another input (copies would undo the sharing), copies over
    :data:`SCRATCH_MAX_BYTES`, or (``captured``) a compilation captured in CUDA graphs, whose
    written inputs (a static KV cache) keep the address they are captured with."""
    roots, why = _written_roots(gm)
    if why or not roots:
        return why
    if captured:
        return "inputs written in place under CUDA graphs (a copy would move a static input)"
    places = [n for n in gm.graph.nodes if n.op == "placeholder"]
    at = [i for i, p in enumerate(places) if p in roots]
    tensors = [x for x in example_inputs if isinstance(x, torch.Tensor)]
    size = 0
    for i in at:
        x = example_inputs[i]
        if type(x) not in (torch.Tensor, torch.nn.Parameter):  # a copy keeps no subclass
            return f"input {places[i].name} is written in place and is not a plain tensor"
        shared = [t for t in tensors if t is not x and _storage(t) == _storage(x)]
        if shared:
            return f"input {places[i].name} is written in place and shares memory with another"
        size += x.numel() * x.element_size()
    if size > SCRATCH_MAX_BYTES:
        return f"inputs written in place ({size / 2**20:.0f} MB) too large to copy for timing"
    return ""


def _storage(t: torch.Tensor) -> int:
    """The address of ``t``'s storage; its identity for a tensor without one (a subclass)."""
    try:
        return int(t.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError, TypeError):
        return id(t)


def scratch_inputs(example_inputs: Sequence[Any], written: Sequence[int]) -> list[Any]:
    """``example_inputs`` with those at ``written`` copied (same sizes and strides, so that
    compiled code's input checks hold): what the whole-graph check runs graphs on, so that
    the caller's tensors keep what they held."""
    out = list(example_inputs)
    for i in written:
        x = out[i]
        out[i] = torch.empty_strided(x.size(), x.stride(), dtype=x.dtype, device=x.device)
        out[i].copy_(x)
    return out

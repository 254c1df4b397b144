"""Substitution records: what matching (matcher/match.py) hands to the FX rewrite (fx_rewrite.py).

    before: the MLIR callback ``pdlkit_call("linear_gelu", %x, %w, %b, %gelu)`` fires on gelu_3
    after:  Record(op="linear_gelu", kernel=<chosen>, args=[NodeRef("x"), NodeRef("w"),
            NodeRef("b")], outputs=[gelu_3], slice=[linear_3, gelu_3])

A kernel argument is a reference into the FX graph (a node, an output of an earlier
substitution, a constant, or a list of those), so the MLIR IR need not outlive matching.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch.fx as fx
from pdlkit.matcher.patterns import Pattern

from pdlkit.errors import PdlkitError


class SubstitutionError(PdlkitError, RuntimeError):
    """A pattern's rewrite is malformed (e.g. pdlkit_call without the op it replaces)."""


@dataclass(frozen=True)
class NodeRef:
    name: str  # FX node
    index: int | None = None  # element of a multi-result node


@dataclass(frozen=True)
class SubRef:
    record: int  # output `index` of an earlier substitution
    index: int


@dataclass(frozen=True)
class Const:
    value: Any


@dataclass(frozen=True)
class ListRef:
    items: tuple[Any, ...]


Ref = NodeRef | SubRef | Const | ListRef


@dataclass
class Record:
    pattern: Pattern
    op: str
    kernel: Any  # the chosen kernel (a runtime_abi KernelDecl: matching does not read it)
    args: list[Ref]
    outputs: list[fx.Node]  # original FX nodes whose values the kernel's outputs replace
    slice: list[fx.Node]  # original FX nodes the call stands for, in graph order
    passed_over: list[str] = field(default_factory=list)  # kernels not chosen, and why
    tuning: str = ""  # the measured choice: candidates' times (matcher/choose.py)
    dispatch: Any = None  # per-bucket choice at run time (dynamic dims): a choose.BucketChoice
    # where the call goes: before the first replaced root (None), or right after this argument
    after: NodeRef | SubRef | None = None
    pos: tuple[int, int] = (0, 0)  # that place, as (original node index, rank among calls there)


def root_of(output: fx.Node) -> fx.Node:
    """The replaced node behind an output (a multi-result node's, for its getitem)."""
    return cast(fx.Node, output.args[0]) if output.target is operator.getitem else output


def leaves(refs: Sequence[Ref]) -> list[NodeRef | SubRef]:
    """The arguments computed in the graph, list items included."""
    out: list[NodeRef | SubRef] = []
    for r in refs:
        if isinstance(r, ListRef):
            out += leaves(r.items)
        elif isinstance(r, NodeRef | SubRef):
            out.append(r)
    return out


def describe_ref(r: Ref, records: Sequence[Record]) -> str:
    """``x``, ``split[1]``, ``linear_gelu_numba#0`` (an earlier call's output), ``[2, 3]``."""
    if isinstance(r, Const):
        return repr(r.value)
    if isinstance(r, ListRef):
        return "[" + ", ".join(describe_ref(x, records) for x in r.items) + "]"
    if isinstance(r, SubRef):
        return f"{records[r.record].kernel.name}#{r.index}"
    return r.name if r.index is None else f"{r.name}[{r.index}]"

"""Matching: one application of a pattern set to one graph, producing substitution records.

    before: linear = aten.linear(x, w, b); gelu = aten.gelu(linear)   (FX, imported to MLIR)
    after:  records == [Record(op="linear_gelu", args=[x, w, b], outputs=[gelu],
            slice=[linear, gelu], kernel=<what kernel choice picked>)]; the MLIR copy of the
            graph calls ``torch.operator "pdlkit.<kernel>"`` in their place

:class:`MatchSession` is the state the MLIR callbacks (``MatchContext``'s constraints and
``pdlkit_call``) read and write during one ``substitute()`` call: references from MLIR values
back to FX nodes, near misses, the records. Which kernel runs at a match is asked of a
:class:`KernelChoice` (matcher/pick.py); this module imports nothing from ``runtime_abi``.
The records are replayed on the FX graph by matcher/fx_rewrite.py.
"""

from __future__ import annotations

import operator
from collections import Counter
from dataclasses import dataclass
from typing import Any, Protocol, cast

import torch.fx as fx
from pdlkit.matcher import natives
from pdlkit.matcher.patterns import Pattern
from pdlkit.matcher.records import (
    Const,
    ListRef,
    NodeRef,
    Record,
    Ref,
    SubRef,
    SubstitutionError,
    describe_ref,
    leaves,
    root_of,
)
from pdlkit.matcher.report import NearMiss
from torch_mlir import ir

SUB_PREFIX = "pdlkit.sub"  # location name of the MLIR op standing for record i: pdlkit.sub<i>
_MAX_NEAR_MISSES = 20  # per pattern and graph


@dataclass
class Choice:
    """Kernel choice's answer for one match: the kernel, or None to keep the replaced subgraph
    (``kept`` says why: the subgraph measured faster)."""

    kernel: Any
    tuning: str = ""  # the candidates' times, when measured
    dispatch: Any = None  # per-bucket choice at run time (dynamic dims)
    kept: str = ""


class KernelChoice(Protocol):
    """What matching asks about each match (implemented by matcher/pick.py)."""

    def eligible(
        self, op: str, pin: str | None, args: list[Any], examples: list[Any], outputs: list[fx.Node]
    ) -> tuple[list[Any], list[str]] | str:
        """The kernels that may run here (``args``: the arguments as FX nodes or constants,
        ``examples`` their values), with the others and why not; or why none may."""
        ...

    def choose(
        self, s: MatchSession, rec: Record, agree: list[Any], examples: list[Any], at: str
    ) -> Choice:
        """Which of the eligible kernels runs at ``rec`` (or none: the subgraph is kept)."""
        ...


def loc_name(op: ir.Operation) -> str:
    """The FX node name an MLIR op stands for (its NameLoc), or "" (``pdlkit.sub<i>`` for
    the call that replaced record i)."""
    return getattr(op.location, "name_str", "") or ""


class MatchSession:
    """State of one substitute() call; the MLIR callbacks read and write it."""

    def __init__(
        self, gm: fx.GraphModule, inputs: list[fx.Node], choice: KernelChoice, target: Any
    ):
        self.gm = gm
        self.nodes = {n.name: n for n in gm.graph.nodes}
        self.order = {n: i for i, n in enumerate(gm.graph.nodes)}
        self.inputs = inputs
        self.choice = choice  # which kernel runs at a match (matcher/pick.py)
        self.target = target  # the runtime_abi Target planned for (explain --why names it)
        self.records: list[Record] = []
        self.kept: list[str] = []  # matches left to Inductor because the subgraph was faster
        # the ops of those matches, no other match's to replace: "keep the subgraph" is what was
        # timed against the kernels, Inductor's code for all of it (node -> the kept match)
        self.kept_ops: dict[fx.Node, str] = {}
        self.claimed: set[str] = set()  # roots replaced (dead until the walk ends)
        self.sliced: dict[fx.Node, list[int]] = {}  # node -> records whose slice it is in
        self.poison: ir.Value | None = None  # what dead roots read until they are erased
        self.near: list[NearMiss] = []
        self.errors: list[str] = []
        self.pattern: Pattern = cast(Pattern, None)  # set before each walk
        self.why: frozenset[str] = frozenset()  # patterns explain --why asks about
        self.collect_near = True  # near-miss messages are built only for a report someone reads
        self.near_count: Counter[str] = Counter()  # near misses per pattern, reported or not

    # references ---------------------------------------------------------------------------------
    def ref(self, v: Any) -> Ref:
        if not isinstance(v, ir.Value):
            return Const(natives.py_attr(v))
        c = natives.constant_value(v)
        if c is not natives.NOT_CONSTANT:
            return Const(c)
        if isinstance(v, ir.BlockArgument):
            number = ir.BlockArgument(v).arg_number
            if number >= len(self.inputs):
                raise SubstitutionError(f"value {v.get_name()} does not come from an FX node")
            return NodeRef(self.inputs[number].name)
        res = ir.OpResult(v)
        owner = res.owner.operation
        if owner.name == "torch.prim.ListConstruct":
            return ListRef(tuple(self.ref(x) for x in owner.operands))
        name = loc_name(owner)
        if name.startswith(SUB_PREFIX):
            return SubRef(int(name[len(SUB_PREFIX) :]), res.result_number)
        if name not in self.nodes:
            raise SubstitutionError(f"value {v.get_name()} does not come from an FX node")
        return NodeRef(name, res.result_number if len(owner.results) > 1 else None)

    def fx_node(self, r: NodeRef | SubRef) -> fx.Node:
        """The original FX node that carries a referenced value."""
        if isinstance(r, SubRef):
            return self.records[r.record].outputs[r.index]
        node = self.nodes[r.name]
        if r.index is None:
            return node
        for u in node.users:
            if u.target is operator.getitem and u.args[1] == r.index:
                return u
        raise SubstitutionError(f"result {r.index} of {r.name} is never read")

    def example(self, r: Ref) -> Any:
        if isinstance(r, Const):
            return r.value
        if isinstance(r, ListRef):
            return [self.example(x) for x in r.items]
        return self.fx_node(r).meta.get("val")

    def describe(self, v: Any) -> str:
        try:
            r = self.ref(v)
        except SubstitutionError:
            return "?"
        return describe_ref(r, self.records)

    def wants_near_miss(self) -> bool:
        """False once this pattern has reported enough, or when no report is read (a plain
        compile): saves describing them."""
        name = self.pattern.name
        if name in self.why:
            return True
        return self.collect_near and self.near_count[name] < _MAX_NEAR_MISSES

    def near_miss(self, at: tuple[str, ...], reason: Any) -> None:
        p = self.pattern
        if self.wants_near_miss():
            self.near.append(NearMiss(p.name, at, reason))
        self.near_count[p.name] += 1

    # the native rewrite ------------------------------------------------------------------------
    def pdlkit_call(self, rewriter: Any, values: list[Any]) -> bool:
        """``pdlkit_call(op_name, args..., replaced_ops...)``; True when the substitution was made."""
        roots = [v for v in values if isinstance(v, ir.Operation | ir.OpView)]
        rest = [v for v in values if not isinstance(v, ir.Operation | ir.OpView)]
        if rest and isinstance(values[0], ir.Operation | ir.OpView):
            roots = roots[1:] + roots[:1]  # `pdl.rewrite %root with` passes the root first
        if not rest or not isinstance(rest[0], ir.StringAttr):
            raise SubstitutionError(
                'pdlkit_call takes the logical op name first (pdl.attribute = "name")'
            )
        if not roots:
            raise SubstitutionError(
                "pdlkit_call needs the operation(s) it replaces as its last operand(s)"
            )
        roots = [r.operation if isinstance(r, ir.OpView) else r for r in roots]
        op_name = ir.StringAttr(rest[0]).value
        args = rest[1:]
        root_names = [loc_name(r) for r in roots]
        if self.claimed.intersection(root_names):
            return False  # an op this walk already replaced, not yet erased
        for n in root_names:
            if n not in self.nodes:
                self.near_miss(
                    tuple(root_names), f"{n or 'a root'} was already replaced by a kernel call"
                )
                return False
        twice = [n for n in root_names if root_names.count(n) > 1]
        if twice:  # PDL lets two pdl.operation values bind one op
            self.near_miss(
                tuple(root_names), f"two of the ops pdlkit_call replaces matched one op, {twice[0]}"
            )
            return False
        outputs: list[fx.Node] = []
        for r, n in zip(roots, root_names, strict=True):
            outputs += [
                self.fx_node(NodeRef(n, i if len(r.results) > 1 else None))
                for i in range(len(r.results))
            ]
        refs = [self.ref(a) for a in args]
        examples = [self.example(r) for r in refs]
        rec = self._pick(op_name, refs, examples, outputs, tuple(root_names))
        if rec is None:
            return False
        place = self._placement(refs, outputs, rec.slice)
        if isinstance(place, str):
            self.near_miss(tuple(root_names), place)
            return False
        rec.after, rec.pos = place
        idx = len(self.records)
        self._replace_roots(roots, [a for a in args if isinstance(a, ir.Value)], rec.kernel, idx)
        self.records.append(rec)
        self.claimed.update(root_names)
        for node in rec.slice:
            self.sliced.setdefault(node, []).append(idx)
        return True

    # where the call goes ---------------------------------------------------------------------
    def _placement(
        self, refs: list[Ref], outputs: list[fx.Node], sl: list[fx.Node]
    ) -> tuple[NodeRef | SubRef | None, tuple[int, int]] | str:
        """Where the kernel call goes: ``(after, pos)`` as in :class:`Record`, or why nowhere.

        Before the first root it replaces, as long as every argument is computed before it
        (always, with one root). A match with several roots can read an argument computed
        later (``relu(x)`` and ``add(relu(x), y)``, with ``y`` computed in between): then
        right after that argument, provided nothing reads a replaced value before it. No other
        op moves, so the graph's order stays as the model wrote it."""
        first = min(self.order[root_of(o)] for o in outputs)
        latest = max(leaves(refs), key=self._position, default=None)
        if latest is None or self._position(latest) < (first, 0):
            return None, (first, -1)
        major, minor = self._position(latest)
        pos = (major, minor + 1)
        inside = set(sl)
        for o in outputs:
            for u in o.users:
                if u not in inside and self._read_at(u) <= pos:
                    return (
                        f"{u.name} reads {o.name} before argument {describe_ref(latest, self.records)} "
                        "is computed: the kernel call has no place without reordering ops"
                    )
        return latest, pos

    def _position(self, r: NodeRef | SubRef) -> tuple[int, int]:
        """Where an argument's value is computed: its node, or the call that replaced it."""
        if isinstance(r, SubRef):
            return self.records[r.record].pos
        return (self.order[self.fx_node(r)], 0)

    def _read_at(self, u: fx.Node) -> tuple[int, int]:
        """The earliest place ``u``'s inputs are read: ``u`` itself, or a kernel call that
        stands for it."""
        return min([(self.order[u], 0)] + [self.records[i].pos for i in self.sliced.get(u, ())])

    def _replace_roots(
        self, roots: list[ir.Operation], operands: list[ir.Value], k: Any, idx: int
    ) -> None:
        """The MLIR rewrite: one ``torch.operator`` takes over every root's results.

        MLIR's walk driver supports erasing only the op it is visiting (it has already
        stepped to the next op, which erasing another root can free under it). So no root is
        erased here: their results move to the new op, and their operands to a poison value,
        so that no later match reaches them through a use list; :meth:`erase_dead` removes
        them after the walk."""
        first = roots[0]
        for r in roots[1:]:
            if r.is_before_in_block(first):
                first = r
        anchor = None  # the last op computing an argument
        for op in (op for v in operands for op in _computing_ops(v)):
            if anchor is None or anchor.is_before_in_block(op):
                anchor = op
        ip = (
            ir.InsertionPoint.after(anchor)
            if anchor is not None and first.is_before_in_block(anchor)
            else ir.InsertionPoint(first)
        )
        with ip, ir.Location.name(f"{SUB_PREFIX}{idx}", context=first.context):
            call = ir.Operation.create(
                "torch.operator",
                results=[res.type for r in roots for res in r.results],
                operands=operands,
                attributes={"name": ir.StringAttr.get(f"pdlkit.{k.name}")},
                regions=0,
            )
        for i, v in enumerate(operands):
            call.operands[i] = _defined_before(v, call)
        if self.poison is None:
            self.poison = first.block.add_argument(
                ir.Type.parse("!torch.none", first.context), first.location
            )
        new_results = iter(call.results)
        for r in roots:
            for res in r.results:
                res.replace_all_uses_with(next(new_results))
            for i in range(len(r.operands)):
                r.operands[i] = self.poison

    def reads_poison(self, values: list[Any]) -> bool:
        """Whether a constraint looks at an op a substitution left dead in this walk."""
        return self.poison is not None and any(
            isinstance(v, ir.Value) and v == self.poison for v in values
        )

    def _pick(
        self,
        op_name: str,
        refs: list[Ref],
        examples: list[Any],
        outputs: list[fx.Node],
        at: tuple[str, ...],
    ) -> Record | None:
        """The record for this match (None: no substitution, with a near miss saying why):
        the eligible kernels whose meta function agrees, the first of them unless kernel
        choice measures them against the replaced subgraph (matcher/choose.py)."""
        args = [self.fx_arg(r) for r in refs]
        found = self.choice.eligible(op_name, self.pattern.kernel, args, examples, outputs)
        if isinstance(found, str):
            self.near_miss(at, found)
            return None
        agree, passed_over = found
        sl, why = self._slice(outputs, refs)
        if not why:
            why = next(
                (f"{n.name} is in {self.kept_ops[n]}, kept by measurement" for n in sl
                 if n in self.kept_ops),
                "",
            )  # fmt: skip
        if why:
            self.near_miss(at, why)
            return None
        rec = Record(self.pattern, op_name, agree[0], refs, outputs, sl, passed_over)
        c = self.choice.choose(self, rec, agree, examples, at[-1])
        if c.kernel is None:
            self.kept.append(f"{self.pattern.name} at {at[-1]}: {c.kept}")
            self.kept_ops.update((n, f"{self.pattern.name} at {at[-1]}") for n in sl)
            self.near_miss(at, f"kept the replaced subgraph: {c.kept}")
            return None
        rec.kernel, rec.tuning, rec.dispatch = c.kernel, c.tuning, c.dispatch
        return rec

    def fx_arg(self, r: Ref) -> Any:
        """A kernel argument as an FX node (of the original graph), a list, or a constant."""
        if isinstance(r, Const):
            return r.value
        if isinstance(r, ListRef):
            return [self.fx_arg(x) for x in r.items]
        return self.fx_node(r)

    def _slice(self, outputs: list[fx.Node], refs: list[Ref]) -> tuple[list[fx.Node], str]:
        """Original nodes between the kernel's arguments and the replaced outputs."""
        boundary: set[fx.Node] = set()

        def add(r: Ref) -> None:
            if isinstance(r, ListRef):
                for x in r.items:
                    add(x)
            elif isinstance(r, NodeRef | SubRef):
                boundary.add(self.fx_node(r))

        for r in refs:
            add(r)
        seen: set[fx.Node] = set()
        stack = [o for o in outputs if o not in boundary]
        while stack:
            n = stack.pop()
            if n in seen or n in boundary:
                continue
            if n.op == "placeholder":
                return [], (
                    f"the replaced subgraph reads {n.name}, which the kernel call does not receive "
                    "(pass it to pdlkit_call)"
                )
            seen.add(n)
            stack.extend(n.all_input_nodes)
        return sorted(seen, key=self.order.__getitem__), ""

    def erase_dead(self, func: ir.Operation, new_records: list[Record]) -> Counter[str]:
        """Erase matched ops that lost their last use, so later patterns cannot match them,
        and count the op names that remain (the root-op index for the next patterns).

        Ops are found again by name in a fresh walk: holding MLIR op handles across
        erasures would risk touching freed ops.
        """
        names = {n.name for rec in new_records for n in rec.slice}
        present: Counter[str] = Counter()
        block = func.regions[0].blocks[0]
        for op in reversed(list(block.operations)):
            op = op.operation
            if loc_name(op) in names and not any(True for r in op.results for _ in r.uses):
                op.erase()
            else:
                present[op.name] += 1
        if self.poison is not None and not any(True for _ in self.poison.uses):
            block.erase_argument(ir.BlockArgument(self.poison).arg_number)
            self.poison = None
        return present


def _computing_ops(v: ir.Value) -> list[ir.Operation]:
    """The ops a kernel call must follow to read ``v``: its defining op, or for a list, its
    items' (constants and lists can be copied to where the call is)."""
    op = natives.defining_op(v)
    if op is None or op.name.startswith("torch.constant."):
        return []
    if op.name == "torch.prim.ListConstruct":
        return [x for item in op.operands for x in _computing_ops(item)]
    return [op]


def _defined_before(v: ir.Value, call: ir.Operation) -> ir.Value:
    """``v``, or, where a constant or list defines it after ``call``, a copy before it."""
    op = natives.defining_op(v)
    if op is None or op.block != call.block or op.is_before_in_block(call):
        return v
    if not op.name.startswith("torch.constant.") and op.name != "torch.prim.ListConstruct":
        return v  # after the last computing op: never the case
    copy = op.clone(ip=ir.InsertionPoint(call))
    for i, item in enumerate(copy.operands):
        copy.operands[i] = _defined_before(item, copy)
    return copy.results[0]


def root_ops(func: ir.Operation) -> Counter[str]:
    return Counter(op.operation.name for op in func.regions[0].blocks[0].operations)

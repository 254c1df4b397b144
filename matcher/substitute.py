"""Apply a pattern set to an FX graph with MLIR's PDL interpreter, then edit the FX graph.

    before:  linear = aten.linear(x, w, b); gelu = aten.gelu(linear)
    after:   gelu_k = pdlkit.linear_gelu_numba(x, w, b, 'none', <site>)

The graph is imported into the Torch dialect (op locations = FX node names). Patterns run
one at a time in priority order (benefit, then load order), each through MLIR's walk
driver, so a higher-priority pattern claims its nodes before a lower one can. The native
rewrite ``pdlkit_call`` picks a kernel, replaces the matched root(s) in MLIR with a
``torch.operator "pdlkit.<kernel>"`` and records the substitution; dead matched ops are
erased between patterns so that nothing matches them again. The records are then replayed
on the FX graph, which is the graph that gets compiled.
"""

from __future__ import annotations

import hashlib
import operator
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch
import torch.fx as fx
from pdlkit.matcher import natives
from pdlkit.matcher.canonicalize import weight_views
from pdlkit.matcher.choose import BucketChoice, Tuner
from pdlkit.matcher.patterns import Pattern, PatternSet, nested_ops, read_pdl_module
from pdlkit.matcher.report import GraphReport, NearMiss, Substitution, describe_value
from pdlkit.matcher.to_mlir import import_graph, new_context
from pdlkit.matcher.why import PatternWalk, explain_constraint
from pdlkit.runtime_abi.autotune import KEEP
from pdlkit.runtime_abi.binding import CallSite, bind, needs_guard, new_site
from pdlkit.runtime_abi.capability import Target
from pdlkit.runtime_abi.fallback import ReplacedSubgraph, SubgraphSpec
from pdlkit.runtime_abi.kernel import KernelDecl
from pdlkit.runtime_abi.registry import KernelRegistry
from pdlkit.runtime_abi.verify import FirstCallVerifier, resolve_mode
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch_mlir import ir, rewrite

from pdlkit.errors import PdlkitError

_SUB_PREFIX = "pdlkit.sub"
_MAX_NEAR_MISSES = 20  # per pattern and graph


class SubstitutionError(PdlkitError, RuntimeError):
    """A pattern's rewrite is malformed (e.g. pdlkit_call without the op it replaces)."""


# -- kernel arguments as references into the FX graph ------------------------------------------


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
    kernel: KernelDecl
    args: list[Ref]
    outputs: list[fx.Node]  # original FX nodes whose values the kernel's outputs replace
    slice: list[fx.Node]  # original FX nodes the call stands for, in graph order
    passed_over: list[str] = field(default_factory=list)  # kernels not chosen, and why
    tuning: str = ""  # the measured choice: candidates' times (matcher/choose.py)
    dispatch: BucketChoice | None = None  # per-bucket choice at run time (dynamic dims)
    # where the call goes: before the first replaced root (None), or right after this argument
    after: NodeRef | SubRef | None = None
    pos: tuple[int, int] = (0, 0)  # that place, as (original node index, rank among calls there)


# -- per pattern-set MLIR state ------------------------------------------------------------------


class MatchContext:
    """One MLIR context per pattern set: parsed patterns, natives registered, frozen once."""

    def __init__(self, patterns: PatternSet):
        self.ctx = new_context()
        self.session: _Session | None = None
        self._frozen: dict[tuple[str, ...], Any] = {}
        self._keep: list[Any] = []  # PDL modules must outlive their frozen sets
        by_file: dict[Any, list[Pattern]] = {}
        for p in patterns.patterns:
            by_file.setdefault(p.file, []).append(p)
        self._ops: dict[str, Any] = {}
        for file, pats in by_file.items():
            module = read_pdl_module(file, self.ctx)
            self._keep.append(module)
            ops = list(module.body.operations)
            for p, op in zip(_in_file_order(pats, ops), ops, strict=False):
                if p is not None:
                    self._ops[p.name] = op

    def frozen(self, batch: Sequence[Pattern]) -> Any:
        """One frozen pattern set for patterns that are applied in the same walk.

        Each pattern's natives are renamed ``name@i`` so that every callback knows which
        pattern it serves (for near misses and records).
        """
        key = tuple(p.name for p in batch)
        f = self._frozen.get(key)
        if f is not None:
            return f
        with self.ctx, ir.Location.unknown():
            module = ir.Module.create()
            for i, p in enumerate(batch):
                op = self._ops[p.name].clone(ip=ir.InsertionPoint(module.body))
                for inner in nested_ops(op.operation):
                    if inner.name in _NATIVE_OPS and "name" in inner.attributes:
                        inner.attributes["name"] = ir.StringAttr.get(
                            f"{inner.attributes['name'].value}@{i}"
                        )
            pdl = rewrite.PDLModule(module)
        for i, p in enumerate(batch):
            for name, fn in natives.CONSTRAINTS.items():
                pdl.register_constraint_function(
                    f"{name}@{i}",
                    natives.adapt_constraint(name, fn, self._on_fail(p), self._on_error(p)),
                )
            pdl.register_rewrite_function(f"pdlkit_call@{i}", self._pdlkit_call(p))
        f = pdl.freeze()
        self._keep.extend([module, pdl])
        self._frozen[key] = f
        return f

    def _on_fail(self, p: Pattern) -> Any:
        def on_fail(name: str, values: list[Any]) -> None:
            s = self.session
            if s is not None and not s.reads_poison(values):
                s.pattern = p
                if s.wants_near_miss():
                    at = tuple(s.describe(v) for v in values if isinstance(v, ir.Value))
                    args = ", ".join(s.describe(v) for v in values)
                    # the explanation reads the values now: the IR does not outlive the pass
                    why = explain_constraint(name, values, s.describe, [""] * len(values))
                    s.near_miss(at, f"constraint {name}({args}) does not hold: {why}")
                else:
                    s._near_count[p.name] += 1

        return on_fail

    def _on_error(self, p: Pattern) -> Any:
        def on_error(name: str, e: BaseException) -> None:
            if self.session is not None:
                self.session.errors.append(
                    f"{p.where}: constraint {name} raised {type(e).__name__}: {e}"
                )

        return on_error

    def _pdlkit_call(self, p: Pattern) -> Any:
        # MLIR's walk and greedy drivers abort the process when a native rewrite reports
        # failure, so a declined substitution leaves the IR as it is and reports success.
        # Patterns that share a walk match disjoint op names, so none loses its turn.
        def call(rewriter: Any, results: Any, values: list[Any]) -> Any:
            s = self.session
            assert s is not None
            s.pattern = p
            try:
                s.pdlkit_call(rewriter, list(values))
            except SubstitutionError as e:
                s.errors.append(f"{p.where}: {e}")
            except Exception as e:  # never let a Python error unwind through MLIR
                s.errors.append(f"{p.where}: pdlkit_call failed: {type(e).__name__}: {e}")
            return None

        return call


_NATIVE_OPS = {"pdl.apply_native_constraint", "pdl.apply_native_rewrite", "pdl.rewrite"}


def _batches(active: list[Pattern]) -> list[list[Pattern]]:
    """Consecutive patterns (in priority order) that can share one walk: their matched op
    names are disjoint, so no two of them can claim the same node, and applying them
    together equals applying them one after another."""
    out: list[list[Pattern]] = []
    names: set[str] | None = None  # op names the last batch matches; None = not shareable
    for p in active:
        ops = p.op_names
        if ops is None or "torch.operator" in ops:
            out.append([p])
            names = None
        elif out and names is not None and not (ops & names):
            out[-1].append(p)
            names |= ops
        else:
            out.append([p])
            names = set(ops)
    return out


def _in_file_order(pats: list[Pattern], ops: list[Any]) -> list[Pattern | None]:
    """Patterns aligned with the file's top-level ops (a manifest may have dropped none: same file)."""
    by_line = {p.line: p for p in pats}
    out = []
    for op in ops:
        loc = op.location
        out.append(by_line.get(getattr(loc, "start_line", -1)))
    return out


def match_context(patterns: PatternSet) -> MatchContext:
    mc = patterns._cache.get("match")
    if mc is None:
        mc = patterns._cache["match"] = MatchContext(patterns)
    return mc


# -- one application ------------------------------------------------------------------------------


def _loc_name(op: ir.Operation) -> str:
    return getattr(op.location, "name_str", "") or ""


class _Session:
    """State of one substitute() call; the MLIR callbacks read and write it."""

    def __init__(
        self, gm: fx.GraphModule, inputs: list[fx.Node], registry: KernelRegistry, target: Target
    ):
        self.gm = gm
        self.nodes = {n.name: n for n in gm.graph.nodes}
        self.order = {n: i for i, n in enumerate(gm.graph.nodes)}
        self.inputs = inputs
        self.registry = registry
        self.target = target
        self.records: list[Record] = []
        self.tuner: Tuner | None = None  # kernel choice by measurement (matcher/choose.py)
        self.kept: list[str] = []  # matches left to Inductor because the subgraph was faster
        self.claimed: set[str] = set()  # roots replaced (dead until the walk ends)
        self.sliced: dict[fx.Node, list[int]] = {}  # node -> records whose slice it is in
        self.poison: ir.Value | None = None  # what dead roots read until they are erased
        self.dispatch: BucketChoice | None = None  # of the match being picked
        self.near: list[NearMiss] = []
        self.errors: list[str] = []
        self.pattern: Pattern = cast(Pattern, None)  # set before each walk
        self.why: frozenset[str] = frozenset()  # patterns explain --why asks about
        self.collect_near = True  # near-miss messages are built only for a report someone reads
        self._near_count: Counter[str] = Counter()
        self._meta_seen: dict[tuple[Any, ...], str] = {}
        vals = [n.meta.get("val") for n in gm.graph.nodes]
        self.fake_mode = torch._guards.detect_fake_mode(vals)

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
        name = _loc_name(owner)
        if name.startswith(_SUB_PREFIX):
            return SubRef(int(name[len(_SUB_PREFIX) :]), res.result_number)
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
        return _describe_ref(r, self)

    def wants_near_miss(self) -> bool:
        """False once this pattern has reported enough, or when no report is read (a plain
        compile): saves describing them."""
        name = self.pattern.name
        if name in self.why:
            return True
        return self.collect_near and self._near_count[name] < _MAX_NEAR_MISSES

    def near_miss(self, at: tuple[str, ...], reason: Any) -> None:
        p = self.pattern
        if self.wants_near_miss():
            self.near.append(NearMiss(p.name, at, reason))
        self._near_count[p.name] += 1

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
        root_names = [_loc_name(r) for r in roots]
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
        picked = self._pick(op_name, refs, examples, outputs, tuple(root_names))
        if picked is None:
            return False
        k, sl, passed_over, tuning = picked
        dispatch, self.dispatch = self.dispatch, None
        place = self._placement(refs, outputs, sl)
        if isinstance(place, str):
            self.near_miss(tuple(root_names), place)
            return False
        idx = len(self.records)
        self._replace_roots(roots, [a for a in args if isinstance(a, ir.Value)], k, idx)
        self.records.append(
            Record(
                self.pattern, op_name, k, refs, outputs, sl, passed_over, tuning, dispatch, *place
            )
        )
        self.claimed.update(root_names)
        for node in sl:
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
        first = min(self.order[_root_of(o)] for o in outputs)
        latest = max(_leaves(refs), key=self._position, default=None)
        if latest is None or self._position(latest) < (first, 0):
            return None, (first, -1)
        major, minor = self._position(latest)
        pos = (major, minor + 1)
        inside = set(sl)
        for o in outputs:
            for u in o.users:
                if u not in inside and self._read_at(u) <= pos:
                    return (
                        f"{u.name} reads {o.name} before argument {_describe_ref(latest, self)} "
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
        self, roots: list[ir.Operation], operands: list[ir.Value], k: KernelDecl, idx: int
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
        with ip, ir.Location.name(f"{_SUB_PREFIX}{idx}", context=first.context):
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
    ) -> tuple[KernelDecl, list[fx.Node], list[str], str] | None:
        """The kernel for this match (None: no substitution, with a near miss saying why):
        the eligible kernels whose meta function agrees, the first of them unless a tuner
        measures them against the replaced subgraph (matcher/choose.py)."""
        pin = self.pattern.kernel
        cands, passed_over = self.registry.candidates(op_name, examples, self.target, pin)
        if not cands:
            reasons = "; ".join(passed_over)
            self.near_miss(at, f"no eligible kernel for {op_name!r}: {reasons}")
            return None
        agree = [k for k in cands if not self._meta_mismatch(k, examples, outputs)]
        if not agree:
            self.near_miss(at, self._meta_mismatch(cands[0], examples, outputs))
            return None
        sl, why = self._slice(outputs, refs)
        if why:
            self.near_miss(at, why)
            return None
        if self.tuner is None:
            return agree[0], sl, passed_over, ""
        if pin is not None:  # measured all the same, so that explain can say what the pin costs
            others, _ = self.registry.candidates(op_name, examples, self.target)
            agree = [k for k in others if not self._meta_mismatch(k, examples, outputs)] or agree
        rec = Record(self.pattern, op_name, agree[0], refs, outputs, sl)
        args = [self.fx_arg(r) for r in refs]
        decision = self.tuner.choose(
            op_name, agree, args, _fallback_module(self.gm, self, rec), sl, at[-1], pin
        )
        if decision.choice == KEEP:
            self.kept.append(f"{self.pattern.name} at {at[-1]}: {decision.describe()}")
            self.near_miss(at, f"kept the replaced subgraph: {decision.describe()}")
            return None
        k = next(k for k in agree if k.name == decision.choice)
        if pin is None:  # dynamic dims: the other shape buckets choose at run time
            self.dispatch = self.tuner.dispatcher(op_name, agree, args, sl, at[-1], decision)
        return k, sl, passed_over, decision.describe()

    def fx_arg(self, r: Ref) -> Any:
        """A kernel argument as an FX node (of the original graph), a list, or a constant."""
        if isinstance(r, Const):
            return r.value
        if isinstance(r, ListRef):
            return [self.fx_arg(x) for x in r.items]
        return self.fx_node(r)

    def _meta_mismatch(self, k: KernelDecl, examples: list[Any], outputs: list[fx.Node]) -> str:
        """Why the kernel's meta function disagrees with the replaced outputs ("" = it agrees).

        Fake-tensor dispatch is the costly part, and models repeat the same GEMM shapes, so
        answers are remembered per kernel and argument signature for this graph."""
        want = [o.meta.get("val") for o in outputs]
        key = (k.name, k.version, _signature(examples), _signature(want))
        known = self._meta_seen.get(key)
        if known is None:
            known = self._meta_seen[key] = self._meta_check(k, examples, want)
        return known

    def _meta_check(self, k: KernelDecl, examples: list[Any], want: list[Any]) -> str:
        try:
            with self.fake_mode if self.fake_mode is not None else _nullctx():
                got = k.meta(*examples)
        except Exception as e:
            return f"kernel {k.name}: meta function raised {type(e).__name__}: {e}"
        got = list(got) if isinstance(got, tuple | list) else [got]
        if len(got) != len(want):
            return f"kernel {k.name} returns {len(got)} value(s), the pattern replaces {len(want)}"
        for g, w in zip(got, want, strict=True):
            if not isinstance(w, torch.Tensor) or not isinstance(g, torch.Tensor):
                continue
            same = (
                g.dtype == w.dtype
                and g.dim() == w.dim()
                and all(
                    statically_known_true(a == b) for a, b in zip(g.shape, w.shape, strict=True)
                )
            )
            if not same:
                return (
                    f"kernel {k.name}: meta function gives {list(g.shape)} {g.dtype}, "
                    f"the replaced subgraph produces {list(w.shape)} {w.dtype}"
                )
        return ""

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
            if _loc_name(op) in names and not any(True for r in op.results for _ in r.uses):
                op.erase()
            else:
                present[op.name] += 1
        if self.poison is not None and not any(True for _ in self.poison.uses):
            block.erase_argument(ir.BlockArgument(self.poison).arg_number)
            self.poison = None
        return present


def _root_of(output: fx.Node) -> fx.Node:
    """The replaced node behind an output (a multi-result node's, for its getitem)."""
    return cast(fx.Node, output.args[0]) if output.target is operator.getitem else output


def _leaves(refs: Sequence[Ref]) -> list[NodeRef | SubRef]:
    """The arguments computed in the graph, list items included."""
    out: list[NodeRef | SubRef] = []
    for r in refs:
        if isinstance(r, ListRef):
            out += _leaves(r.items)
        elif isinstance(r, NodeRef | SubRef):
            out.append(r)
    return out


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


def _signature(values: Sequence[Any]) -> tuple[Any, ...]:
    out: list[Any] = []
    for v in values:
        if isinstance(v, torch.Tensor):
            shape: tuple[Any, ...] = tuple(v.shape)
            if not all(type(d) is int for d in shape):
                shape = tuple(str(d) for d in shape)  # SymInts do not hash
            out.append((shape, v.dtype))
        else:
            out.append(repr(v))
    return tuple(out)


class _nullctx:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: Any) -> None:
        return None


def _describe_ref(r: Ref, s: _Session) -> str:
    if isinstance(r, Const):
        return repr(r.value)
    if isinstance(r, ListRef):
        return "[" + ", ".join(_describe_ref(x, s) for x in r.items) + "]"
    if isinstance(r, SubRef):
        return f"{s.records[r.record].kernel.name}#{r.index}"
    return r.name if r.index is None else f"{r.name}[{r.index}]"


def _root_ops(func: ir.Operation) -> Counter[str]:
    return Counter(op.operation.name for op in func.regions[0].blocks[0].operations)


# -- the entry point -----------------------------------------------------------------------------


@dataclass
class Outcome:
    graph: fx.GraphModule
    report: GraphReport
    records: list[Record] = field(default_factory=list)


def substitute(
    gm: fx.GraphModule,
    patterns: PatternSet,
    registry: KernelRegistry,
    target: Target,
    *,
    verify: bool | str = False,
    index: int = 0,
    rewrite_fx: bool = True,
    why: Sequence[str] = (),
    near_misses: bool = True,
    tuner: Tuner | None = None,
) -> Outcome:
    """Rewrite every subgraph of ``gm`` that a pattern matches into a kernel call, in place.

    ``gm`` is a pre-dispatch ATen graph whose nodes carry ``meta["val"]``. Example, with a
    linear + gelu pattern and a kernel for ``linear_gelu``::

        before: linear = aten.linear(x, w, b); gelu = aten.gelu(linear); return (gelu,)
        after:  linear_gelu = pdlkit.linear_gelu_numba(x, w, b, 'none', 1); return (linear_gelu,)
    """
    report = GraphReport(index=index, nodes=len(gm.graph.nodes))
    mc = match_context(patterns)
    active = [p for p in patterns.ordered() if p.active_on(target)]
    for p in patterns.patterns:
        if not p.active_on(target):
            report.silent[p.name] = "disabled" if not p.enabled else f"not for target {target.name}"
    with patterns.lock:
        t0 = time.perf_counter()
        imported = import_graph(gm, mc.ctx)
        t1 = time.perf_counter()
        s = _Session(gm, imported.inputs, registry, target)
        s.why = frozenset(why)
        s.collect_near = near_misses
        s.tuner = tuner
        walked: dict[str, list[Any]] = {}
        mc.session = s
        try:
            present = _root_ops(imported.func)
            for batch in _batches(active):
                run = []
                for p in batch:
                    # index by op: a pattern needing an op the graph lacks cannot match
                    needed = set(p.op_names) if p.op_names is not None else {p.root} - {None}
                    missing = sorted(str(n) for n in needed - present.keys())
                    if p.root is not None and p.root in missing:
                        report.silent[p.name] = f"root op {p.root} does not occur in the graph"
                    elif missing:
                        report.silent[p.name] = f"op {missing[0]} does not occur in the graph"
                    else:
                        run.append(p)
                if not run:
                    continue
                s.pattern = run[0]
                for p in run:  # explain --why: the IR exactly as this pattern meets it
                    if p.name in s.why:
                        walked[p.name] = _walk(p, imported.func, mc, s)
                before = len(s.records)
                rewrite.walk_and_apply_patterns(imported.func, mc.frozen(run))
                if len(s.records) > before:
                    present = s.erase_dead(imported.func, s.records[before:])
                fired = {r.pattern.name for r in s.records[before:]}
                for p in run:
                    if p.name not in fired:
                        n = present.get(p.root, 0) if p.root else 0
                        misses = s._near_count[p.name]
                        report.silent[p.name] = (
                            f"{n} candidate root(s) {p.root}, {misses} near miss(es); "
                            f"`pdlkit explain --why {p.name}` shows where each one fails"
                            if p.root
                            else "no match"
                        )
            for name in why:
                report.why[name] = _why(name, imported.func, mc, patterns, s, walked.get(name))
        finally:
            mc.session = None
        t2 = time.perf_counter()
    if s.errors:
        raise SubstitutionError("\n".join(dict.fromkeys(s.errors)))
    report.near_misses = s.near
    report.kept = s.kept
    subs = _rewrite_fx(gm, s, verify) if rewrite_fx and s.records else []
    report.substitutions = subs
    t3 = time.perf_counter()
    if subs:
        gm.recompile()  # FX's Python codegen, as after any FX pass; reported on its own
    report.timings.update(
        mlir_import=t1 - t0,
        pdl_apply=t2 - t1,
        fx_rewrite=t3 - t2,
        fx_codegen=time.perf_counter() - t3,
    )
    return Outcome(gm, report, s.records)


_MAX_WHY = 50  # candidate roots walked per pattern


def _mlir_name(node: fx.Node) -> str:
    schema = getattr(node.target, "_schema", None)
    return "torch." + schema.name.replace("::", ".") if schema is not None else ""


def _walk(p: Pattern, func: ir.Operation, mc: MatchContext, s: _Session) -> list[Any]:
    """Walk pattern ``p`` from each of its candidate roots (at most ``_MAX_WHY``)."""
    if p.root is None:
        return []
    walk = PatternWalk(mc._ops[p.name], p.file)
    ops = func.regions[0].blocks[0].operations
    roots = [op.operation for op in ops if op.operation.name == p.root]
    return [walk.walk(op, s.describe) for op in roots[:_MAX_WHY]] + (
        [f"... and {len(roots) - _MAX_WHY} more candidate root(s)"] if len(roots) > _MAX_WHY else []
    )


def _why(
    name: str,
    func: ir.Operation,
    mc: MatchContext,
    patterns: PatternSet,
    s: _Session,
    walked: list[Any] | None,
) -> list[str]:
    """For ``explain --why``: each candidate root of pattern ``name`` with its first mismatch,
    closest matches first. ``walked`` is the walk made just before the pattern was applied
    (None when it was not applied: then the final IR is walked)."""
    p = next((q for q in patterns.patterns if q.name == name), None)
    if p is None:
        known = ", ".join(q.name for q in patterns.patterns)
        return [f"no pattern named {name!r} is loaded (loaded: {known})"]
    lines = []
    if not p.active_on(s.target):
        why = (
            "it is disabled"
            if not p.enabled
            else f"its targets {list(p.targets)} exclude {s.target.name}"
        )
        lines.append(f"not applied: {why}")
    if p.root is None:
        return [*lines, "unexplained: the pattern's root op has no fixed name"]
    fired = {r.outputs[-1].name: r for r in s.records if r.pattern.name == name}
    for r in s.records:
        if r.pattern.name != name:
            for n in r.slice:
                if _mlir_name(n) == p.root:
                    lines.append(
                        f"root {n.name}: claimed first by pattern {r.pattern.name} "
                        f"(benefit {r.pattern.benefit}) -> kernel {r.kernel.name}"
                    )
    found = walked if walked is not None else _walk(p, func, mc, s)
    cands = [c for c in found if not isinstance(c, str)]
    if not cands and not lines:
        lines.append(f"no candidate root: op {p.root} does not occur in the graph")
    for c in sorted(cands, key=lambda c: -c.progress):
        if c.root in fired:
            lines.append(f"root {c.root}: matched -> kernel {fired[c.root].kernel.name}")
            continue
        if not c.failure:
            near = [m for m in s.near if m.pattern == name and c.root in m.at]
            c.failure = (
                near[0].reason
                if near
                else "unexplained: every op and constraint pdlkit can check holds, yet MLIR's "
                "PDL interpreter did not match here"
            )
        lines.append(str(c))
    lines.extend(c for c in found if isinstance(c, str))
    return lines


def _fallback_module(gm: fx.GraphModule, s: _Session, rec: Record) -> ReplacedSubgraph:
    bindings: list[tuple[int, int | None, fx.Node]] = []
    for i, r in enumerate(rec.args):
        if isinstance(r, ListRef):
            bindings += [
                (i, j, s.fx_node(x))
                for j, x in enumerate(r.items)
                if isinstance(x, NodeRef | SubRef)
            ]
        elif isinstance(r, NodeRef | SubRef):
            bindings.append((i, None, s.fx_node(r)))
    nodes = tuple((n, n.op, n.target, n.args, dict(n.kwargs)) for n in rec.slice)
    return ReplacedSubgraph(
        gm, SubgraphSpec(tuple(bindings), nodes, tuple(rec.outputs), len(rec.args))
    )


def _intercept(rec: Record, mode: str | None) -> Any:
    """What wraps each call of the site: per-bucket choice (dynamic dims), first-call
    verification of the kernel it runs, both, or neither."""
    verifier = (
        FirstCallVerifier(rec.pattern.tolerance, rec.pattern.timeout)
        if mode == "first_call"
        else None
    )
    if rec.dispatch is None:
        return verifier
    rec.dispatch.inner = verifier
    return rec.dispatch


def _fingerprint(gm: fx.GraphModule) -> str:
    """What makes two compiled graphs' call sites interchangeable: the graph's text, its
    inputs' shapes and dtypes, and the identity of its constants (with Inductor's freezing,
    the weights: two models of one architecture must not share sites then)."""
    h = hashlib.sha256(str(gm.graph).encode())
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            v = n.meta.get("val")
            h.update(repr((getattr(v, "shape", v), getattr(v, "dtype", None))).encode())
        elif n.op == "get_attr":
            obj: Any = gm
            for part in str(n.target).split("."):
                obj = getattr(obj, part, None)
            h.update(f"{n.target}={id(obj)}".encode())
    return h.hexdigest()


def _site_key(graph_id: str, rec: Record, site: CallSite) -> int:
    """A call site's id, stable across compilations of the same graph (binding.new_site):
    the constant Inductor's FX graph cache sees is then the same, and a recompile after
    ``torch._dynamo.reset()`` finds the code it compiled before."""
    k = rec.kernel
    text = "|".join(
        map(
            str,
            (
                graph_id,
                site.node,
                k.name,
                k.version,
                k.digest,
                rec.pattern.where,
                site.verify,
                type(site.intercept).__name__,
                rec.pattern.tolerance,
                site.transposed,
                site.guard,
            ),
        )  # fmt: skip
    )
    return int(hashlib.sha256(text.encode()).hexdigest()[:15], 16) | (1 << 61)


def _user_line(node: fx.Node) -> str:
    trace = node.meta.get("stack_trace") or ""
    lines = [ln.strip() for ln in trace.strip().splitlines() if ln.strip().startswith("File ")]
    if not lines:
        return ""
    last = lines[-1]  # File "model.py", line 12, in forward
    try:
        file = last.split('"')[1]
        line = last.split(", line ")[1].split(",")[0]
        return f"{file}:{line}"
    except IndexError:
        return last


def _call_goes(graph: fx.Graph, s: _Session, rec: Record, outs_of: dict[int, list[fx.Node]]) -> Any:
    """Where a record's kernel call is inserted (see ``_Session._placement``)."""
    if rec.after is None:  # before the first root
        return graph.inserting_before(min(map(_root_of, rec.outputs), key=s.order.__getitem__))
    a = rec.after  # right after an argument computed after the first root
    return graph.inserting_after(outs_of[a.record][-1] if isinstance(a, SubRef) else s.fx_node(a))


def _rewrite_fx(gm: fx.GraphModule, s: _Session, verify: bool | str) -> list[Substitution]:
    graph = gm.graph
    mode = resolve_mode(verify)
    fallbacks = [_fallback_module(gm, s, rec) for rec in s.records]  # before any edit
    outs_of: dict[int, list[fx.Node]] = {}
    subs: list[Substitution] = []
    views: list[fx.Node] = []  # canonical t(weight) nodes that call sites took over

    def arg(r: Ref) -> Any:
        if isinstance(r, Const):
            return r.value
        if isinstance(r, ListRef):
            return [arg(x) for x in r.items]
        if isinstance(r, SubRef):
            return outs_of[r.record][r.index]
        return s.fx_node(r)

    graph_id = _fingerprint(gm)  # before any edit
    for k, rec in enumerate(s.records):
        anchor = max(rec.outputs, key=lambda n: s.order.get(n, -1))
        root = cast(fx.Node, anchor.args[0]) if anchor.target is operator.getitem else anchor
        args = [arg(r) for r in rec.args]
        transposed = weight_views(rec.kernel, args)
        for i in transposed:
            views.append(cast(fx.Node, args[i]))
            args[i] = views[-1].args[0]  # the parameter; the site transposes it
        site = CallSite(
            kernel=rec.kernel,
            pattern=f"{rec.pattern.name} ({rec.pattern.where})",
            node=root.name,
            user_line=_user_line(root),
            fallback=fallbacks[k],
            verify=mode == "strict",
            intercept=_intercept(rec, mode),
            guard=needs_guard(rec.kernel, [s.example(r) for r in rec.args]),
            transposed=transposed,
        )
        op = bind(rec.kernel)
        with _call_goes(graph, s, rec, outs_of):
            call = graph.call_function(
                op, (*args, new_site(site, gm, _site_key(graph_id, rec, site)))
            )
        call.meta.update(
            {k2: v for k2, v in root.meta.items() if k2 in ("stack_trace", "nn_module_stack")}
        )
        vals = [o.meta.get("val") for o in rec.outputs]
        if len(rec.outputs) == 1:
            call.meta["val"] = vals[0]
            outs = [call]
        else:
            call.meta["val"] = tuple(vals)
            outs = []
            for j, v in enumerate(vals):
                with graph.inserting_after(outs[-1] if outs else call):
                    g = graph.call_function(operator.getitem, (call, j))
                g.meta["val"] = v
                outs.append(g)
        for orig, new in zip(rec.outputs, outs, strict=True):
            orig.replace_all_uses_with(new)
        outs_of[k] = outs
        subs.append(
            Substitution(
                pattern=rec.pattern.name,
                pattern_where=rec.pattern.where,
                op=rec.op,
                kernel=rec.kernel.name,
                kernel_source=rec.kernel.source,
                root=root.name,
                replaced=[],
                args=[describe_value(a) if not isinstance(a, list) else repr(a) for a in args],
                user_line=site.user_line,
                passed_over=rec.passed_over,
                tuning=rec.tuning,
            )
        )
    # Only what a substitution replaced can have become dead; the rest is Inductor's to clean.
    for n in sorted(
        {n for rec in s.records for n in rec.slice}, key=s.order.__getitem__, reverse=True
    ):
        if not n.users and (not n.is_impure() or _deterministic(n)):
            graph.erase_node(n)
    for n in dict.fromkeys(views):
        if not n.users:
            graph.erase_node(n)
    alive = set(graph.nodes)
    for rec, sub in zip(s.records, subs, strict=True):
        sub.replaced = [n.name for n in reversed(rec.slice) if n not in alive]
    graph.lint()
    return subs


def pattern_names(patterns: Sequence[Pattern]) -> list[str]:
    return [p.name for p in patterns]


def _deterministic(n: fx.Node) -> bool:
    """An op FX counts impure (every nondeterministic-seeded op) that is deterministic here:
    ``aten.dropout(x, p, train=False)``, the identity, and ``scaled_dot_product_attention``
    with dropout_p 0 (its default). A pattern that reads through one (linear -> dropout ->
    add, QKV -> SDPA -> quantize) leaves it dead, and with it what fed it, in the graph users
    see."""
    aten = torch.ops.aten
    if n.target is aten.dropout.default:
        return n.args[2:3] == (False,)
    if n.target is aten.scaled_dot_product_attention.default:
        p = n.args[4] if len(n.args) > 4 else n.kwargs.get("dropout_p", 0.0)
        return isinstance(p, float | int) and p == 0.0
    return False

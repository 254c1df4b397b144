"""Why a pattern did not match: the first failing op, operand or constraint, in user words.

MLIR's PDL interpreter only says *that* a pattern failed. For ``pdlkit explain --why P``,
pdlkit walks P's ``pdl.pattern`` body in Python against the Torch-dialect IR, starting at
each candidate root op (ops of the root's name): from the root up through operands, one
``pdl.operation`` at a time, then the native constraints in the order the file lists them.
The first mismatch is reported with the pattern's own names (``%w``, read from the pattern
file's line) and the graph's FX node names::

    root gelu: operand 0 of gelu (torch.aten.gelu) comes from matmul (torch.aten.matmul);
        the pattern wants %linear = torch.aten.linear (line 7)
    root linear_2: constraint has_dtype(%wq, "int8") (line 34): %wq = arg1_1 dtype is
        bfloat16, the constraint wants int8

The walk is exact for what pdlkit's patterns use (named ``pdl.operation`` with a fixed
operand list, ``pdl.operand``, ``pdl.result``, ``pdl.type``, ``pdl.attribute``, the
native constraints of :mod:`pdlkit.matcher.natives`); for other constructs (``pdl.operands``,
``pdl.results``, an op not reachable from the root through operands) it says
"unexplained" rather than guess.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdlkit.matcher import natives
from pdlkit.matcher.patterns import Pattern
from torch_mlir import ir

Describe = Callable[[Any], str]


def _loc(op: Any) -> str:
    return getattr(getattr(op, "location", None), "name_str", "") or ""


@dataclass
class Candidate:
    root: str  # the FX node the walk started at
    ops: tuple[int, int]  # pattern ops matched, of
    constraints: tuple[int, int]  # constraints that hold, of
    failure: str  # the first mismatch; "" when everything the walk can check holds

    @property
    def progress(self) -> int:
        return self.ops[0] + self.constraints[0]

    def __str__(self) -> str:
        got = f"ops {self.ops[0]}/{self.ops[1]}, constraints {self.constraints[0]}/{self.constraints[1]}"
        return f"root {self.root} ({got}): {self.failure or 'every op and constraint holds'}"


class _Unexplained(Exception):
    pass


class _Mismatch(Exception):
    pass


@dataclass
class _Walk:
    """One walk's state: what each pattern value matched so far, the pattern ops still to
    visit (with the graph op each must match and how it was reached), how values read."""

    bound: dict[Any, Any]
    stack: list[Any]
    describe: Describe


class PatternWalk:
    """One ``pdl.pattern``'s matcher, ready to be walked against candidate roots."""

    def __init__(self, pattern_op: Any, file: Path | None = None):
        block = pattern_op.regions[0].blocks[0]
        self.ops = [o for o in block.operations if o.operation.name != "pdl.rewrite"]
        rewrite = next(o for o in block.operations if o.operation.name == "pdl.rewrite")
        self.root_value = rewrite.operation.operands[0] if rewrite.operation.operands else None
        self.file = str(file) if file is not None else ""
        self._sources: dict[str, list[str]] = {}
        self.n_ops = sum(1 for o in self.ops if o.operation.name == "pdl.operation")
        self.constraints = [
            o for o in self.ops if o.operation.name == "pdl.apply_native_constraint"
        ]

    # names from the pattern file -----------------------------------------------------------
    def line(self, op: Any) -> str:
        """``7``, or ``file.pdll:7`` when the location is in another file (PDL from PDLL)."""
        loc = op.location
        n, f = getattr(loc, "start_line", 0), getattr(loc, "filename", "")
        return f"{f}:{n}" if f and self.file and f != self.file else str(n)

    def _source(self, filename: str) -> list[str]:
        lines = self._sources.get(filename)
        if lines is None:
            try:
                lines = Path(filename).read_text().splitlines()
            except OSError:
                lines = []
            self._sources[filename] = lines
        return lines

    def name(self, value: Any) -> str:
        """``%w`` for a pdl value, read from its defining line (MLIR keeps no SSA names);
        for PDL compiled from PDLL, ``w`` of ``w: Value`` at the location or of ``let w``."""
        loc = value.owner.location
        n, col = getattr(loc, "start_line", 0), getattr(loc, "start_col", 0)
        lines = self._source(getattr(loc, "filename", "") or self.file)
        if not 0 < n <= len(lines):
            return ""
        text = lines[n - 1]
        m = re.match(r"\s*(%[\w.$-]+)\s*=", text) or re.match(r"(\w+)\s*:", text[max(col - 1, 0) :])
        m = m or re.match(r"\s*let\s+(\w+)", text)
        return m.group(1) if m else ""

    def op_text(self, pdl_op: Any) -> str:
        nm = self.name(pdl_op.operation.results[0])
        name = pdl_op.opName.value if pdl_op.opName is not None else "any op"
        return f"{nm} = {name} (line {self.line(pdl_op.operation)})"

    # the walk ---------------------------------------------------------------------------------
    def walk(self, root: ir.Operation, describe: Describe) -> Candidate:
        """The walk from ``root``; a construct it does not know reads "unexplained"."""
        try:
            return self._walk(root, describe)
        except Exception as e:  # never let explain fail on a pattern the walk cannot read
            name = _loc(root) or root.name
            why = f"unexplained: the walk could not read the pattern ({type(e).__name__}: {e})"
            return Candidate(name, (0, self.n_ops), (0, len(self.constraints)), why)

    def _walk(self, root: ir.Operation, describe: Describe) -> Candidate:
        root_name = _loc(root) or root.name
        matched = 0

        def candidate(held: int, failure: str) -> Candidate:
            return Candidate(
                root_name, (matched, self.n_ops), (held, len(self.constraints)), failure
            )

        if self.root_value is None:
            return candidate(0, "unexplained: no root")
        try:
            w = _Walk({}, [(self.root_value.owner, root, "the root")], describe)
            while w.stack:
                pdl_op, ir_op, via = w.stack.pop()
                self._match_op(pdl_op, ir_op, via, w)
                matched += 1
            if matched < self.n_ops:
                raise _Unexplained(
                    "unexplained: the pattern has ops that are not reached from the root "
                    "through operands"
                )
        except (_Mismatch, _Unexplained) as e:
            return candidate(0, str(e))
        held = 0
        for c in self.constraints:
            op = c.operation
            name = op.attributes["name"].value
            fn = natives.CONSTRAINTS.get(name)
            values = [self._value(a, w.bound) for a in op.operands]
            names = [self.name(a) for a in op.operands]
            if fn is None or any(v is _UNBOUND for v in values):
                why = (
                    f"unexplained: constraint {name} (line {self.line(op)}) cannot be checked here"
                )
                return candidate(held, why)
            try:
                ok = bool(fn(*values))
            except Exception as e:
                ok, why = False, f"raised {type(e).__name__}: {e}"
            else:
                why = "" if ok else natives.explain(name, values, describe, names)
            if bool(op.attributes["isNegated"]) if "isNegated" in op.attributes else False:
                ok, why = not ok, "" if ok else f"its negation holds ({name} is false)"
            if not ok:
                args = ", ".join(n or "?" for n in names)
                return candidate(held, f"constraint {name}({args}) (line {self.line(op)}): {why}")
            held += 1
        return candidate(held, "")

    def _value(self, pdl_value: Any, bound: dict[Any, Any]) -> Any:
        owner = pdl_value.owner.operation
        if owner.name == "pdl.attribute":
            attrs = owner.attributes
            return attrs["value"] if "value" in attrs else bound.get(pdl_value, _UNBOUND)
        return bound.get(pdl_value, _UNBOUND)

    def _match_op(self, pdl_op: Any, ir_op: ir.Operation, via: str, w: _Walk) -> None:
        pdl_op = pdl_op.operation.opview
        me = pdl_op.operation.results[0]
        if me in w.bound:
            if w.bound[me] != ir_op:
                raise _Mismatch(f"{via} must be the op {self.name(me)} already matched, it is not")
            return
        here = _loc(ir_op) or ir_op.name
        want = pdl_op.opName.value if pdl_op.opName is not None else None
        if want is not None and ir_op.name != want:
            what = _op_label(ir_op)
            raise _Mismatch(f"{via} is {what}; the pattern wants {self.op_text(pdl_op)}")
        w.bound[me] = ir_op
        self._match_attributes(pdl_op, ir_op, here, w.bound)
        self._match_operands(pdl_op, ir_op, here, w)
        self._match_result_types(pdl_op, ir_op, here, w.bound)

    def _match_attributes(
        self, pdl_op: Any, ir_op: ir.Operation, here: str, bound: dict[Any, Any]
    ) -> None:
        for aname, avalue in zip(pdl_op.attributeValueNames, pdl_op.attributeValues, strict=True):
            key = ir.StringAttr(aname).value
            if key not in ir_op.attributes:
                raise _Mismatch(f"{here} has no attribute {key!r}; the pattern wants one")
            have = ir_op.attributes[key]
            fixed = self._value(avalue, bound)
            if fixed is _UNBOUND:
                bound[avalue] = have
            elif str(fixed) != str(have):
                raise _Mismatch(f"{here} has {key} = {have}; the pattern wants {fixed}")

    def _match_operands(self, pdl_op: Any, ir_op: ir.Operation, here: str, w: _Walk) -> None:
        operands = list(pdl_op.operandValues)
        if any(_kind(v) == "pdl.operands" for v in operands):
            raise _Unexplained("unexplained: the pattern matches a variadic operand list")
        # PDLL writes an op's result as an operand as `pdl.results of %op` (all its results)
        ranges = [i for i, v in enumerate(operands) if _is_range(v)]
        if len(ranges) > 1:
            raise _Unexplained("unexplained: the pattern passes several result ranges to one op")
        width = len(ir_op.operands) - len(operands) + 1 if ranges else 1
        if operands and (width < 1 or (not ranges and len(operands) != len(ir_op.operands))):
            raise _Mismatch(
                f"{here} has {len(ir_op.operands)} operands; the pattern lists {len(operands)}"
            )
        pos = 0
        for i, pv in enumerate(operands):
            where = f"operand {pos} of {here} ({ir_op.name})"
            if i in ranges:
                self._match_results(pv, list(ir_op.operands)[pos : pos + width], where, w)
                pos += width
                continue
            self._match_operand(i, pv, ir_op.operands[pos], where, w)
            pos += 1

    def _match_operand(self, i: int, pv: Any, actual: Any, where: str, w: _Walk) -> None:
        """Operand ``i`` of the pattern's op (``pv``) against the graph's value ``actual``."""
        bound, describe = w.bound, w.describe
        src = pv.owner.operation
        if src.name == "pdl.operand":
            if pv in bound and bound[pv] != actual:
                raise _Mismatch(
                    f"{where} is {describe(actual)}, but {self.name(pv)} is already "
                    f"{describe(bound[pv])}"
                )
            bound[pv] = actual
            vt = src.opview.valueType
            if vt is not None:
                self._match_type(vt, actual.type, where, bound)
        elif src.name in ("pdl.result", "pdl.results"):
            index = src.opview.index.value
            parent = src.opview.parent
            if not isinstance(actual, ir.OpResult):
                raise _Mismatch(
                    f"{where} is the graph input {describe(actual)}; the pattern wants the "
                    f"result of {self.op_text(parent.owner)}"
                )
            res = ir.OpResult(actual)
            if res.result_number != index:
                raise _Mismatch(
                    f"{where} is result {res.result_number} of {_op_label(res.owner.operation)}; "
                    f"the pattern wants result {index}"
                )
            if pv in bound and bound[pv] != actual:
                raise _Mismatch(f"{where} differs from {self.name(pv)}")
            bound[pv] = actual
            w.stack.append((parent.owner, res.owner.operation, where))
        else:
            raise _Unexplained(f"unexplained: operand {i} is defined by {src.name}")

    def _match_result_types(
        self, pdl_op: Any, ir_op: ir.Operation, here: str, bound: dict[Any, Any]
    ) -> None:
        types = list(pdl_op.typeValues)
        if len(types) == 1 and _kind(types[0]) == "pdl.types":
            fixed = types[0].owner.operation.opview.constantTypes
            have = [str(r.type) for r in ir_op.results]
            if fixed is not None and [str(ir.TypeAttr(t).value) for t in fixed] != have:
                raise _Mismatch(
                    f"the results of {here} have types {have}; the pattern wants {fixed}"
                )
            return
        if any(_kind(t) == "pdl.types" for t in types):
            raise _Unexplained("unexplained: the pattern matches a variadic result list")
        if types and len(types) != len(ir_op.results):
            raise _Mismatch(
                f"{here} has {len(ir_op.results)} results; the pattern lists {len(types)}"
            )
        for t, r in zip(types, ir_op.results, strict=False):
            self._match_type(t, r.type, f"the result of {here}", bound)

    def _match_results(self, pv: Any, actual: list[Any], where: str, w: _Walk) -> None:
        """``pdl.results of %op`` as operands: every result of one op, in order."""
        parent = pv.owner.operation.opview.parent
        owners = {ir.OpResult(a).owner.operation for a in actual if isinstance(a, ir.OpResult)}
        if len(owners) != 1 or not all(isinstance(a, ir.OpResult) for a in actual):
            raise _Mismatch(
                f"{where} is not the result of one op; the pattern wants the results of "
                f"{self.op_text(parent.owner)}"
            )
        owner = owners.pop()
        numbers = [ir.OpResult(a).result_number for a in actual]
        if numbers != list(range(len(owner.results))):
            raise _Mismatch(
                f"{where} is not every result of {_op_label(owner)}; the pattern wants all of "
                f"{self.op_text(parent.owner)}"
            )
        w.bound[pv] = tuple(actual)
        w.stack.append((parent.owner, owner, where))

    def _match_type(self, pdl_type: Any, actual: Any, where: str, bound: dict[Any, Any]) -> None:
        fixed = pdl_type.owner.operation.opview.constantType
        if fixed is not None:
            if str(fixed.value) != str(actual):
                raise _Mismatch(f"{where} has type {actual}; the pattern wants {fixed.value}")
            return
        if pdl_type in bound and str(bound[pdl_type]) != str(actual):
            raise _Mismatch(
                f"{where} has type {actual}, but {self.name(pdl_type)} is already "
                f"{bound[pdl_type]} (the pattern uses one type for both)"
            )
        bound[pdl_type] = actual


_UNBOUND = object()


def _kind(v: Any) -> str:
    return str(v.owner.operation.name)


def _is_range(v: Any) -> bool:
    op = v.owner.operation
    return op.name == "pdl.results" and op.opview.index is None


def _op_label(op: Any) -> str:
    name = _loc(op)
    if name.startswith("pdlkit.sub"):
        kernel = op.attributes["name"].value if "name" in op.attributes else "a kernel"
        return f"a kernel call ({kernel}) that an earlier pattern made"
    if op.name == "torch.operator" and "name" in op.attributes:
        return f"{name or '?'} (torch.operator {op.attributes['name'].value})"
    return f"{name or '?'} ({op.name})"


# -- explain --why for one pattern over one graph (called by matcher/substitute.py) -----------

MAX_WALKED = 50  # candidate roots walked per pattern


def _mlir_name(node: Any) -> str:
    schema = getattr(node.target, "_schema", None)
    return "torch." + schema.name.replace("::", ".") if schema is not None else ""


def walk_candidates(
    p: Pattern, pattern_op: Any, func: ir.Operation, describe: Describe
) -> list[Any]:
    """Walk pattern ``p`` (its ``pdl.pattern`` op) from each of its candidate roots in
    ``func`` (at most ``MAX_WALKED``): a :class:`Candidate` each, then a line for the rest."""
    if p.root is None:
        return []
    walk = PatternWalk(pattern_op, p.file)
    ops = func.regions[0].blocks[0].operations
    roots = [op.operation for op in ops if op.operation.name == p.root]
    return [walk.walk(op, describe) for op in roots[:MAX_WALKED]] + (
        [f"... and {len(roots) - MAX_WALKED} more candidate root(s)"]
        if len(roots) > MAX_WALKED
        else []
    )


def pattern_why(
    name: str,
    patterns: Sequence[Pattern],
    target: Any,
    records: Sequence[Any],
    near: Sequence[Any],
    walked: list[Any] | None,
    walk: Callable[[Pattern], list[Any]],
) -> list[str]:
    """For ``explain --why``: each candidate root of pattern ``name`` with its first mismatch,
    closest matches first. ``records`` and ``near`` are the application's substitution
    records and near misses; ``walked`` is the walk made just before the pattern was applied
    (None when it was not applied: then ``walk(pattern)`` walks the final IR)."""
    p = next((q for q in patterns if q.name == name), None)
    if p is None:
        known = ", ".join(q.name for q in patterns)
        return [f"no pattern named {name!r} is loaded (loaded: {known})"]
    lines = []
    if not p.active_on(target):
        why = (
            "it is disabled"
            if not p.enabled
            else f"its targets {list(p.targets)} exclude {target.name}"
        )
        lines.append(f"not applied: {why}")
    if p.root is None:
        return [*lines, "unexplained: the pattern's root op has no fixed name"]
    fired = {r.outputs[-1].name: r for r in records if r.pattern.name == name}
    for r in records:
        if r.pattern.name != name:
            for n in r.slice:
                if _mlir_name(n) == p.root:
                    lines.append(
                        f"root {n.name}: claimed first by pattern {r.pattern.name} "
                        f"(benefit {r.pattern.benefit}) -> kernel {r.kernel.name}"
                    )
    found = walked if walked is not None else walk(p)
    cands = [c for c in found if not isinstance(c, str)]
    if not cands and not lines:
        lines.append(f"no candidate root: op {p.root} does not occur in the graph")
    for c in sorted(cands, key=lambda c: -c.progress):
        if c.root in fired:
            lines.append(f"root {c.root}: matched -> kernel {fired[c.root].kernel.name}")
            continue
        if not c.failure:
            nm = [m for m in near if m.pattern == name and c.root in m.at]
            c.failure = (
                nm[0].reason
                if nm
                else "unexplained: every op and constraint pdlkit can check holds, yet MLIR's "
                "PDL interpreter did not match here"
            )
        lines.append(str(c))
    lines.extend(c for c in found if isinstance(c, str))
    return lines

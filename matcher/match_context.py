"""One MLIR context per pattern set: the patterns parsed once, their natives registered, frozen.

    before: each compilation parsed every pattern file and registered pdlkit's natives again
    after:  match_context(patterns) is built on the pattern set's first use and kept with it
            (PatternSet._cache), so a second compilation against it only imports its graph

Each frozen set serves one batch of patterns applied in the same walk (:func:`batches`); its
native constraints and ``pdlkit_call`` report to the :class:`~pdlkit.matcher.match.MatchSession`
of the application in progress (``MatchContext.session``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pdlkit.matcher import natives
from pdlkit.matcher.pattern_file import Pattern, read_pdl_module
from pdlkit.matcher.patterns import PatternSet
from pdlkit.matcher.pdl_checks import nested_ops
from pdlkit.matcher.records import SubstitutionError
from pdlkit.matcher.to_mlir import GraphImporter, new_context
from torch_mlir import ir, rewrite

if TYPE_CHECKING:
    from pdlkit.matcher.match import MatchSession


class MatchContext:
    """One MLIR context per pattern set: parsed patterns, natives registered, frozen once."""

    def __init__(self, patterns: PatternSet):
        self.ctx = new_context()
        self.importer = GraphImporter(self.ctx)  # its type cache lives as long as ctx
        self.session: MatchSession | None = None
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

    def pattern_op(self, name: str) -> Any:
        """Pattern ``name``'s ``pdl.pattern`` op as parsed in this context."""
        return self._ops[name]

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
                    why = natives.explain(name, values, s.describe, [""] * len(values))
                    s.near_miss(at, f"constraint {name}({args}) does not hold: {why}")
                else:
                    s.near_count[p.name] += 1

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


def batches(active: list[Pattern]) -> list[list[Pattern]]:
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
    """The pattern set's match context, built on its first use and kept with it."""
    mc = patterns._cache.get("match")
    if mc is None:
        mc = patterns._cache["match"] = MatchContext(patterns)
    return mc

"""What the pass did and did not do, as data and as a readable table.

``str(report)`` is what ``pdlkit explain`` prints::

    pdlkit explain: 1 graph, 2 substitutions, target host (x86_64; ...)
    patterns loaded (2):
      linear_gelu   benefit 1  root torch.aten.gelu  patterns/cpu/linear_gelu.pdl.mlir:9
      ...
    graph 0 (14 nodes): 2 substitutions
      linear_gelu -> linear_gelu_numba   replaced gelu, linear   args x, w, b, 'none'
    near misses:
      linear_gelu at linear_1: constraint single_use(linear_1) failed
    patterns that matched nothing:
      linear_relu: root op torch.aten.relu does not occur in the graph
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Substitution:
    pattern: str
    pattern_where: str
    op: str  # logical op
    kernel: str
    kernel_source: str
    root: str  # FX node the call replaced (the last root)
    replaced: list[str]  # FX nodes that disappeared
    args: list[str]
    user_line: str = ""
    passed_over: list[str] = field(default_factory=list)  # higher-ranked kernels, and why not
    tuning: str = ""  # measured choice: each candidate's time (autotune)


@dataclass
class NearMiss:
    pattern: str
    at: tuple[str, ...]
    _reason: str | Callable[[], str]

    @property
    def reason(self) -> str:
        r = self._reason
        return r() if callable(r) else r


@dataclass(frozen=True)
class NodeInfo:
    """One FX node of the graph before substitution (for the HTML picture)."""

    name: str
    op: str  # "aten.linear", "placeholder", ...
    inputs: tuple[str, ...]
    shape: str = ""  # "f32[8, 64, 256]"
    flops: int = 0  # estimated: 2*M*N*K for GEMMs, one per output element otherwise


@dataclass
class GraphReport:
    index: int
    nodes: int
    substitutions: list[Substitution] = field(default_factory=list)
    near_misses: list[NearMiss] = field(default_factory=list)
    silent: dict[str, str] = field(default_factory=dict)  # pattern -> why it matched nothing
    kept: list[str] = field(default_factory=list)  # matches left to Inductor: measured faster
    skipped: str = ""  # why the whole graph was left alone
    canonicalized: dict[str, int] = field(default_factory=dict)  # canonicalize rule -> count
    why: dict[str, list[str]] = field(default_factory=dict)  # explain --why: pattern -> lines
    timings: dict[str, float] = field(
        default_factory=dict
    )  # seconds: retrace, import, apply, rewrite
    graph_before: str = field(default="", repr=False)
    graph_after: str = field(default="", repr=False)
    fx_nodes: list[NodeInfo] = field(default_factory=list, repr=False)  # kept by explain()


@dataclass
class PatternInfo:
    name: str
    where: str
    benefit: int
    root: str | None
    active: bool
    note: str = ""


@dataclass
class Report:
    """Everything ``pdlkit.explain`` learned; ``str()`` is a readable table."""

    target: str
    patterns: list[PatternInfo] = field(default_factory=list)
    kernels: list[str] = field(default_factory=list)
    graphs: list[GraphReport] = field(default_factory=list)

    @property
    def substitutions(self) -> list[Substitution]:
        return [s for g in self.graphs for s in g.substitutions]

    @property
    def near_misses(self) -> list[NearMiss]:
        return [m for g in self.graphs for m in g.near_misses]

    def silent_patterns(self) -> dict[str, str]:
        """Patterns that matched in no graph, with the reason from the last graph."""
        fired = {s.pattern for s in self.substitutions}
        out: dict[str, str] = {}
        for g in self.graphs:
            for name, why in g.silent.items():
                if name not in fired:
                    out[name] = why
        return out

    def counts(self) -> dict[str, int]:
        c: dict[str, int] = {}
        for s in self.substitutions:
            c[s.pattern] = c.get(s.pattern, 0) + 1
        return c

    def to_html(self, path: Any) -> None:
        """Write the report as one self-contained HTML page (graph, regions, near misses)."""
        from pdlkit.matcher.html_report import write_html

        write_html(self, path)

    def __str__(self) -> str:
        lines = [
            f"pdlkit explain: {len(self.graphs)} graph(s), {len(self.substitutions)} substitution(s), "
            f"target {self.target}",
            f"patterns loaded ({len(self.patterns)}):",
        ]
        w = max((len(p.name) for p in self.patterns), default=0)
        for p in self.patterns:
            state = "" if p.active else f"  [inactive: {p.note}]"
            lines.append(
                f"  {p.name:<{w}}  benefit {p.benefit:<3} root {p.root or '?':<28} {p.where}{state}"
            )
        if self.kernels:
            lines.append(f"kernels loaded ({len(self.kernels)}): " + ", ".join(self.kernels))
        for g in self.graphs:
            lines.append(
                f"graph {g.index} ({g.nodes} nodes): {len(g.substitutions)} substitution(s)"
            )
            if g.skipped:
                lines.append(f"  left to the default code generator: {g.skipped}")
            rows = [
                (
                    f"{s.pattern} -> {s.kernel}",
                    f"at {s.root}",
                    "replaced " + ", ".join(s.replaced),
                    "args " + ", ".join(s.args),
                )
                for s in g.substitutions
            ]
            lines.extend(_table(rows, indent="  "))
            for s in g.substitutions:
                for why in s.passed_over:
                    lines.append(f"    {s.root}: passed over {why}")
                if s.tuning:
                    lines.append(f"    {s.root}: {s.tuning}")
            if g.kept:
                lines.append(
                    f"  kept for Inductor, measured faster than every kernel ({len(g.kept)}):"
                )
                lines.extend(f"    {k}" for k in g.kept)
            canon = {k: n for k, n in g.canonicalized.items() if k != "spell_defaults"}
            if canon:
                lines.append(
                    "  canonical forms: " + ", ".join(f"{k} x{n}" for k, n in canon.items())
                )
            if g.timings:
                lines.append(
                    "  pass time: "
                    + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in g.timings.items())
                )
        misses = self.near_misses
        if misses:
            lines.append(f"near misses ({len(misses)}):")
            lines.extend(f"  {m.pattern} at {', '.join(m.at) or '?'}: {m.reason}" for m in misses)
        silent = self.silent_patterns()
        if silent:
            lines.append("patterns that matched nothing:")
            lines.extend(f"  {name}: {why}" for name, why in silent.items())
        lines.extend(self._zero_fire())
        for name in dict.fromkeys(n for g in self.graphs for n in g.why):
            lines.append(f"why {name} did not match (closest candidates first):")
            for g in self.graphs:
                if name in g.why:
                    lines.append(f"  graph {g.index}:")
                    lines.extend(f"    {line}" for line in g.why[name] or ["no candidate"])
        return "\n".join(lines)

    def silent_files(self) -> list[str]:
        """Pattern files none of whose active patterns fired in this model."""
        fired = {s.pattern for s in self.substitutions}
        files: dict[str, bool] = {}
        for p in self.patterns:
            if p.active:
                f = p.where.rsplit(":", 1)[0]
                files[f] = files.get(f, False) or p.name in fired
        return [f for f, any_fired in files.items() if not any_fired]

    def _zero_fire(self) -> list[str]:
        active = [p for p in self.patterns if p.active]
        if not active or not self.graphs or any(g.skipped for g in self.graphs):
            return []
        if not self.substitutions:
            return [
                f"NO SUBSTITUTION: none of the {len(active)} active pattern(s) fired in this "
                "model; see the near misses above, or `pdlkit explain --why PATTERN`"
            ]
        files = self.silent_files()
        return [f"pattern file fired 0 times in this model: {f}" for f in files]


def _table(rows: Sequence[tuple[str, ...]], indent: str) -> list[str]:
    if not rows:
        return []
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip() for r in rows]


def describe_value(v: Any) -> str:
    """A short text for a kernel argument in the report (an FX node name or a literal)."""
    return v.name if hasattr(v, "name") and hasattr(v, "op") else repr(v)

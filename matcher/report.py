"""What the pass did and did not do, as data and as a readable table.

``str(report)`` is what ``pdlkit explain`` prints: one line per substitution (pattern ->
kernel, the node it replaced, the model's source line), one line per site with the
candidates' measured times, the sites kept for Inductor, the near misses grouped by
pattern and reason, and counts of what did not apply::

    pdlkit explain: 2 substitution(s) in 1 graph(s), target host (x86_64; ...)
    patterns: 47 loaded, 22 for this target; kernels: 49 loaded
    graph 0 (14 nodes): 2 substitution(s)
      linear_gelu -> linear_gelu_onednn  at gelu      model.py:14
      linear -> linear_onednn            at linear_1  model.py:14
        gelu: measured: linear_gelu_onednn 31.2 us, subgraph 40.1 us (Inductor) -> linear_gelu_onednn
    near misses (1):
      linear_relu at relu: constraint single_use(linear_2) failed
    44 pattern(s) did not apply here (23 for other targets, 2 disabled, 19 whose ops do not occur)

``report.format(verbose=True)`` (``pdlkit explain --verbose``) adds every pattern and kernel
loaded, each substitution's replaced nodes and arguments, the kernels passed over, every
pattern that matched nothing and why, and the pass's times.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pdlkit.matcher.hedges import Stakes
from pdlkit.matcher.html_report import NodeInfo, write_html
from pdlkit.runtime_abi.autotune import MARGIN

_MARGIN = f"{MARGIN:.0%}"


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


@dataclass
class GraphReport:
    index: int
    nodes: int
    substitutions: list[Substitution] = field(default_factory=list)
    near_misses: list[NearMiss] = field(default_factory=list)
    silent: dict[str, str] = field(default_factory=dict)  # pattern -> why it matched nothing
    kept: list[str] = field(default_factory=list)  # matches left to Inductor: measured faster
    whole_graph: str = ""  # the substituted graph against Inductor's, timed (graph_guard.py)
    sites_saved_us: float | None = None  # the substituted sites' measured saving (choose.py)
    # their library calls that bound Inductor's time from below (choose.Tuner.library_calls),
    # held for the compile's whole-graph check (the backend frees them once it has compiled)
    library_calls: list[Callable[[], float]] = field(default_factory=list, repr=False)
    # which other graphs with substitutions the whole-graph check compiles (choose.py's tuner)
    hedges: Stakes = field(default_factory=Stakes)
    sites_unsteady: bool = False  # some site was timed on a busy host (choose.py)
    skipped: str = ""  # why the whole graph was left alone
    canonicalized: dict[str, int] = field(default_factory=dict)  # canonicalize rule -> count
    why: dict[str, list[str]] = field(default_factory=dict)  # explain --why: pattern -> lines
    timings: dict[str, float] = field(
        default_factory=dict
    )  # seconds: retrace, import, apply, rewrite
    graph_before: str = field(default="", repr=False)
    graph_after: str = field(default="", repr=False)
    fx_nodes: list[NodeInfo] = field(default_factory=list, repr=False)  # kept by explain()

    def merge(self, region: GraphReport) -> None:
        """Add the findings of a region of this graph (``retrace.mode_regions``); a pattern
        is silent only if it is silent in both."""
        self.nodes += region.nodes
        self.substitutions += region.substitutions
        self.near_misses += region.near_misses
        self.kept += region.kept
        self.silent = {k: v for k, v in self.silent.items() if k in region.silent}
        for name, n in region.canonicalized.items():
            self.canonicalized[name] = self.canonicalized.get(name, 0) + n
        for name, lines in region.why.items():
            self.why[name] = self.why.get(name, []) + lines
        for phase, seconds in region.timings.items():
            self.timings[phase] = self.timings.get(phase, 0.0) + seconds


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
    # what the model itself says about a zero-fire result (``explain``: weights of tensor
    # subclasses, such as torchao's ``quantize_`` makes), printed after NO SUBSTITUTION
    model_notes: list[str] = field(default_factory=list)

    @property
    def substitutions(self) -> list[Substitution]:
        return [s for g in self.graphs for s in g.substitutions]

    @property
    def near_misses(self) -> list[NearMiss]:
        return [m for g in self.graphs for m in g.near_misses]

    def silent_patterns(self) -> dict[str, str]:
        """Patterns that matched in no graph, with the reason from the last graph."""
        fired = {s.pattern for s in self.substitutions}
        return {n: why for g in self.graphs for n, why in g.silent.items() if n not in fired}

    def counts(self) -> dict[str, int]:
        return dict(Counter(s.pattern for s in self.substitutions))

    def to_html(self, path: Any) -> None:
        """Write the report as one self-contained HTML page (graph, regions, near misses)."""
        write_html(self, path)

    def __str__(self) -> str:
        return self.format(verbose=False)

    def format(self, verbose: bool = False) -> str:
        """The report as text: a short table (one line per substitution, each kept site and
        the near misses), or with ``verbose`` every pattern and kernel loaded, the kernels
        passed over, the patterns that did not apply and the pass's times."""
        lines = [
            f"pdlkit explain: {len(self.substitutions)} substitution(s) in {len(self.graphs)} "
            f"graph(s), target {self.target}"
        ]
        lines += self._loaded_lines(verbose)
        for g in self.graphs:
            lines += _graph_lines(g, verbose)
        lines += self._near_miss_lines(verbose)
        lines += self._silent_lines(verbose)
        lines += self._zero_fire(verbose)
        lines += self._why_lines()
        if not verbose:
            lines.append("(more: --verbose, or report.format(verbose=True) in Python)")
        return "\n".join(lines)

    def _loaded_lines(self, verbose: bool) -> list[str]:
        active = sum(1 for p in self.patterns if p.active)
        if not verbose:
            return [
                f"patterns: {len(self.patterns)} loaded, {active} for this target; "
                f"kernels: {len(self.kernels)} loaded"
            ]
        lines = [f"patterns loaded ({len(self.patterns)}, {active} for this target):"]
        w = max((len(p.name) for p in self.patterns), default=0)
        for p in self.patterns:
            state = "" if p.active else f"  [inactive: {p.note}]"
            lines.append(
                f"  {p.name:<{w}}  benefit {p.benefit:<3} root {p.root or '?':<28} {p.where}{state}"
            )
        if self.kernels:
            lines.append(f"kernels loaded ({len(self.kernels)}):")
            lines.extend(f"  {k}" for k in self.kernels)
        return lines

    def _near_miss_lines(self, verbose: bool) -> list[str]:
        """Near misses, one line per pattern and reason with the sites it holds for (the
        sites a measurement kept for Inductor are listed with their graph instead)."""
        groups: dict[tuple[str, str], list[str]] = {}
        for m in self.near_misses:
            reason = m.reason
            if reason.startswith("kept the replaced subgraph") and not verbose:
                continue
            sites = groups.setdefault((m.pattern, reason), [])
            site = ", ".join(dict.fromkeys(m.at)) or "?"
            if site not in sites:
                sites.append(site)
        if not groups:
            return []
        shown = list(groups.items()) if verbose else list(groups.items())[:_SHORT_MISSES]
        lines = [f"near misses ({sum(len(v) for v in groups.values())}):"]
        for (pattern, reason), sites in shown:
            at = ", ".join(sites[:3]) + (f" and {len(sites) - 3} more" if len(sites) > 3 else "")
            lines.append(f"  {pattern} at {at}: {reason}")
        if len(shown) < len(groups):
            lines.append(f"  ... {len(groups) - len(shown)} more (--verbose)")
        return lines

    def _silent_lines(self, verbose: bool) -> list[str]:
        silent = self.silent_patterns()
        if verbose:
            if not silent:
                return []
            return [
                "patterns that matched nothing:",
                *(f"  {n}: {_plain(w)}" for n, w in silent.items()),
            ]
        # in short: the patterns that had candidates here; the others are counted
        kept = {k.split(" at ", 1)[0] for g in self.graphs for k in g.kept}  # listed with them
        candidates = {n: w for n, w in silent.items() if "candidate root" in w and n not in kept}
        lines = []
        if candidates:
            lines.append(
                f"patterns with candidate roots that matched nothing ({len(candidates)}): "
                + ", ".join(candidates)
                + "; `pdlkit explain --why PATTERN` shows where each one fails"
            )
        rest = len(silent) - len(candidates) - len(kept & set(silent))
        if rest:
            kinds = Counter(
                "for other targets"
                if w.startswith("not for target")
                else "disabled"
                if w == "disabled"
                else "whose ops do not occur"
                for n, w in silent.items()
                if n not in candidates and n not in kept
            )
            lines.append(
                f"{rest} pattern(s) did not apply here ("
                + ", ".join(f"{n} {k}" for k, n in kinds.items())
                + ")"
            )
        return lines

    def _why_lines(self) -> list[str]:
        lines = []
        for name in dict.fromkeys(n for g in self.graphs for n in g.why):
            found = [line for g in self.graphs for line in g.why.get(name, [])]
            matched = sum(1 for line in found if ": matched -> kernel " in line)
            if matched:
                lines.append(
                    f"--why {name}: matched at {matched} root(s); every candidate root, "
                    "closest match first:"
                )
            else:
                lines.append(f"why {name} did not match (closest candidates first):")
            for g in self.graphs:
                if name in g.why:
                    lines.append(f"  graph {g.index}:")
                    lines.extend(f"    {line}" for line in g.why[name] or ["no candidate"])
        return lines

    def silent_files(self) -> list[str]:
        """Pattern files none of whose active patterns fired in this model."""
        fired = {s.pattern for s in self.substitutions}
        files: dict[str, bool] = {}
        for p in self.patterns:
            if p.active:
                f = p.where.rsplit(":", 1)[0]
                files[f] = files.get(f, False) or p.name in fired
        return [f for f, any_fired in files.items() if not any_fired]

    def _zero_fire(self, verbose: bool = True) -> list[str]:
        active = [p for p in self.patterns if p.active]
        if not active or not self.graphs or any(g.skipped for g in self.graphs):
            return []
        if not self.substitutions:
            hint = "see the near misses above, or " if self.near_misses else ""
            return [
                f"NO SUBSTITUTION: none of the {len(active)} active pattern(s) fired in this "
                f"model; {hint}`pdlkit explain --why PATTERN` shows where each one fails",
                *self.model_notes,
            ]
        if not verbose:
            return []
        files = self.silent_files()
        return [f"pattern file fired 0 times in this model: {f}" for f in files]


_SHORT_MISSES = 10  # near-miss lines in the short view


def _plain(reason: str) -> str:
    """A reason in the user's terms: ops outside the Torch dialect import as the generic
    ``torch.operator``, a name that means nothing to someone reading about their model."""
    return reason.replace(
        "op torch.operator does not occur",
        "an op outside the Torch dialect that it matches (imported as torch.operator) does not occur",
    )


def _where(user_line: str) -> str:
    """``/home/me/model.py:12`` as ``model.py:12`` when it is under the current directory."""
    import os

    if not user_line or user_line.startswith("<"):  # <eval_with_key>: generated code
        return ""
    path, _, line = user_line.rpartition(":")
    if "site-packages/" in path:  # a library's line: transformers/models/bert/...py:12
        return f"{path.rsplit('site-packages/', 1)[1]}:{line}"
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return user_line
    return f"{path if rel.startswith('..') else rel}:{line}"


def _graph_lines(g: GraphReport, verbose: bool) -> list[str]:
    lines = [f"graph {g.index} ({g.nodes} nodes): {len(g.substitutions)} substitution(s)"]
    if g.skipped:
        lines.append(f"  left to the default code generator: {g.skipped}")
    rows: list[tuple[str, ...]]
    if verbose:
        rows = [
            (
                f"{s.pattern} -> {s.kernel}",
                f"at {s.root}",
                "replaced " + ", ".join(s.replaced),
                "args " + ", ".join(s.args),
            )
            for s in g.substitutions
        ]
    else:
        rows = [
            (f"{s.pattern} -> {s.kernel}", f"at {s.root}", _where(s.user_line))
            for s in g.substitutions
        ]
    lines.extend(_table(rows, indent="  "))
    for s in g.substitutions:  # then, per site, the kernels passed over and the timings
        lines.extend(f"    {s.root}: passed over {why}" for why in s.passed_over if verbose)
        if s.tuning:
            lines.append(f"    {s.root}: {s.tuning}")
    if g.whole_graph:  # the substituted graph timed against Inductor's (graph_guard.py)
        lines.append(f"  whole graph: {g.whole_graph}")
    if g.kept:
        # a kernel must win by autotune.MARGIN: a subgraph may be kept though a kernel timed a
        # hair faster (BF16 bert-mini: AMX kernel 288 us, subgraph 293 us)
        lines.append(f"  kept for Inductor, no kernel measured {_MARGIN} faster ({len(g.kept)}):")
        lines.extend(f"    {k}" for k in g.kept)
    canon = {k: n for k, n in g.canonicalized.items() if k != "spell_defaults"}
    if canon and verbose:
        lines.append("  canonical forms: " + ", ".join(f"{k} x{n}" for k, n in canon.items()))
    if g.timings and verbose:
        lines.append(
            "  pass time: " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in g.timings.items())
        )
    return lines


def _table(rows: Sequence[tuple[str, ...]], indent: str) -> list[str]:
    if not rows:
        return []
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip() for r in rows]


def describe_value(v: Any) -> str:
    """A short text for a kernel argument in the report (an FX node name or a literal)."""
    return v.name if hasattr(v, "name") and hasattr(v, "op") else repr(v)

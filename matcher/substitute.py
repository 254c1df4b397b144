"""Apply a pattern set to an FX graph with MLIR's PDL interpreter, then edit the FX graph.

    before:  linear = aten.linear(x, w, b); gelu = aten.gelu(linear)
    after:   gelu_k = pdlkit.linear_gelu_numba(x, w, b, 'none', <site>)

The graph is imported into the Torch dialect (op locations = FX node names). Patterns run
one at a time in priority order (benefit, then load order), each through MLIR's walk
driver, so a higher-priority pattern claims its nodes before a lower one can. The native
rewrite ``pdlkit_call`` asks kernel choice for a kernel, replaces the matched root(s) in
MLIR with a ``torch.operator "pdlkit.<kernel>"`` and records the substitution; dead matched
ops are erased between patterns so that nothing matches them again. The records are then
replayed on the FX graph, which is the graph that gets compiled.

This module is the entry point; the work is split by responsibility:

* matcher/match_context.py: the pattern set's MLIR context, natives, frozen patterns
* matcher/match.py: one application, producing records (imports nothing from runtime_abi)
* matcher/pick.py: kernel choice (with matcher/choose.py's measurement)
* matcher/fx_rewrite.py: the records replayed on the FX graph, with their call sites
* matcher/why.py: ``explain --why``'s walk of one pattern over the graph
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch.fx as fx
from pdlkit.matcher.choose import Tuner
from pdlkit.matcher.fx_rewrite import rewrite_fx as replay
from pdlkit.matcher.match import MatchSession, root_ops
from pdlkit.matcher.match_context import MatchContext, batches, match_context
from pdlkit.matcher.patterns import Pattern, PatternSet
from pdlkit.matcher.pick import RegistryChoice
from pdlkit.matcher.records import Record, SubstitutionError
from pdlkit.matcher.report import GraphReport
from pdlkit.matcher.why import pattern_why, walk_candidates
from pdlkit.runtime_abi.capability import Target
from pdlkit.runtime_abi.registry import KernelRegistry
from torch_mlir import ir, rewrite

__all__ = ["Outcome", "SubstitutionError", "substitute"]


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
    for p in patterns.patterns:
        if not p.active_on(target):
            report.silent[p.name] = "disabled" if not p.enabled else f"not for target {target.name}"
    with patterns.lock:
        t0 = time.perf_counter()
        imported = mc.importer.import_graph(gm)
        t1 = time.perf_counter()
        s = MatchSession(gm, imported.inputs, RegistryChoice(gm, registry, target, tuner), target)
        s.why = frozenset(why)
        s.collect_near = near_misses
        mc.session = s
        try:
            walked = _apply(imported.func, mc, patterns, s, report)
            for name in why:
                report.why[name] = pattern_why(
                    name,
                    patterns.patterns,
                    target,
                    s.records,
                    s.near,
                    walked.get(name),
                    lambda p: _walk(p, imported.func, mc, s),
                )
        finally:
            mc.session = None
        t2 = time.perf_counter()
    if s.errors:
        raise SubstitutionError("\n".join(dict.fromkeys(s.errors)))
    report.near_misses = s.near
    report.kept = s.kept
    subs = replay(gm, s, verify) if rewrite_fx and s.records else []
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


def _walk(p: Pattern, func: ir.Operation, mc: MatchContext, s: MatchSession) -> list[Any]:
    return walk_candidates(p, mc.pattern_op(p.name), func, s.describe)


def _apply(
    func: ir.Operation,
    mc: MatchContext,
    patterns: PatternSet,
    s: MatchSession,
    report: GraphReport,
) -> dict[str, list[Any]]:
    """Apply the active patterns batch by batch (matcher/match_context.py's ``batches``);
    note in ``report.silent`` why each pattern that never fired did not. Returns the
    ``explain --why`` walks made just before each asked-about pattern was applied."""
    walked: dict[str, list[Any]] = {}
    present = root_ops(func)
    for batch in batches([p for p in patterns.ordered() if p.active_on(s.target)]):
        run = _runnable(batch, present, report)
        if not run:
            continue
        s.pattern = run[0]
        for p in run:  # explain --why: the IR exactly as this pattern meets it
            if p.name in s.why:
                walked[p.name] = _walk(p, func, mc, s)
        before = len(s.records)
        rewrite.walk_and_apply_patterns(func, mc.frozen(run))
        if len(s.records) > before:
            present = s.erase_dead(func, s.records[before:])
        fired = {r.pattern.name for r in s.records[before:]}
        for p in run:
            if p.name not in fired:
                n = present.get(p.root, 0) if p.root else 0
                misses = s.near_count[p.name]
                report.silent[p.name] = (
                    f"{n} candidate root(s) {p.root}, {misses} near miss(es); "
                    f"`pdlkit explain --why {p.name}` shows where each one fails"
                    if p.root
                    else "no match"
                )
    return walked


def _runnable(batch: list[Pattern], present: Any, report: GraphReport) -> list[Pattern]:
    """The patterns of ``batch`` whose ops all occur in the graph (indexed by op name: a
    pattern needing an op the graph lacks cannot match); the others are silent, saying so."""
    run = []
    for p in batch:
        needed = set(p.op_names) if p.op_names is not None else {p.root} - {None}
        missing = sorted(str(n) for n in needed - present.keys())
        if p.root is not None and p.root in missing:
            report.silent[p.name] = f"root op {p.root} does not occur in the graph"
        elif missing:
            report.silent[p.name] = f"op {missing[0]} does not occur in the graph"
        else:
            run.append(p)
    return run

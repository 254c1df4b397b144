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
from pdlkit.matcher import record_memo
from pdlkit.matcher.choose import Tuner
from pdlkit.matcher.fx_rewrite import rewrite_fx as replay
from pdlkit.matcher.match import MatchSession, root_ops
from pdlkit.matcher.match_context import MatchContext, batches, match_context
from pdlkit.matcher.patterns import Pattern, PatternSet
from pdlkit.matcher.pick import RegistryChoice
from pdlkit.matcher.record_memo import Memo
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
    memo: Memo | None = None,
) -> Outcome:
    """Rewrite every subgraph of ``gm`` that a pattern matches into a kernel call, in place.

    ``gm`` is a pre-dispatch ATen graph whose nodes carry ``meta["val"]``. Example, with a
    linear + gelu pattern and a kernel for ``linear_gelu``::

        before: linear = aten.linear(x, w, b); gelu = aten.gelu(linear); return (gelu,)
        after:  linear_gelu = pdlkit.linear_gelu_numba(x, w, b, 'none', 1); return (linear_gelu,)

    ``memo``: where this graph's records were kept by an earlier compilation with the same
    plan (matcher/record_memo.py): replayed without matching if they fit, else kept there.
    """
    report = GraphReport(index=index, nodes=len(gm.graph.nodes))
    for p in patterns.patterns:
        if not p.active_on(target):
            report.silent[p.name] = "disabled" if not p.enabled else f"not for target {target.name}"
    digest = record_memo.graph_digest(gm) if memo is not None else ""
    t0 = time.perf_counter()
    s = _recalled(memo, gm, digest, patterns, registry, target, report, tuner)
    recalled = s is not None
    if s is None:
        s = _matched(gm, patterns, registry, target, report, tuner, why, near_misses)
    t1 = time.perf_counter()
    if s.errors:
        raise SubstitutionError("\n".join(dict.fromkeys(s.errors)))
    report.near_misses = s.near
    report.kept = s.kept
    subs = replay(gm, s, verify) if rewrite_fx and s.records else []
    report.substitutions = subs
    if memo is not None and subs and not recalled:
        _keep(memo, digest, s, report.silent, tuner)
    t2 = time.perf_counter()
    if subs:
        gm.recompile()  # FX's Python codegen, as after any FX pass; reported on its own
    imported = report.timings.get("mlir_import", 0.0)
    report.timings.update(
        mlir_import=imported,
        pdl_apply=t1 - t0 - imported if not recalled else 0.0,
        recalled=t1 - t0 if recalled else 0.0,
        fx_rewrite=t2 - t1,
        fx_codegen=time.perf_counter() - t2,
    )
    return Outcome(gm, report, s.records)


def _matched(
    gm: fx.GraphModule,
    patterns: PatternSet,
    registry: KernelRegistry,
    target: Target,
    report: GraphReport,
    tuner: Tuner | None,
    why: Sequence[str],
    near_misses: bool,
) -> MatchSession:
    """The graph imported into MLIR and the patterns applied: the session holding the
    records (``report``: silent patterns, ``--why`` walks, the import's time)."""
    mc = match_context(patterns)
    with patterns.lock:
        t0 = time.perf_counter()
        imported = mc.importer.import_graph(gm)
        report.timings["mlir_import"] = time.perf_counter() - t0
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
    return s


def _recalled(
    memo: Memo | None,
    gm: fx.GraphModule,
    digest: str,
    patterns: PatternSet,
    registry: KernelRegistry,
    target: Target,
    report: GraphReport,
    tuner: Tuner | None,
) -> MatchSession | None:
    """The records ``memo`` kept for this graph, replayable; None where there are none or
    they do not fit (said once: they are matched and kept again)."""
    body = memo.recall() if memo is not None else None
    if memo is None or body is None:
        return None
    silent = dict(report.silent)
    try:
        return record_memo.recall(body, gm, digest, patterns, registry, target, report, tuner)
    except record_memo.Stale:  # a site's decision changed since: matched again, no warning
        return None
    except (record_memo.Unplain, KeyError, TypeError, ValueError, IndexError) as e:
        report.silent = silent
        memo.ignore(e)
        return None


def _keep(
    memo: Memo, digest: str, s: MatchSession, silent: dict[str, str], tuner: Tuner | None
) -> None:
    try:
        memo.keep(record_memo.encode(digest, s, silent, tuner))
    except record_memo.Unplain:  # not what a later matching is sure to produce: not kept
        pass


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

"""The compiled graph, chosen as a whole: substituted, a kernel at every site, static
priority's, or Inductor's.

    before: run_pass chose each site's implementation on its own timings; the substituted
            graph was compiled as it came out
    after:  the substituted graph is timed against Inductor's code for Dynamo's graph (and,
            where some sites kept their subgraph, against the graph with a kernel at every
            site, and where that one is not static priority's, against that one too); the
            fastest runs. The verdict is cached per host: a graph Inductor won is
            compiled by Inductor alone the next time, with no re-trace and no matching (so is
            a graph in which nothing was substituted); a graph the kernels-only variant won is
            matched with ``keep_sites=False`` directly, static priority's as
            ``autotune="off"`` matches.

The timing itself, its shortcuts and the cache keys are in :mod:`pdlkit.matcher.graph_guard`;
this module connects them to a compilation (``pdlkit.backend.PdlkitBackend``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, cast

import torch.fx as fx

from pdlkit import inductor_options
from pdlkit.matcher import graph_buckets, graph_guard, graph_writes
from pdlkit.matcher.report import GraphReport
from pdlkit.plan import Options, Plan
from pdlkit.runtime_abi import autotune
from pdlkit.runtime_abi.autotune import Decision, Timing, resolve_mode
from pdlkit.runtime_abi.binding import DeferredChecks
from pdlkit.runtime_abi.binding_stats import count

# the pass again for the check: a kernel at every site, or (True) as autotune="off" matches
Rerun = Callable[[bool], tuple[fx.GraphModule, GraphReport]]


def measured(
    opts: Options, plan: Plan, example_inputs: list[Any], gm: fx.GraphModule, captured: bool
) -> bool:
    """Whether the whole graph is measured (matcher/graph_guard.py): autotune on, this host,
    no kernel pins (pins decide, unmeasured), a graph that can run again unseen (``captured``:
    the compilation is captured in CUDA graphs)."""
    return checked(opts, plan) and graph_guard.timeable(gm, example_inputs, captured)


def measured_per_bucket(
    opts: Options, plan: Plan, example_inputs: list[Any], gm: fx.GraphModule, captured: bool
) -> bool:
    """Whether the whole graph is measured per shape bucket (:func:`per_bucket`): as
    :func:`measured`, for a graph with dynamic shapes."""
    return bool(graph_buckets.dynamic_dims(gm)) and measured(
        opts, plan, example_inputs, gm, captured
    )


def checked(opts: Options, plan: Plan) -> bool:
    """Whether this compilation's graphs are measured where they can run again unseen."""
    return (
        resolve_mode(opts.autotune) != "off"
        and plan.target.name == "host"
        and not any(p.kernel for p in plan.patterns.patterns)
    )


def note_unmeasured(
    report: GraphReport,
    key: str,
    opts: Options,
    plan: Plan,
    example_inputs: list[Any],
    gm: fx.GraphModule,
    counted: bool,
    captured: bool = False,
) -> None:
    """Why a substituted graph that the check would measure is not (no verdict ``key``), for
    explain in ``report.whole_graph``, e.g. "not measured: node eq (__eq__) may write in
    place"; and, where ``counted`` (a compilation, not explain), in ``stats()`` as
    ``graphs_not_measured``."""
    if key or not report.substitutions or not checked(opts, plan):
        return
    why = graph_guard.untimeable(gm, example_inputs, captured)
    if why:
        report.whole_graph = f"not measured: {why}"
        if counted:
            count("graphs_not_measured", "(whole graph)")


def verdict_key(
    opts: Options,
    plan: Plan,
    example_inputs: list[Any],
    gm: fx.GraphModule,
    stamp: Any,
    captured: bool = False,
) -> str:
    """The whole-graph verdict's key before matching ("" where the graph is not measured, or
    is measured per shape bucket: :func:`per_bucket`)."""
    if graph_buckets.dynamic_dims(gm) or not measured(opts, plan, example_inputs, gm, captured):
        return ""
    return graph_guard.plan_key(gm, example_inputs, repr((stamp, opts)))


def known(key: str, opts: Options) -> str | None:
    """The cached verdict that decides before matching: INDUCTOR, KERNELS or STATIC; else None."""
    if not key or resolve_mode(opts.autotune) != "cached":
        return None
    return graph_guard.known_verdict(key)


def subclass_key(opts: Options, example_inputs: list[Any], gm: fx.GraphModule, stamp: Any) -> str:
    """The verdict key of a graph with tensor-subclass inputs (torchao's int8 weights, DTensor)
    as Dynamo gives it, before the desugaring trace (``distributed.compile_desugared``): its
    text, its inputs' shapes, dtypes and classes (the same text with plain tensors is
    another graph), the plan. "" where no verdict of it is cached: autotune off, no plan,
    dynamic shapes, a training graph. Set by :func:`desugared_verdict` where nothing was
    substituted (and Dynamo's graph was compiled as ``torch.compile`` compiles it); a
    compilation that finds it compiles Dynamo's graph so again, with no desugaring trace, and
    finds Inductor's cache entries of the first (bert-mini with torchao's int8 dynamic
    weights, 2-core EPYC: a second compile took 1.6 s against Inductor's 1.0, 0.6 s of it the
    desugaring trace; now 1.0 s)."""
    if resolve_mode(opts.autotune) == "off" or stamp is None:
        return ""
    if graph_buckets.dynamic_dims(gm) or graph_guard.untimeable(gm, example_inputs):
        return ""
    classes = [type(x).__name__ for x in example_inputs]
    return graph_guard.plan_key(gm, example_inputs, repr(("subclass", classes, stamp, opts)))


def desugared_verdict(outer: str, inner: str, opts: Options) -> None:
    """After a desugared compilation in which nothing was substituted: where its graph's
    verdict (key ``inner``) was cached as Inductor's, Dynamo's graph (``outer``,
    :func:`subclass_key`) gets the same verdict."""
    if outer and known(inner, opts) == graph_guard.INDUCTOR:
        graph_guard.remember(outer, Decision(graph_guard.INDUCTOR, [], "measured"))


def nothing_substituted(key: str, known: str | None, report: GraphReport) -> None:
    """Remember a measured graph in which nothing was substituted (every site measured faster
    kept, or nothing matched) as Inductor's: the next compilation of it, in this process or
    another, skips the re-trace and matching (seen on a Xeon with AMX: FP32 bert-mini, every
    site kept, second compile 2.3 s against Inductor's 1.4 s); not when some site was timed
    on a busy host (``autotune.trusted``)."""
    if key and known is None and not report.skipped and not report.sites_unsteady:
        graph_guard.remember(key, Decision(graph_guard.INDUCTOR, [], "measured"))


def compile_inductor(
    gm: fx.GraphModule, example_inputs: list[Any], patches: Any
) -> Callable[..., Any]:
    """Inductor's code for Dynamo's graph, as a cached verdict asks (no matching)."""
    from torch._inductor.compile_fx import compile_fx

    count("graphs_left_to_inductor", "(whole graph)")
    return cast(Callable[..., Any], compile_fx(gm, example_inputs, config_patches=patches))


def faster_graph(
    gm: fx.GraphModule,
    traced: fx.GraphModule,
    example_inputs: list[Any],
    report: GraphReport,
    opts: Options,
    patches: dict[str, Any],
    key: str,
    rerun: Rerun | None = None,
) -> Callable[..., Any]:
    """The substituted graph's code, unless another whole graph measured faster: Inductor's
    code for Dynamo's graph (the substitutions are counted as undone), or, with ``rerun``,
    the graph with a kernel at every site (graph_guard.KERNELS) and static priority's
    (graph_guard.STATIC) where the report says they differ. All are compiled with the
    compilation's Inductor options (``patches``: CUDA graphs on all sides or none)."""
    from torch._inductor.compile_fx import compile_fx

    kernels = [s.kernel for s in report.substitutions]
    other: dict[str, GraphReport] = {}
    deferred = DeferredChecks()  # timed as the model runs them, past their first checks
    owners: list[fx.GraphModule] = []  # the same graphs, for a look after the compile

    def compiled(graph: fx.GraphModule) -> Callable[..., Any]:  # a graph with substitutions
        fn = inductor_options.compile_substituted(graph, example_inputs, patches)
        deferred.add(graph)
        owners.append(graph)
        return cast(Callable[..., Any], fn)

    def again(static: bool, differs: bool) -> Callable[[], Callable[..., Any]] | None:
        if rerun is None or not differs:
            return None
        name = graph_guard.STATIC if static else graph_guard.KERNELS

        def make() -> Callable[..., Any]:
            assert rerun is not None
            traced_again, other[name] = rerun(static)
            return compiled(traced_again)

        return make

    # the kernels-only graph in place of the measured choice's, within the check's margin of it
    hedges = report.hedges
    instead = again(False, hedges.kernels_instead)
    notes = hedges.notes()

    def noted(decision: Decision) -> Decision:
        if instead is None:
            return decision
        return _noted(decision, graph_guard.KERNELS, notes[graph_guard.KERNELS])

    def heard(decision: Decision) -> None:  # the verdict of a look after the compile
        count("graphs_looked_at_later", "(whole graph)")
        _settled(noted(decision), report, key, kernels, other)

    def failed(why: str) -> None:  # a look after the compile that raised (warned already)
        count("graph_looks_failed", "(whole graph)")
        report.whole_graph = f"{report.whole_graph}; {why}"

    later = graph_guard.Later(partial(_checks_put_off, owners), heard, failed)
    try:
        _, fn, decision = graph_guard.choose(
            graph_guard.graph_key(gm, example_inputs, kernels),
            instead or (lambda: compiled(traced)),
            lambda: compile_fx(gm, example_inputs, config_patches=dict(opts.config_patches())),
            example_inputs,
            resolve_mode(opts.autotune),
            report.sites_saved_us,
            kernels_only=again(False, hedges.kernels_differ),
            static=again(True, hedges.static_differs),
            written=graph_writes.written_inputs(gm),
            left_out={n: why for n, why in notes.items() if n != graph_guard.KERNELS},  # below
            first=graph_guard.KERNELS if instead else graph_guard.SUBSTITUTED,
            later=later,
            library_calls=report.library_calls,
        )
    finally:
        deferred.restore()
    decision = noted(decision)
    if decision.source == graph_guard.PENDING:
        report.whole_graph = decision.describe()  # the verdict comes with the later look
        count("graph_looks_due", "(whole graph)")
    else:
        _settled(decision, report, key, kernels, other)
    return cast(Callable[..., Any], fn)


def _settled(
    decision: Decision, report: GraphReport, key: str, kernels: list[str], other: dict
) -> None:
    """A compilation's whole-graph verdict: shown by explain, counted in ``stats()``, and
    where it is not the substituted graph (and was not read on a busy host) remembered under
    the plan's ``key``, so the next compilation skips the matching."""
    verdict = decision.choice
    report.whole_graph = decision.describe()
    if verdict != graph_guard.SUBSTITUTED:
        for k in kernels:
            count("substitutions_undone", k)
    if verdict in other:
        for sub in other[verdict].substitutions:
            count("substitutions", sub.kernel)
    trusted = autotune.trusted(decision) and not report.sites_unsteady  # not on a busy host
    if key and verdict != graph_guard.SUBSTITUTED and trusted:
        graph_guard.remember(key, Decision(verdict, [], "measured"))


def _checks_put_off(owners: list[fx.GraphModule], timed: Callable[[], Any]) -> Any:
    """``timed()`` with the first-call checks of the sites of ``owners`` put off
    (binding.DeferredChecks), so the model's own first calls still check in full."""
    checks = DeferredChecks()
    for graph in owners:
        checks.add(graph)
    try:
        return timed()
    finally:
        checks.restore()


def _noted(decision: Decision, name: str, why: str) -> Decision:
    """``decision`` with ``why`` added to the note of the graph ``name`` (for explain)."""
    timings = [
        Timing(t.name, t.us, f"{why}; {t.note}" if t.note else why, t.low, t.rounds)
        if t.name == name
        else t
        for t in decision.timings
    ]
    return Decision(decision.choice, timings, decision.source)


def per_bucket(
    gm: fx.GraphModule,
    traced: fx.GraphModule,
    example_inputs: list[Any],
    report: GraphReport,
    opts: Options,
    patches: dict[str, Any],
) -> Callable[..., Any]:
    """The code of a substituted graph with dynamic shapes: it and Inductor's code for
    Dynamo's graph, both compiled for every shape, the faster run per shape bucket
    (matcher/graph_buckets.py); the example inputs' bucket is timed now."""
    from torch._inductor.compile_fx import compile_fx

    ours = inductor_options.compile_substituted(traced, example_inputs, patches)
    theirs = compile_fx(gm, example_inputs, config_patches=dict(opts.config_patches()))
    dims = graph_buckets.dynamic_dims(gm)
    kernels = [s.kernel for s in report.substitutions]

    graphs = graph_buckets.BucketedGraphs(
        dims,
        ours,
        theirs,
        graph_buckets.bucket_key(gm, example_inputs, kernels, dims),
        resolve_mode(opts.autotune),
        graph_writes.written_inputs(gm),
        partial(_checks_put_off, [traced]),
    )
    graphs.choose([graph_buckets.hinted(x) for x in example_inputs])
    ((b, decision),) = graphs.decisions.items()
    report.whole_graph = f"per shape bucket; buckets {list(b)}: {decision.describe()}"
    return graphs


def cached_verdict(
    report: GraphReport,
    gm: fx.GraphModule,
    example_inputs: list[Any],
    opts: Options,
    plan: Plan,
    captured: bool,
) -> None:
    """For explain, which compiles and times no whole graph: the verdict this host's decision
    cache holds for the substituted graph at these inputs' shapes (a graph with dynamic
    shapes: their bucket), as ``optimize`` took it, in ``report.whole_graph``; or that none
    was taken yet. A site's kernel shown while Inductor's whole graph runs would mislead."""
    if report.whole_graph or not report.substitutions:
        return
    if not measured(opts, plan, example_inputs, gm, captured):
        return
    kernels = [s.kernel for s in report.substitutions]
    dims = graph_buckets.dynamic_dims(gm)
    if dims:
        base = graph_buckets.bucket_key(gm, example_inputs, kernels, dims)
        key = graph_buckets.verdict_key(base, graph_buckets.buckets(example_inputs, dims))
    else:
        key = graph_guard.graph_key(gm, example_inputs, kernels)
    decision = autotune.decision_cache().get(key)
    report.whole_graph = (
        f"cached verdict: {decision.describe()}"
        if decision is not None
        else "not timed yet (optimize times it when it compiles the graph)"
    )

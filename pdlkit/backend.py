"""The ``"pdlkit"`` Dynamo backend: re-trace -> substitute -> Inductor (or eager).

    torch.compile(model, backend="pdlkit")                       # shipped / env folders
    torch.compile(model, backend="pdlkit", options={"patterns": "my/patterns"})
    pdlkit.optimize(model, patterns="my/patterns", kernels="my/kernels")

Dynamo's graph is re-traced to pre-dispatch ATen (where ``aten.linear``, ``aten.gelu``,
``aten.scaled_dot_product_attention`` and ``quantized_decomposed.*`` are still whole ops),
inside Dynamo's own fake mode so that only Dynamo's symbolic dims stay symbolic. The
matcher substitutes kernel calls; everything else goes to ``compile_fx`` (TorchInductor).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial
from typing import Any, cast

import torch
import torch.fx as fx

from pdlkit import config, distributed, inductor_options, whole_graph
from pdlkit.errors import ConfigError
from pdlkit.matcher import graph_guard
from pdlkit.matcher.canonicalize import canonicalize, restore
from pdlkit.matcher.choose import Tuner
from pdlkit.matcher.cse import eliminate_common_subexpressions
from pdlkit.matcher.html_report import node_infos
from pdlkit.matcher.report import GraphReport, Report
from pdlkit.optimized import dynamic_of, remember, unwrap
from pdlkit.optional import MissingDependency
from pdlkit.plan import Options, Plan, kernels_in_use, load_plan, options_in, plan_stamp
from pdlkit.retrace import ambient_autocast, mode_regions, retrace, retrace_prepared
from pdlkit.runtime_abi.autograd import grad_inputs, training_graph
from pdlkit.runtime_abi.autotune import resolve_mode
from pdlkit.runtime_abi.binding_stats import count
from pdlkit.runtime_abi.capability import host
from pdlkit.session import CompileSession


def _compile(model: Callable[..., Any], backend: Any, **kw: Any) -> Callable[..., Any]:
    """torch.compile with a compile region of its own where torch supports it (2.13+), so
    that repeated optimize()/explain() calls do not use up each other's recompile limit."""
    import inspect

    if "isolate_recompiles" in inspect.signature(torch.compile).parameters:
        kw["isolate_recompiles"] = True
    return torch.compile(model, backend=backend, **kw)


def run_pass(
    gm: fx.GraphModule,
    example_inputs: list[Any],
    plan: Plan,
    *,
    verify: bool | str = False,
    index: int = 0,
    rewrite_fx: bool = True,
    keep_text: bool = False,
    why: tuple[str, ...] = (),
    near_misses: bool = True,
    autotune: str | None = "off",
    codegen: str = "inductor",
    keep_sites: bool = True,
    verdict_key: str = "",
    per_bucket: bool = False,
) -> tuple[fx.GraphModule, GraphReport]:
    """Re-trace ``gm`` and substitute; returns the rewritten pre-dispatch graph and a report.

    ``autotune`` (``"cached"``, ``"full"``, ``"off"``; None reads ``PDLKIT_AUTOTUNE``) decides
    whether kernels are chosen by measurement (matcher/choose.py) or by static priority;
    ``keep_sites=False``: every measured site takes a kernel, even where its subgraph
    measured faster, near ties going by priority (matcher/choose.py's ``kernels_only``:
    pdlkit/whole_graph.py's kernels-only graph); ``verdict_key``: the whole-graph verdict's
    (pdlkit/whole_graph.py), under which the match records are kept for a later compilation
    to replay (pdlkit/match_store.py; not when explaining); ``per_bucket``: the graph is
    checked whole per shape bucket."""
    from pdlkit import match_store
    from pdlkit.matcher.substitute import substitute

    autocast = ambient_autocast(example_inputs)
    if autocast:
        note = f"compiled under {autocast}, whose ops run in its dtype, which no kernel call would"
        return gm, GraphReport(index=index, nodes=len(gm.graph.nodes), skipped=note)
    t0 = time.perf_counter()
    if keep_text:  # the graph as it was before canonicalization too
        traced = retrace(gm, example_inputs)
        eliminate_common_subexpressions(traced)
        t1 = time.perf_counter()
        before = traced.print_readable(print_output=False)
        nodes = node_infos(traced)
        canonical = canonicalize(traced)
    else:
        traced, canonical = retrace_prepared(gm, example_inputs, prepare)
        t1 = time.perf_counter()  # "retrace" includes prepare(): none where the trace is reused
        before, nodes = "", []
    t_canon = time.perf_counter() - t1
    # In a graph that needs gradients only kernels with a backward are eligible for
    # arguments that require grad; the registry reads requires_grad off the fake values.
    grads = grad_inputs(example_inputs)
    tuner = _tuner(autotune, traced, example_inputs, plan, bool(grads), codegen)
    if tuner is not None:
        tuner.keep, tuner.per_bucket = keep_sites, per_bucket
    kw: dict[str, Any] = dict(
        verify=verify, index=index, rewrite_fx=rewrite_fx, why=why, near_misses=near_misses
    )
    plain = rewrite_fx and not (keep_text or why or near_misses)  # a compilation, not explain
    memo = match_store.memo(verdict_key, keep_sites, autotune) if plain else None
    with training_graph(traced, grads):
        outcome = substitute(
            traced, plan.patterns, plan.registry, plan.target, **kw, tuner=tuner, memo=memo
        )
    report = outcome.report
    if rewrite_fx:
        restore(outcome.graph)  # inexact canonical spellings no kernel claimed
    report.canonicalized = dict(canonical)
    for sub, enabled in mode_regions(traced, bool(grads)):  # a graph each, static priority
        report.merge(_substitute_region(sub, enabled, plan, kw))
    report.timings = {"retrace": t1 - t0, "canonicalize": t_canon, **report.timings}
    _note_tuning(report, tuner)
    if keep_text:
        report.graph_before = before
        report.fx_nodes = nodes
        report.graph_after = outcome.graph.print_readable(print_output=False)
    return outcome.graph, report


def _note_tuning(report: GraphReport, tuner: Any) -> None:
    """The measured choice's totals on the report (the whole-graph check reads them), and its
    time apart from the PDL application's, inside which it measured."""
    if tuner is None:
        return
    report.sites_saved_us, report.hedges = tuner.saved_us, tuner.stakes
    report.library_calls = tuner.library_calls
    report.sites_unsteady = tuner.unsteady
    if tuner.seconds:
        report.timings["pdl_apply"] -= tuner.seconds
        report.timings["autotune"] = tuner.seconds


def prepare(traced: fx.GraphModule) -> Counter[str]:
    """What every re-traced graph goes through before matching: common subexpressions merged,
    then canonical spellings (matcher/canonicalize.py); how often each rule applied. It
    reads nothing but the graph: a reused trace is reused prepared (``retrace_prepared``)."""
    eliminate_common_subexpressions(traced)
    return canonicalize(traced)


def _substitute_region(
    sub: fx.GraphModule, grad_enabled: bool, plan: Plan, kw: dict[str, Any]
) -> GraphReport:
    """Substitute inside one region (``retrace.mode_regions``): its ops are plain ATen ops
    run in that grad mode, so every kernel is as valid there as outside. Under
    ``torch.no_grad()`` no input needs a gradient; under ``torch.enable_grad()`` every input
    may. Kernels are chosen by static priority (measurement times sites of the outer graph)."""
    from pdlkit.matcher.substitute import substitute

    canonical = prepare(sub)
    n_inputs = sum(1 for n in sub.graph.nodes if n.op == "placeholder")
    with training_graph(sub, range(n_inputs) if grad_enabled else []):
        outcome = substitute(sub, plan.patterns, plan.registry, plan.target, **kw)
    if kw["rewrite_fx"]:
        restore(sub)
    outcome.report.canonicalized = dict(canonical)
    return outcome.report


def _tuner(
    mode: str | None,
    traced: fx.GraphModule,
    example_inputs: list[Any],
    plan: Plan,
    training: bool,
    codegen: str,
) -> Any:
    """The measured kernel choice for this compilation, or None for static priority: with
    ``autotune="off"``, for a target other than this host (nothing can be timed), for a
    graph that needs gradients (forward timings would not say which is faster to train), and
    with eager code generation (the comparison is with Inductor's code)."""
    mode = resolve_mode(mode)
    if mode == "off" or plan.target.name != "host" or training or codegen != "inductor":
        return None
    return Tuner(mode, traced, example_inputs)


class PdlkitBackend:
    """A Dynamo backend; ``torch.compile(model, backend=PdlkitBackend(...))`` or the name ``"pdlkit"``."""

    def __init__(
        self,
        *,
        patterns: config.PathArg = None,
        kernels: config.PathArg = None,
        target: Any = None,
        default_codegen: str = "inductor",
        verify: bool | str = False,
        on_report: Callable[[GraphReport, Plan], None] | None = None,
        explain_only: bool = False,
        why: tuple[str, ...] = (),
        allow_world_writable: bool | None = None,
        autotune: str | None = None,
        mode: str | None = None,
        inductor_config: Mapping[str, Any] | None = None,
    ):
        self.options = Options(**options_in(locals()))
        self.on_report = on_report
        self.explain_only = explain_only
        self.why = why  # explain --why: patterns to walk candidate by candidate
        # the call sites, reports and warnings of this backend's compilations
        self.session = CompileSession(keep_reports=explain_only)
        self._stamp: tuple[str, str] | None = None
        self._last_plan: tuple[tuple[Any, ...], Plan, tuple[str, str]] | None = None  # plan()
        self._last_key = ""  # the whole-graph verdict key of the last graph compiled
        self._desugaring = False  # compiling a desugared graph (compile_desugared)

    def plan(self, opts: Options) -> Plan:
        """``load_plan(opts)``, or the plan this backend loaded last when the options it
        reads and :func:`~pdlkit.plan.plan_stamp` (environment, and the stat of every file
        and folder it would read or check) are unchanged: ``optimize`` loads it up front and
        its first compilation takes it from here. A change to any file, its permissions or
        the environment loads again, with every check (pins, permissions, hashes)."""
        return self._plan_and_stamp(opts)[0]

    def _plan_and_stamp(self, opts: Options) -> tuple[Plan, tuple[str, str]]:
        """The plan and ``_current_stamp(opts)``, both reused while ``plan_stamp`` (which
        sees every change the files' stamp sees) is unchanged."""
        key = (opts.patterns, opts.kernels, opts.target, opts.allow_world_writable)
        stamp = plan_stamp(opts)  # before loading: a change made during the load shows next
        last = self._last_plan
        if stamp is not None and last is not None and last[0] == (*key, stamp):
            return last[1], last[2]
        files = self._current_stamp(opts)
        plan = load_plan(opts)
        if stamp is not None:
            self._last_plan = ((*key, stamp), plan, files)
        return plan, files

    def _current_stamp(self, opts: Options) -> tuple[str, str]:
        import os

        try:
            paths = config.pattern_paths(opts.patterns) + config.kernel_paths(opts.kernels)
        except config.PathError as e:  # never raise inside Dynamo's guard check
            return "invalid", str(e)
        env = (
            os.environ.get(config.PATTERN_ENV, "")
            + os.pathsep
            + os.environ.get(config.KERNEL_ENV, "")
        )
        return env, config.stat_fingerprint(paths)

    def __call__(
        self,
        gm: fx.GraphModule,
        example_inputs: list[Any],
        mode: str | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> Callable[..., Any]:
        if distributed.has_subclass_inputs(gm, example_inputs):  # DTensor, torchao's weights
            return self._desugared(gm, example_inputs, mode, options)
        opts = self._options(mode, options)
        patches = opts.config_patches()
        try:
            plan, self._stamp = self._plan_and_stamp(opts)
        except BaseException as e:
            self._stamp = self._current_stamp(opts)  # the files this compilation saw
            if isinstance(e, MissingDependency):
                return self._without_matcher(e, gm, example_inputs, opts, patches)
            raise
        opts, plan, capture = self._for_this_graph(gm, example_inputs, opts, plan, patches)
        key = whole_graph.verdict_key(opts, plan, example_inputs, gm, self._stamp, bool(capture))
        self._last_key = key
        known = whole_graph.known(key, opts) if not self.explain_only else None
        if known == graph_guard.INDUCTOR and self.on_report is None:
            return whole_graph.compile_inductor(gm, example_inputs, patches)
        per_bucket = whole_graph.measured_per_bucket(opts, plan, example_inputs, gm, bool(capture))
        used = kernels_in_use(opts, self._stamp[1])  # the folders' stamp, taken above
        with self.session.compiling() as index:  # the sites made here are the session's
            traced, report = run_pass(
                gm,
                example_inputs,
                plan,
                verify=opts.verify,
                index=index,
                keep_text=self.explain_only,
                why=self.why,
                near_misses=self.explain_only or self.on_report is not None,
                autotune="off" if known == graph_guard.STATIC else opts.autotune,
                codegen=opts.default_codegen,
                keep_sites=known != graph_guard.KERNELS,
                verdict_key=key,
                per_bucket=per_bucket,
            )
        try:
            whole_graph.note_unmeasured(
                report, key, opts, plan, example_inputs, gm, not self.explain_only, bool(capture)
            )
            if report.skipped and not self.explain_only:
                self.session.warn_once(
                    f"pdlkit: graph {index} left to Inductor: {report.skipped}", key="skipped"
                )
            self.session.report(report, plan)
            if self.on_report is not None:
                self.on_report(report, plan)
            if self.explain_only:
                whole_graph.cached_verdict(report, gm, example_inputs, opts, plan, bool(capture))
                return gm.forward
            used.update(sub.kernel for sub in report.substitutions)
            fn = self._compiled(
                gm, traced, example_inputs, report, opts, plan, patches, key, known, capture,
                per_bucket,
            )  # fmt: skip
            # counted once compiled: a compile Dynamo restarts (AOT autograd raises to make a float
            # that dynamic=True lifted a constant) counts its substitutions once
            for sub in report.substitutions:
                count("substitutions", sub.kernel)
            return fn
        finally:  # the sites' library calls serve this compile's whole-graph check alone
            report.library_calls = []

    def _options(self, mode: str | None, options: Mapping[str, Any] | None) -> Options:
        opts = self.options.with_(options)
        if mode is not None and mode != "default":  # torch.compile(..., mode=...)
            opts = replace(opts, mode=mode)
        return opts

    def _desugared(
        self,
        gm: fx.GraphModule,
        example_inputs: list[Any],
        mode: str | None,
        options: Mapping[str, Any] | None,
    ) -> Callable[..., Any]:
        """A graph with tensor-subclass inputs, desugared to plain tensors and compiled as any
        graph is; where nothing is substituted there, Dynamo's graph as Inductor compiles it,
        and the next time (the verdict cached: whole_graph.subclass_key) with no desugaring."""
        opts = self._options(mode, options)
        try:
            stamp: Any = self._plan_and_stamp(opts)[1]
        except Exception:  # the compilation below reports it
            stamp = None
        outer, patches = (
            whole_graph.subclass_key(opts, example_inputs, gm, stamp),
            opts.config_patches(),
        )
        known = whole_graph.known(outer, opts) == graph_guard.INDUCTOR
        if known and not self.explain_only and self.on_report is None:
            return whole_graph.compile_inductor(gm, example_inputs, patches)

        def plain() -> Callable[..., Any]:
            whole_graph.desugared_verdict(outer, self._last_key, opts)
            return cast(
                Callable[..., Any],
                inductor_options.compile_substituted(gm, example_inputs, patches),
            )

        self._last_key, self._desugaring = "", True
        try:
            return distributed.compile_desugared(
                self, gm, example_inputs, plain, mode=mode, options=options
            )
        finally:
            self._desugaring = False

    def _compiled(
        self,
        gm: fx.GraphModule,
        traced: fx.GraphModule,
        example_inputs: list[Any],
        report: GraphReport,
        opts: Options,
        plan: Plan,
        patches: dict[str, Any],
        key: str,
        known: str | None,
        capture: str,
        per_bucket: bool,
    ) -> Callable[..., Any]:
        """The code that runs: the substituted graph's (or Dynamo's, with nothing
        substituted), with Inductor or eagerly, through the whole-graph check where it runs."""
        if opts.default_codegen == "eager":
            return traced if report.substitutions else gm
        # Nothing substituted: Dynamo's own graph, so the result is exactly Inductor's.
        chosen = traced if report.substitutions else gm
        if report.substitutions and inductor_options.dynamo_inputs_matter(
            capture, gm, example_inputs
        ):  # weights, a KV cache: static; symbols: found again by their sources
            inductor_options.keep_dynamo_inputs(gm, traced)
        if report.substitutions and per_bucket:
            return whole_graph.per_bucket(gm, traced, example_inputs, report, opts, patches)
        if report.substitutions and key and known is None:
            rerun = partial(self._rerun, gm, example_inputs, plan, opts, key)
            args = (gm, traced, example_inputs, report, opts, patches, key, rerun)
            return whole_graph.faster_graph(*args)
        if not report.substitutions:
            whole_graph.nothing_substituted(key, known, report)
            if self._desugaring:  # compile_desugared compiles Dynamo's own graph
                return distributed.nothing_substituted
        return cast(
            Callable[..., Any],
            inductor_options.compile_substituted(chosen, example_inputs, patches),
        )

    def _rerun(
        self,
        gm: fx.GraphModule,
        example_inputs: list[Any],
        plan: Plan,
        opts: Options,
        key: str,
        static: bool,
    ) -> tuple[fx.GraphModule, GraphReport]:
        """The pass again for the whole-graph check (pdlkit/whole_graph.py): with a kernel at
        every site (the kernels-only graph), or ``static``: as ``autotune="off"`` matches
        (nothing measured). Its records are kept under the arguments a later compilation
        under that graph's verdict passes (``__call__``), which then replays them."""
        with self.session.compiling():
            return run_pass(
                gm, example_inputs, plan, verify=opts.verify,
                autotune="off" if static else opts.autotune, keep_sites=static,
                near_misses=False, verdict_key=key,
            )  # fmt: skip

    def _without_matcher(
        self,
        e: Exception,
        gm: fx.GraphModule,
        example_inputs: list[Any],
        opts: Options,
        patches: dict[str, Any],
    ) -> Callable[..., Any]:
        """torch-mlir is missing: Inductor (or eager) alone, said once per process; an error
        for explain, which has nothing to show without the matcher."""
        if self.explain_only:
            raise ConfigError(str(e)) from e
        self.session.warn_once(
            f"pdlkit: {e}; compiling with Inductor alone, nothing is substituted",
            process_wide=True,  # torch-mlir is missing for every backend
        )
        if opts.default_codegen == "eager":
            return gm
        from torch._inductor.compile_fx import compile_fx

        return cast(Callable[..., Any], compile_fx(gm, example_inputs, config_patches=patches))

    def _for_this_graph(
        self,
        gm: fx.GraphModule,
        example_inputs: list[Any],
        opts: Options,
        plan: Plan,
        patches: dict[str, Any],
    ) -> tuple[Options, Plan, Any]:
        """The options and plan for this graph: ranks agree (collectives), FSDP2 parameters
        are not pre-packed, a target's device must be here (unless explaining), and where
        CUDA graphs capture the graph only capture-safe kernels are eligible (``capture``)."""
        opts, plan = distributed.checked_options(gm, opts, plan)  # ranks agree; FSDP2 params
        on = plan.target.models_on
        if on and not self.explain_only and on not in host().devices:
            raise ConfigError(
                f"target {plan.target.name} plans for tensors on {on}, which this host lacks; "
                f"use it with pdlkit.explain / `pdlkit explain --target {plan.target.name}`"
            )
        capture = inductor_options.captured(patches, example_inputs, on)
        if capture:  # only kernels declared graph_capture_safe; explain names the others
            plan = replace(plan, registry=inductor_options.capture_safe(plan.registry, capture))
        return opts, plan, capture

    # Dynamo reuses a compiled frame while the backend compares equal. Comparing unequal once
    # a pattern or kernel file changed makes the next torch.compile(...) recompile with it.
    def __eq__(self, other: object) -> bool:
        if other is not self:
            return False
        return self._stamp is None or self._stamp == self._current_stamp(self.options)

    __hash__ = object.__hash__


pdlkit_backend = PdlkitBackend()
# pdlkit's CUDA kernels are user-defined Triton kernels of Inductor's code: its static launcher
inductor_options.launch_user_kernels_statically()


def optimize(
    model: Callable[..., Any],
    *,
    patterns: config.PathArg = None,
    kernels: config.PathArg = None,
    target: Any = None,
    default_codegen: str = "inductor",
    verify: bool | str = False,
    dynamic: bool | None = None,
    allow_world_writable: bool | None = None,
    autotune: str | None = None,
    mode: str | None = None,
    inductor_config: Mapping[str, Any] | None = None,
) -> Callable[..., Any]:
    """Compile ``model`` with pattern substitution; everything unmatched goes to Inductor.

    Before: ``y = model(x)`` runs ``linear -> gelu`` op by op. After::

        fast = pdlkit.optimize(model, patterns="my/patterns", kernels="my/kernels")
        y = fast(x)   # linear+gelu is one call of the kernel that implements "linear_gelu"

    ``target`` names the machine to plan for (default: this host). ``verify="first_call"``
    (or ``PDLKIT_VERIFY=1``) runs, for the first call of each shape at each site, the kernel
    and the subgraph it replaced, and switches off (with a warning) a substitution whose
    result disagrees; ``verify=True`` makes such a disagreement an error instead.
    World-writable pattern or kernel folders are refused unless ``allow_world_writable``
    (or ``PDLKIT_ALLOW_WORLD_WRITABLE=1``); see :mod:`pdlkit.runtime_abi.trust` for pins.

    ``autotune`` chooses each site's implementation by measurement on this host: every
    eligible kernel and the replaced subgraph under Inductor are timed on the site's shapes
    and weights, and the fastest runs, so pdlkit is never slower than Inductor alone.
    ``"cached"`` (the default; ``PDLKIT_AUTOTUNE``) measures on a miss of the decision cache
    (``PDLKIT_CACHE_DIR``, default ``~/.cache/pdlkit``), ``"full"`` measures again,
    ``"off"`` takes the kernel of highest priority (reproducible). A manifest's ``kernel:``
    pin always decides its pattern's sites.

    ``mode`` is Inductor's (``"reduce-overhead"``: CUDA graphs; see ``torch.compile``) and
    ``inductor_config`` holds Inductor config keys (``{"triton.cudagraphs": True}``); both
    apply to everything the backend compiles. Where the graph is captured in CUDA graphs,
    kernels not declared ``graph_capture_safe`` are not used (``explain`` says so).
    """
    backend = PdlkitBackend(**options_in(locals()))
    try:
        backend.plan(backend.options)  # bad files fail here, not at the first call
    except MissingDependency:
        pass  # the backend says so once, and compiles with Inductor alone
    compiled = _compile(model, backend, dynamic=dynamic)
    return remember(compiled, model, backend.options, backend.session, dynamic)


def explain(
    model: Callable[..., Any],
    *example_inputs: Any,
    patterns: config.PathArg = None,
    kernels: config.PathArg = None,
    target: Any = None,
    no_grad: bool = True,
    why: str | tuple[str, ...] = (),
    autotune: str | None = None,
    default_codegen: str | None = None,
    verify: bool | str | None = None,
    allow_world_writable: bool | None = None,
    mode: str | None = None,
    inductor_config: Mapping[str, Any] | None = None,
    dynamic: bool | None = None,
) -> Report:
    """What ``optimize`` would substitute for these inputs, and why other candidates were not.

    Takes ``optimize``'s options, or ``optimize``'s result, whose options it reuses (an
    option given here overrides): ``pdlkit.explain(pdlkit.optimize(model, patterns=p), x)``.

    ``why="linear_gelu"`` (or a tuple of names) walks that pattern against each candidate
    root and reports the closest partial match and its first failing op, operand or
    constraint (``report.graphs[i].why``; printed by ``str(report)``).

    The model runs eagerly once under Dynamo to capture its graphs. The kernels are chosen
    as ``optimize`` chooses them: with ``autotune`` on (the default, see ``optimize``) each
    site's candidates are timed, or read from the decision cache, and the report shows their
    times; with ``autotune="off"`` or a foreign ``target`` (``"yitian"`` works on any host)
    no kernel runs and nothing is compiled. ``str(report)`` is a short table;
    ``report.format(verbose=True)`` adds every pattern, kernel and silent pattern.

    ``dynamic`` is ``torch.compile``'s (default: the one ``optimize`` was given, when
    ``model`` is its result): with dynamic shapes the whole-graph verdict shown is the one
    for these inputs' shape bucket.
    """
    if dynamic is None:
        dynamic = dynamic_of(model)
    model, opts = unwrap(model, options_in(locals()))
    backend = PdlkitBackend(explain_only=True, why=(why,) if isinstance(why, str) else tuple(why))
    backend.options = opts
    try:
        plan = backend.plan(backend.options)
    except MissingDependency as e:
        raise ConfigError(str(e)) from e
    compiled = _compile(model, backend, dynamic=dynamic)
    with torch.no_grad() if no_grad else torch.enable_grad():
        compiled(*example_inputs)
    reports = [r for r, _ in backend.session.reports]  # this backend's graphs, in order
    plan = backend.session.reports[-1][1] if reports else plan
    return Report(
        target=plan.target.describe(),
        patterns=plan.pattern_infos(),
        kernels=[
            f"{k.name} v{k.version} ({k.op}, {k.device})" for k in plan.registry.kernels.values()
        ],
        graphs=reports,
        model_notes=distributed.subclass_weights(model),
    )

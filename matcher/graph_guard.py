"""The last word on a compiled graph: with substitutions, or Inductor's code for the whole graph.

    before: every site chose its fastest implementation on its own (matcher/choose.py), yet
            the graph can still be slower than Inductor alone: an opaque kernel call ends
            Inductor's fusions across the sites around it (seen on a Xeon with AMX: int8
            bert-mini 1.19x slower than PyTorch's int8 path with every site's choice a win)
    after:  both graphs are compiled and timed on the compilation's example inputs, and the
            faster one runs; the verdict is cached with the sites' decisions (per host). When
            the sites' own timings already say the substituted graph is much faster
            (:data:`CONFIDENT`), Inductor's graph is not compiled.

Only inference graphs whose runs a caller cannot see are timed (no input needs a gradient;
inputs written in place, as a decode step writes its KV cache, are copies): running one a few
more times has no effect a caller could see (:mod:`pdlkit.matcher.graph_writes`).
"""

from __future__ import annotations

import dataclasses
import statistics
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import torch
import torch.fx as fx
from pdlkit.matcher import candidate_code, graph_writes, lowered
from pdlkit.matcher.graph_verdict import (
    INDUCTOR,
    SAMPLES,
    SUBSTITUTED,
    faster,
    more_rounds,
    note_rounds,
    undecided,
)
from pdlkit.runtime_abi import autotune
from pdlkit.runtime_abi.autograd import grad_inputs
from pdlkit.runtime_abi.autotune import Decision, Timing
from pdlkit.runtime_abi.binding_stats import uncounted

#: A kernel at every site, near ties by priority (hedges.kernels_only): a candidate where it
#: differs from the substituted graph, as sites timed one by one do not add up (a Xeon with
#: AMX: int8 bert-mini with six sites kept ran 1.07x PyTorch's int8 path, with every site's
#: kernel 0.89x).
KERNELS = "kernels only"
#: Each site's first kernel, as autotune="off" chooses: a candidate where it differs from both
#: others, as sites timed alone at many threads misrank kernels (16-core Xeon, Llama BF16, 16
#: threads: oneDNN ahead of AMX at 2 of 4 sites; kernels only 0.983x Inductor's, AMX
#: everywhere 0.94x).
STATIC = "static priority"


def timeable(gm: fx.GraphModule, example_inputs: Sequence[Any], captured: bool = False) -> bool:
    """Whether running ``gm`` again on its example inputs is invisible to the caller (see
    :func:`untimeable`)."""
    return not untimeable(gm, example_inputs, captured)


def untimeable(gm: fx.GraphModule, example_inputs: Sequence[Any], captured: bool = False) -> str:
    """Why ``gm`` is not timed as a whole ("" when it is): a training graph, or an in-place
    write a caller would see though the inputs it writes are copied
    (:mod:`pdlkit.matcher.graph_writes`: a decode step's KV cache is written on a copy, but
    not in a compilation ``captured`` in CUDA graphs). A graph with dynamic shapes is timed
    per shape bucket (:mod:`pdlkit.matcher.graph_buckets`)."""
    if grad_inputs(example_inputs):  # a training graph (not parameters under no_grad)
        return "a training graph (inputs need gradients)"
    return graph_writes.unseen_writes(gm, example_inputs, captured)


def graph_key(gm: fx.GraphModule, example_inputs: Sequence[Any], kernels: Sequence[str]) -> str:
    shapes = [
        (list(x.shape), str(x.dtype), x.device.type) if isinstance(x, torch.Tensor) else repr(x)
        for x in example_inputs
    ]
    return autotune.site_key(["whole graph", str(gm.graph), shapes, sorted(kernels)])


# the sites' measured saving, as a share of the substituted graph's time, above which
# Inductor's whole graph is not compiled: a fusion that an opaque kernel call ends costs a few
# percent of a graph's time, not this much (benchmarks/x86_models.py shows the verdicts). The
# savings of dynamically quantized sites do not count (matcher/choose.py's Tuner._account);
# the others' predictions of 1-66% never had the graph's gain the wrong way round on the
# AVX-512 EPYC (benchmarks/x86_site_savings.py, results/x86_site_savings_epyc_avx512_t2_*.md)
CONFIDENT = 0.15
# ... and at or above which the saving is not believed: Inductor's graph would have to take
# twice the substituted graph's time. The right predictions reached 66% (ViT int8-static,
# +38% measured); 131% was bert-mini FP32 at 16 threads on the Xeon with AMX, whose graph ran
# 1.6% slower than Inductor's (results/x86_site_savings_xeon16_t16_retime_047065e.md): each
# site timed alone read its library calls slower than the whole graph of Inductor's ran. Such
# a saving is believed only where those calls, the sites' lower bounds, run one after another
# as in the graph (warm, not each alone) still take CONFIDENT more than the substituted graph:
# Inductor's graph runs them all (seen on the AVX2 EPYC: BF16 GEMMs without BF16 arithmetic,
# ATen's 20-74x a kernel's time, where Inductor's compile was most of the first compile). The
# FP32 and BF16 sweeps read 0.22-0.69x Inductor's compiled model on the 16-core Xeon at 16
# threads and 0.96x on the AVX2 EPYC (results/x86_library_sweep_*.md); oneDNN's int8 GEMMs
# read 1.56x there, and are not swept (matcher/choose.py).
BELIEVABLE = 1.0


def plan_key(gm: fx.GraphModule, example_inputs: Sequence[Any], plan: str) -> str:
    """The key of a verdict known before matching: Dynamo's graph, its inputs and the plan
    (pattern and kernel files, options) it would be matched with."""
    return graph_key(gm, example_inputs, ["plan " + plan])


def known_verdict(key: str) -> str | None:
    """A cached verdict that decides before matching (see :func:`plan_key`): INDUCTOR (a
    second compilation then skips the re-trace and matching, and costs what Inductor's own
    does), KERNELS (matched with a kernel at every site) or STATIC (matched as
    ``autotune="off"`` matches); else None."""
    decision = autotune.decision_cache().get(key)
    if decision is None or decision.choice not in (INDUCTOR, KERNELS, STATIC):
        return None
    return decision.choice


def remember(key: str, decision: Decision) -> None:
    autotune.decision_cache().put(key, decision)


def choose(
    key: str,
    substituted: Callable[[], Callable[..., Any]],
    inductor: Callable[[], Callable[..., Any]],
    example_inputs: Sequence[Any],
    mode: str,
    saved_us: float | None = None,
    *,
    kernels_only: Callable[[], Callable[..., Any]] | None = None,
    static: Callable[[], Callable[..., Any]] | None = None,
    written: Sequence[int] = (),
    left_out: Mapping[str, str] | None = None,
    first: str = SUBSTITUTED,
    later: Later | None = None,
    library_calls: Sequence[Callable[[], float]] = (),
) -> tuple[str, Callable[..., Any], Decision]:
    """Compile and time both graphs (``substituted`` / ``inductor`` compile one each), or
    read the verdict from the decision cache; return the verdict and the faster graph's code.

    ``saved_us``: what the substituted sites saved against their subgraphs, each timed on its
    own (matcher/choose.py). At :data:`CONFIDENT` of the substituted graph's own time or more,
    Inductor's graph is not compiled (most of the first compile's cost), and the substituted
    graph wins unless the kernels-only graph (below) is faster. Not where the substituted
    graph's own rounds were unsteady twice (the host was busy, and the sites' timings with it:
    a 2-core Xeon's sites, timed 10-50x slow, "saved" 2.4 ms of a GPT-2 int8 graph that ran
    1.17x PyTorch's); then Inductor's graph is timed too (and again where it wins: SECOND_LOOK).

    ``kernels_only`` / ``static``: further candidates where they differ, the graph with a
    kernel at every site (:data:`KERNELS`) and static priority's (:data:`STATIC`).

    ``written``: positions of example inputs the graph writes in place (a KV cache): every
    graph runs on one copy of those (graph_writes.scratch_inputs), the caller's stay as they
    were. ``left_out``: hedges not compiled, and why (matcher/hedges.py), noted in the
    verdict's timings. ``first``: the name ``substituted`` is timed and cached under
    (:data:`KERNELS` where the kernels-only graph stands in for it, without ``kernels_only``).
    ``later``: on the CPU, a first look that contradicts the sites' saving is looked at again
    after the compile (:class:`LaterLook`, returned as the code, with the first look's
    decision, its source :data:`PENDING`), not at once, as is a graph an earlier compile left
    to such a look (:data:`LATER_KEY`). ``library_calls``: see :data:`BELIEVABLE`."""
    makers = _makers(substituted, inductor, kernels_only, static)
    if first != SUBSTITUTED:
        assert first not in makers, f"{first} given twice"
        makers = {first if n == SUBSTITUTED else n: m for n, m in makers.items()}
    cache = autotune.decision_cache()
    decision = cache.get(key) if mode == "cached" else None
    if decision is not None and decision.choice in makers:
        return decision.choice, makers[decision.choice](), decision
    loaded = candidate_code.Loaded()  # the losers' code is unloaded below
    makers = {n: loaded.tracked(n, m) for n, m in makers.items()}
    ours = makers[first]()
    device = autotune.device_of(example_inputs)
    defer = later is not None and device == "cpu"  # a look after the compile can be taken
    hint = cache.get(key + LATER_KEY) if defer and mode == "cached" else None
    if hint is not None and later is not None:
        return _looked_at_later(key, hint, makers, first, ours, written, loaded, later)
    tensors = graph_writes.scratch_inputs(example_inputs, written)  # for the rounds below
    with torch.no_grad(), uncounted():
        why, timings = _confident(partial(ours, *tensors), device, saved_us, first, library_calls)
        skipped = [Timing(name, None, why) for name, why in (left_out or {}).items()]
        confident = bool(why)
        if confident:
            skipped.append(Timing(INDUCTOR, None, f"not compiled: {why}"))
            if kernels_only is None and static is None:
                decision = Decision(first, [*timings, *skipped])
                cache.put(key, decision)
                return first, ours, decision
        # confident: Inductor's graph is beaten, yet the kernels-only or static graph may not be
        others = {
            n: m for n, m in makers.items() if n != first and not (confident and n == INDUCTOR)
        }
        fns, failed = _compiled(others)
        fns = {first: ours, **fns}
        runs = [(n, _call(f, tensors)) for n, f in fns.items()]
        timings, pending = _rounds(runs, device, saved_us, defer)
        timings += failed + skipped
    if pending and later is not None:
        decision = Decision(faster(timings), timings, PENDING)
        cache.put(key + LATER_KEY, decision)
        look = LaterLook(key, fns, decision, written, loaded, later)
        return decision.choice, look, decision
    return _settle(key, fns, Decision(faster(timings), timings), loaded)


def _settle(
    key: str, fns: dict[str, Callable[..., Any]], decision: Decision, loaded: candidate_code.Loaded
) -> tuple[str, Callable[..., Any], Decision]:
    """The verdict's code, its verdict cached (where steady) and the other graphs' code
    unloaded."""
    if autotune.trusted(decision):  # a busy host's verdict holds for this compilation only
        autotune.decision_cache().put(key, decision)
    loaded.unload(decision.choice)
    return decision.choice, fns[decision.choice], decision


def _rounds(
    runs: list[tuple[str, Callable[[], Any]]],
    device: str,
    saved_us: float | None,
    defer: bool = False,
    first: str = "",
) -> tuple[list[Timing], bool]:
    """The candidates' paired rounds: more where undecided, a second look where Inductor's
    graph won against the sites' saving (the first look's verdict is noted beside it, as is
    ``first``, what an earlier look read); and whether that second look is put off to after
    the compile (``defer``: :class:`LaterLook`, also where the saving is unknown)."""
    timings = _measure(runs, device)
    pending = False
    if undecided(timings):
        timings = more_rounds(timings, _measure(runs, device))
    elif _contradicts(timings, saved_us) or (defer and _lost_unmeasured(timings, saved_us)):
        if defer:
            pending = True
        else:
            first, timings = _first_look(timings), _measure(runs, device)
    note_rounds(timings, first)
    return timings, pending


_Make = Callable[[], Callable[..., Any]]


def _makers(
    substituted: _Make, inductor: _Make, kernels_only: _Make | None, static: _Make | None
) -> dict[str, _Make]:
    """The candidates' compiles by name, in the order they are timed (None: no candidate)."""
    named = {SUBSTITUTED: substituted, KERNELS: kernels_only, STATIC: static, INDUCTOR: inductor}
    return {n: m for n, m in named.items() if m is not None}


# a first look at the substituted graph's time (round-robin samples of it alone) before its
# full rounds: a saving under this share of CONFIDENT there cannot reach it, and the full
# rounds, which the three-way timing repeats anyway, are not taken (bert-mini FP32's sites
# saved 0 us of a 23 ms graph: 21 rounds of it alone were 1 s of its first compile for nothing)
GLANCE, GLANCE_SHARE = 3, 0.7


def _confident(
    run: Callable[[], Any],
    device: str,
    saved_us: float | None,
    name: str = SUBSTITUTED,
    library_calls: Sequence[Callable[[], float]] = (),
) -> tuple[str, list[Timing]]:
    """Why the substituted graph needs no comparison with Inductor's ("" where it does): the
    sites' saving is at least CONFIDENT of its time, timed steadily (see :func:`choose`), and
    under BELIEVABLE of it, or else their ``library_calls``, swept, take CONFIDENT more than
    it; and that graph's timings (none when a glance sufficed)."""
    if saved_us is None or saved_us <= 0:
        return "", []
    budget = BUDGETS * autotune.budget_s()
    # on CUDA as the host issues the calls, as _measure's rounds time them
    (glance,) = autotune.measure([(name, run)], device, budget, samples=GLANCE, gpu_time=False)
    if glance.us is None or saved_us < GLANCE_SHARE * CONFIDENT * glance.us:
        return "", []
    alone = [(name, run)]
    timings = _measure(alone, device, _clear_of(saved_us))
    if _saves_enough(saved_us, timings[0]) and not autotune.steady(timings[0]):
        timings = _measure(alone, device, _clear_of(saved_us))  # a second look (SECOND_LOOK)
    graph = timings[0]
    if not _saves_enough(saved_us, graph):
        return "", timings
    if not autotune.steady(graph):  # the sites' timings are suspect too
        _warn_busy(graph)
        return "", timings
    if saved_us < BELIEVABLE * (graph.us or 0.0):
        return f"the sites save {saved_us:.0f} us, over {CONFIDENT:.0%}", timings
    need = (1 + CONFIDENT) * (graph.us or 0.0)
    bound = lowered.swept(library_calls, need, autotune.budget_s())
    if bound is not None and bound >= need:
        why = f"the sites' library calls alone take {bound:.0f} us or more, {CONFIDENT:.0%} over it"
        return why, timings
    _warn_unbelievable(saved_us, graph, bound)
    return "", timings


# Where a first look disagrees with what the sites measured, the rounds are taken once more and
# the second look decides: unsteady rounds of the substituted graph alone (a confident saving
# would skip Inductor's compile), or Inductor's graph winning where the sites said the
# substituted graph saves at least MARGIN of its time. A burst of load on the host hits one
# look and not the next: seen on the 16-core Xeon with AMX, int8-static bert-mini at 16
# threads, 6 of the substituted graph's 21 samples at twice the others' (a 92% spread: the
# saving was not trusted and Inductor's whole graph compiled), then Inductor's graph winning
# the three-way rounds, 3.15 against 3.43 ms, while the same two graphs timed right after
# read 3.09 and 2.66 ms (x86_whole_graph_xeon16_bertmini_int8s_t16_ec31252.md). A verdict that holds
# (the fusions an opaque call ends: int8 bert-mini 1.19x with every site a win) holds twice.
SECOND_LOOK = "a second look"

# On the CPU that second look (Inductor's graph winning against the sites' saving) is taken at
# the first call of the model LATER_S or more after the first look, not at once: inside the
# compile the 16-core Xeon with AMX read the kernels' graph slow look after look (BF16
# bert-mini, 16 threads: Inductor's graph kept in 5 of 6 compiles at 3.5-5.4 against 3.8-4.8
# ms), where the same rounds of the same graphs a second after the compile read 2.4-3.3
# against 3.6-5.0 ms in 6 of 6 (results/x86_site_savings_xeon16_t16_bf16_inside_04cba62.md;
# static priority's graph, no check, 0.65-0.77x Inductor's from 0.6 s after its compile on).
# Until then Inductor's graph runs: the first look's winner, never slower by it.
LATER_S = 1.0
PENDING = "a first look, looked at again after the compile"


@dataclasses.dataclass
class Later:
    """What a look after the compile (:class:`LaterLook`) needs from its compilation:
    ``around`` wraps its timing (the substituted graphs' first-call checks put off:
    binding.DeferredChecks), ``heard`` hears its verdict, ``failed`` why it failed."""

    around: Callable[[Callable[[], Any]], Any] = lambda timed: timed()
    heard: Callable[[Decision], None] = lambda decision: None
    failed: Callable[[str], None] = lambda why: None


class LaterLook:
    """The code of a graph whose verdict is looked at again after the compile (see
    :data:`LATER_S`): ``first``'s choice runs until the first call LATER_S or more after it,
    which times every candidate of ``fns`` on that call's inputs (those at ``written`` on
    copies) as the check does, runs the faster, caches the verdict under ``key`` (where
    steady), unloads the others' code and tells ``later.heard``. A look that raises keeps
    the first look's choice, and says so once."""

    def __init__(
        self,
        key: str,
        fns: dict[str, Callable[..., Any]],
        first: Decision,
        written: Sequence[int],
        loaded: candidate_code.Loaded,
        later: Later,
    ):
        self.fn, self.decision = fns[first.choice], first
        self._key, self._fns, self._written = key, dict(fns), tuple(written)
        self._loaded, self._later = loaded, later
        self._due = time.monotonic() + LATER_S
        self._lock = threading.Lock()

    def __call__(self, *args: Any) -> Any:
        if self._fns and time.monotonic() >= self._due:
            with self._lock:
                if self._fns:
                    self._look(args)
        return self.fn(*args)

    def _look(self, args: Sequence[Any]) -> None:
        fns, self._fns = self._fns, {}
        try:
            self._decide(fns, args)
        finally:  # the graphs not chosen, and the compilation's, are freed with their code
            del self._later, self._loaded

    def _decide(self, fns: dict[str, Callable[..., Any]], args: Sequence[Any]) -> None:
        tensors = graph_writes.scratch_inputs(args, self._written)
        runs = [(n, _call(f, tensors)) for n, f in fns.items()]
        when = " after the compile"
        try:
            with torch.no_grad(), uncounted():
                timings, _ = self._later.around(
                    lambda: _rounds(
                        runs, "cpu", None, first=_first_look(self.decision.timings, when)
                    )
                )
        except Exception as e:  # noqa: BLE001 - any failure: the first look's choice stays
            why = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
            said = f"the look after the compile failed ({why}); {self.decision.choice}'s graph runs"
            warnings.warn(f"pdlkit: whole-graph check: {said}", stacklevel=4)
            self._later.failed(said)
            return
        timings += [t for t in self.decision.timings if t.us is None]  # not compiled, and why
        _, self.fn, self.decision = _settle(
            self._key, fns, Decision(faster(timings), timings), self._loaded
        )
        self._later.heard(self.decision)


# Where a compile left its verdict to the look after it (PENDING), the first look is cached
# under the graph's key + LATER_KEY until that look's verdict is: the next compile of the
# graph takes no rounds inside it, which misled on this host (LATER_S), but compiles the
# graphs, from Inductor's warm caches, for the look after it (seen on the Xeon with AMX, ViT
# BF16 at 16 threads: a second compile 2.46x Inductor's, 1.3 against 0.5 s, where the look
# had not been taken, results/x86_models_xeon16_t16_bf16_all_5666d05.md).
LATER_KEY = " (its look after the compile still to come)"


def _looked_at_later(
    key: str,
    hint: Decision,
    makers: dict[str, _Make],
    first: str,
    ours: Callable[..., Any],
    written: Sequence[int],
    loaded: candidate_code.Loaded,
    later: Later,
) -> tuple[str, Callable[..., Any], Decision]:
    """The graphs of ``makers`` compiled (``first``'s is ``ours``), and the code of a look
    after the compile that runs the earlier compile's first choice (``hint``) until then."""
    fns, failed = _compiled({n: m for n, m in makers.items() if n != first})
    fns = {first: ours, **fns}
    earlier = [
        Timing(t.name, t.us, "; ".join(filter(None, ["an earlier compile's", t.note])), t.low)
        for t in hint.timings
        if t.us is not None
    ]
    choice = hint.choice if hint.choice in fns else first
    decision = Decision(choice, [*earlier, *failed], PENDING)
    return choice, LaterLook(key, fns, decision, written, loaded, later), decision


def _saves_enough(saved_us: float, t: Timing) -> bool:
    """Whether the sites' saving is at least CONFIDENT of the substituted graph's time."""
    return t.us is not None and saved_us >= CONFIDENT * t.us


def _won_by_inductor(timings: Sequence[Timing]) -> Timing | None:
    """The graph with substitutions timed first, where both it and Inductor's graph were
    timed and Inductor's won these rounds (None otherwise)."""
    ours = timings[0] if timings and timings[0].name != INDUCTOR else None  # timed first
    theirs = next((t for t in timings if t.name == INDUCTOR), None)
    if ours is None or ours.us is None or theirs is None or theirs.us is None:
        return None
    return ours if faster(timings) == INDUCTOR else None


def _contradicts(timings: Sequence[Timing], saved_us: float | None) -> bool:
    """Whether Inductor's graph won these rounds while the sites, each timed on its own, said
    the substituted graph saves at least MARGIN of its time (see :data:`SECOND_LOOK`)."""
    ours = _won_by_inductor(timings)
    return bool(saved_us) and ours is not None and saved_us >= autotune.MARGIN * (ours.us or 0.0)


def _lost_unmeasured(timings: Sequence[Timing], saved_us: float | None) -> bool:
    """Whether Inductor's graph won where the sites' saving is unknown (a pin, or a busy host):
    on the CPU looked at again after the compile too (ViT BF16, 16 threads, Xeon with AMX: an
    unsteady site, a tie read inside the compile, Inductor's graph kept where the AMX kernels
    ran 0.920x it without the check; results/x86_models_xeon16_t16_vit_bf16_2eb64ae.md)."""
    return saved_us is None and _won_by_inductor(timings) is not None


def _first_look(timings: Sequence[Timing], when: str = "") -> str:
    """What a first look that a second replaced had read (for explain)."""
    read = ", ".join(f"{t.name} {t.us:.0f} us" for t in timings if t.us is not None)
    return f"{SECOND_LOOK}{when}; the first read {read}"


def _warn_busy(t: Timing) -> None:
    warnings.warn(
        f"pdlkit: whole-graph check: the host was busy while timing (the substituted graph's "
        f"rounds spread {autotune.spread(t) or 0.0:.0%} of their median): the sites' measured "
        f"saving is not trusted, Inductor's graph is compiled and timed too",
        stacklevel=4,
    )


def _warn_unbelievable(saved_us: float, t: Timing, bound: float | None) -> None:
    calls = "" if bound is None else f", and their library calls, swept, take {bound:.0f} us"
    warnings.warn(
        f"pdlkit: whole-graph check: the sites' own timings say they save {saved_us:.0f} us, "
        f"as much as the graph with them takes ({t.us or 0.0:.0f} us{calls}; see BELIEVABLE): "
        f"not believed, Inductor's graph is compiled and timed too",
        stacklevel=4,
    )


def _compiled(
    makers: dict[str, Callable[[], Callable[..., Any]]],
) -> tuple[dict[str, Callable[..., Any]], list[Timing]]:
    """The other graphs' code; one that fails to compile is no candidate (said once, with
    the cause): the substituted graph, already compiled, is never lost to it."""
    fns: dict[str, Callable[..., Any]] = {}
    failed: list[Timing] = []
    for name, make in makers.items():
        try:
            fns[name] = make()
        except Exception as e:  # noqa: BLE001 - any compile error: the graph is no candidate
            note = f"did not compile: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
            warnings.warn(f"pdlkit: whole-graph check: the {name} graph {note}", stacklevel=4)
            failed.append(Timing(name, None, note))
    return fns, failed


def _call(fn: Callable[..., Any], tensors: list[Any]) -> Callable[[], Any]:
    return lambda: fn(*tensors)


# the time the whole graphs' rounds may take, in sites' budgets (PDLKIT_AUTOTUNE_BUDGET): with
# one, BERT-base 1x128's three graphs (75 ms a call each) got 7 rounds on the EPYC, and its
# verdict kept Inductor's graph where kernels everywhere ran 0.946x its time; 21 rounds take
# 4.7 s there, against the 50 s that compiling the three costs
BUDGETS = 5
# untimed calls of a graph before each of its samples, so that each is timed after its own
# call, as a model runs call after call. Graphs that share pre-packed weights (the
# substituted and kernels-only ones) warm the caches for each other, Inductor's graph does
# not: right after PyTorch's int8 graph a substituted graph ran 6-8% slower than right after
# a graph with the same packed weights (int8 bert-mini, 1 thread, the 2-core Xeon with AMX:
# 5.10 against 4.75 ms, the same kernels either way round), which leaned verdicts one way.
# Only graphs shorter than LEAD_BELOW_S take it: the effect shrank with the graph's time (BF16
# bert-mini, 8.5 ms: 0-4%; FP32, 25 ms: 0-2%), while the lead calls doubled the check's
# timing (FP32 bert-mini: 3.4 s of its first compile's 18 s under a profiler). Not 12 ms: on a
# slow day of the same VM int8-dynamic bert-mini took 12-15 ms a call, and without lead calls
# the check kept Inductor's graph in 2 of 3 compiles, its kernels' graphs timed 3-8% slower
# than Inductor's, where they run 0.89x its time call after call; with them, 3 of 3 took the
# kernels (7-12% faster in the check)
LEAD, LEAD_BELOW_S = 1, 0.020


# A verdict settled before SAMPLES rounds: after at least EARLY rounds, one graph was the faster
# in every round against each other kind (a graph with substitutions against Inductor's, or
# Inductor's against each with substitutions), by at least DECISIVE of the slower's median. A
# graph no faster than the other wins EARLY paired rounds in a row with probability 2^-EARLY
# (0.8%, under SIGN_LEVEL), and the lead is twice the verdict's MARGIN; close calls still take
# every round. The rounds of a large graph are most of its check: BERT-base 1x128 FP32 on the
# AMD EPYC, three graphs at 230-270 ms a call, 10 s of rounds within the budget, its
# substituted graph 15% ahead of Inductor's.
EARLY, DECISIVE = 7, 2 * autotune.MARGIN


def _decisive(found: dict[str, list[float]]) -> bool:
    """Whether the rounds so far settle the verdict (see :data:`EARLY`). Without Inductor's
    graph in the rounds (the sites' saving was confident, or it did not compile: it cannot
    be chosen), graphs with substitutions are settled after EARLY rounds: a wrong pick among
    them costs their difference, not a loss to Inductor's code. Every graph's rounds must be
    steady (``autotune.steady``): a verdict read from unsteady rounds is not cached
    (``autotune.trusted``), and more rounds steady it."""
    if not found or min(map(len, found.values())) < EARLY:
        return False
    if not all(autotune.steady(Timing(n, rounds=v)) for n, v in found.items()):
        return False
    theirs = found.get(INDUCTOR)
    ours = [v for n, v in found.items() if n != INDUCTOR]
    if theirs is None:
        return len(ours) > 1

    def leads(a: list[float], b: list[float]) -> bool:  # a faster in every round, decisively
        pairs = list(zip(a, b, strict=False))
        ahead = statistics.median(a) <= statistics.median(b) * (1 - DECISIVE)
        return ahead and all(x < y for x, y in pairs)

    best = min(ours, key=statistics.median)
    return leads(best, theirs) or all(leads(theirs, v) for v in ours)


def _clear_of(saved_us: float) -> Callable[[dict[str, list[float]]], bool]:
    """For the substituted graph's rounds alone (:func:`_confident`): settled after EARLY
    steady rounds whose median puts the sites' saving DECISIVE clear of CONFIDENT's line."""

    def settled(found: dict[str, list[float]]) -> bool:
        (rounds,) = found.values()
        if len(rounds) < EARLY or not autotune.steady(Timing(SUBSTITUTED, rounds=rounds)):
            return False
        share = saved_us / (statistics.median(rounds) * 1e6)
        return abs(share - CONFIDENT) >= DECISIVE * CONFIDENT

    return settled


def _measure(
    runs: list[tuple[str, Callable[[], Any]]],
    device: str,
    settled: Callable[[dict[str, list[float]]], bool] = _decisive,
) -> list[Timing]:
    """The graphs' rounds, ended early where ``settled`` says (:data:`EARLY`); on CUDA as
    the host issues their calls, launches included: a site's GPU time alone
    (runtime_abi/cuda_timing.py) leaves the host's cost to this check."""
    budget = BUDGETS * autotune.budget_s()
    return autotune.measure(
        runs,
        device,
        budget,
        samples=SAMPLES,
        lead=LEAD,
        lead_below=LEAD_BELOW_S,
        gpu_time=False,
        settled=settled,
    )

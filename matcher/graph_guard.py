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
import math
import statistics
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.fx as fx
from pdlkit.matcher import candidate_code, graph_writes
from pdlkit.runtime_abi import autotune
from pdlkit.runtime_abi.autograd import grad_inputs
from pdlkit.runtime_abi.autotune import Decision, Timing
from pdlkit.runtime_abi.binding_stats import uncounted

SUBSTITUTED, INDUCTOR = "substituted", "inductor"
KERNELS = "kernels only"  # a kernel at every site, near ties by priority (choose.kernels_only)
STATIC = "static priority"  # each site's first kernel, as autotune="off" chooses


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
# 1.6% slower than Inductor's (results/x86_site_savings_xeon16_t16_retime_047065e.md)
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
) -> tuple[str, Callable[..., Any], Decision]:
    """Compile and time both graphs (``substituted`` / ``inductor`` compile one each), or
    read the verdict from the decision cache; return the verdict and the faster graph's code.

    ``saved_us``: what the substituted sites saved against their subgraphs, each timed on its
    own (matcher/choose.py). When that is at least :data:`CONFIDENT` of the substituted
    graph's own time, Inductor's graph is not compiled (a whole Inductor compile: most of the
    first compile's cost), and the substituted graph wins unless the kernels-only graph
    (below) measures faster: the sites' saving says nothing about that one. Not when the
    substituted graph's own rounds were unsteady twice (``autotune.steady``: the host was
    busy, and the sites' timings with it; :data:`SECOND_LOOK`): then Inductor's graph is
    compiled and timed as well, and where it wins against the sites' saving, timed again (seen on
    a 2-core Xeon, GPT-2 int8-dynamic on 2 threads beside another busy process: sites timed
    10-50x slow "saved" 2.4 ms, and the substituted graph ran 1.17x PyTorch's int8 path).

    ``kernels_only``: where it differs from the substituted graph (some sites kept their
    subgraph because it measured faster on its own, or took a kernel near the fastest that
    is not the first in priority), the graph with a kernel at every site, near ties going by
    priority (matcher/choose.py's ``kernels_only``), timed as a third candidate
    (:data:`KERNELS`): sites timed one by one do not add up (seen on a Xeon with AMX: int8
    bert-mini with six sites kept ran 1.07x PyTorch's int8 path, with every site's kernel
    0.89x).

    ``static``: where it differs from both, static priority's graph (:data:`STATIC`): sites
    timed alone at many threads misrank kernels (16-core Xeon, Llama BF16, 16 threads: oneDNN
    ahead of AMX at 2 of 4 sites; kernels only 0.983x Inductor's, AMX everywhere 0.94x).

    ``written``: positions of example inputs the graph writes in place (a KV cache): every
    graph runs on one copy of those (graph_writes.scratch_inputs), the caller's stay as they
    were. ``left_out``: hedges not compiled, and why (matcher/hedges.py), noted in the
    verdict's timings. ``first``: the name ``substituted`` is timed and cached under
    (:data:`KERNELS` where the kernels-only graph stands in for it, without ``kernels_only``)."""
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
    tensors = graph_writes.scratch_inputs(example_inputs, written)
    device = autotune.device_of(tensors)
    with torch.no_grad(), uncounted():
        confident, timings = _confident(lambda: ours(*tensors), device, saved_us, first)
        skipped = [Timing(name, None, why) for name, why in (left_out or {}).items()]
        if confident:
            note = f"not compiled: the sites save {saved_us:.0f} us, over {CONFIDENT:.0%}"
            skipped.append(Timing(INDUCTOR, None, note))
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
        timings = _rounds(runs, device, saved_us) + failed + skipped
    decision = Decision(_faster(timings), timings)
    if autotune.trusted(decision):  # a busy host's verdict holds for this compilation only
        cache.put(key, decision)
    loaded.unload(decision.choice)
    return decision.choice, fns[decision.choice], decision


def _rounds(
    runs: list[tuple[str, Callable[[], Any]]], device: str, saved_us: float | None
) -> list[Timing]:
    """The candidates' paired rounds: more where undecided, a second look where Inductor's
    graph won against the sites' saving (the first look's verdict is noted beside it)."""
    timings = _measure(runs, device)
    first = ""
    if _undecided(timings):
        timings = _more_rounds(timings, _measure(runs, device))
    elif _contradicts(timings, saved_us):
        first, timings = _first_look(timings), _measure(runs, device)
    _note_rounds(timings, first)
    return timings


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
    run: Callable[[], Any], device: str, saved_us: float | None, name: str = SUBSTITUTED
) -> tuple[bool, list[Timing]]:
    """Whether the sites' saving is at least CONFIDENT of the substituted graph's time, timed
    steadily (see :func:`choose`), and under BELIEVABLE of it; and that graph's timings (none
    when a glance sufficed)."""
    if saved_us is None or saved_us <= 0:
        return False, []
    budget = BUDGETS * autotune.budget_s()
    # on CUDA as the host issues the calls, as _measure's rounds time them
    (glance,) = autotune.measure([(name, run)], device, budget, samples=GLANCE, gpu_time=False)
    if glance.us is None or saved_us < GLANCE_SHARE * CONFIDENT * glance.us:
        return False, []
    alone = [(name, run)]
    timings = _measure(alone, device, _clear_of(saved_us))
    if _saves_enough(saved_us, timings[0]) and not autotune.steady(timings[0]):
        timings = _measure(alone, device, _clear_of(saved_us))  # a second look (SECOND_LOOK)
    confident = _saves_enough(saved_us, timings[0])
    if confident and not autotune.steady(timings[0]):  # the sites' timings are suspect too
        confident = False
        _warn_busy(timings[0])
    elif confident and saved_us >= BELIEVABLE * (timings[0].us or 0.0):
        confident = False
        _warn_unbelievable(saved_us, timings[0])
    return confident, timings


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


def _saves_enough(saved_us: float, t: Timing) -> bool:
    """Whether the sites' saving is at least CONFIDENT of the substituted graph's time."""
    return t.us is not None and saved_us >= CONFIDENT * t.us


def _contradicts(timings: Sequence[Timing], saved_us: float | None) -> bool:
    """Whether Inductor's graph won these rounds while the sites, each timed on its own, said
    the substituted graph saves at least MARGIN of its time (see :data:`SECOND_LOOK`)."""
    t = {x.name: x for x in timings}
    ours = timings[0] if timings and timings[0].name != INDUCTOR else None  # timed first
    if not saved_us or ours is None or ours.us is None or _faster(timings) != INDUCTOR:
        return False
    return INDUCTOR in t and t[INDUCTOR].us is not None and saved_us >= autotune.MARGIN * ours.us


def _first_look(timings: Sequence[Timing]) -> str:
    """What a first look that a second replaced had read (for explain)."""
    read = ", ".join(f"{t.name} {t.us:.0f} us" for t in timings if t.us is not None)
    return f"{SECOND_LOOK}; the first read {read}"


def _warn_busy(t: Timing) -> None:
    warnings.warn(
        f"pdlkit: whole-graph check: the host was busy while timing (the substituted graph's "
        f"rounds spread {autotune.spread(t) or 0.0:.0%} of their median): the sites' measured "
        f"saving is not trusted, Inductor's graph is compiled and timed too",
        stacklevel=4,
    )


def _warn_unbelievable(saved_us: float, t: Timing) -> None:
    warnings.warn(
        f"pdlkit: whole-graph check: the sites' own timings say they save {saved_us:.0f} us, "
        f"as much as the graph with them takes ({t.us or 0.0:.0f} us; see BELIEVABLE): not "
        f"believed, Inductor's graph is compiled and timed too",
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


# samples per whole graph (round-robin, median): a graph runs for milliseconds, so these cost a
# fraction of a second against the seconds its compile took; 9 (the sites' count) left verdicts
# to chance on a loaded host (a Xeon with AMX, int8 bert-mini: verdicts 1.8% apart flipped
# between runs while the compiled graphs differed by 5-10% either way over 21 rounds)
SAMPLES = 21
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


# the share of rounds a graph with substitutions must win against Inductor's, run for run
WIN_SHARE = 0.7
# an undecided verdict's second look (see _undecided): a one-sided sign test at this level
SIGN_LEVEL = 0.04


def _faster(timings: Sequence[Timing]) -> str:
    """The fastest graph with substitutions, if it beats Inductor's by ``MARGIN`` (the sites'
    margin: a gain smaller than that is within a shared host's noise, and the graph must never
    be slower than Inductor's) and was the faster of the two in ``WIN_SHARE`` of the rounds
    (:func:`consistent`); otherwise, or when they failed, Inductor's code."""
    t = {x.name: x for x in timings}
    best, theirs = _best_ours(t), t.get(INDUCTOR)
    if best is None:
        return INDUCTOR
    if theirs is None or theirs.us is None:
        return best.name
    if (best.us or 0.0) >= theirs.us * (1 - autotune.MARGIN) or not consistent(best, theirs):
        return INDUCTOR
    return best.name


def _best_ours(t: dict[str, Timing]) -> Timing | None:
    """The fastest measured graph with substitutions (ties by name), or None."""
    ours = [x for n, x in t.items() if n != INDUCTOR and x.us is not None]
    return min(ours, key=lambda x: (x.us or 0.0, x.name)) if ours else None


def _undecided(timings: Sequence[Timing]) -> bool:
    """Whether the fastest graph with substitutions leads Inductor's by ``MARGIN`` on the
    medians and was the faster in more than half of the rounds, yet in fewer than
    ``WIN_SHARE`` of them: on a noisy host a real lead of a few percent looks like this in
    21 rounds (seen on a 2-core Xeon with AMX, int8-dynamic bert-mini on 2 threads: the
    kernels-only graph 5.2% ahead on the medians, per-round ratios from 0.8 to 1.4, and 0.93x
    Inductor's time when measured at length). Such a verdict gets a second set of rounds."""
    t = {x.name: x for x in timings}
    best, theirs = _best_ours(t), t.get(INDUCTOR)
    if best is None or theirs is None or theirs.us is None or not best.rounds:
        return False
    won, n = _wins(best, theirs)
    led = (best.us or 0.0) < theirs.us * (1 - autotune.MARGIN)
    return led and 2 * won > n and not consistent(best, theirs)


def _more_rounds(first: Sequence[Timing], more: Sequence[Timing]) -> list[Timing]:
    """Each graph's rounds of both measurements, its median over all of them."""
    extra = {x.name: x.rounds for x in more}
    merged = []
    for x in first:
        rounds = x.rounds + extra.get(x.name, [])
        us = statistics.median(rounds) * 1e6 if rounds else x.us
        merged.append(dataclasses.replace(x, us=us, rounds=rounds))
    return merged


def _sign_test(won: int, n: int) -> float:
    """P(at least ``won`` wins in ``n`` fair coin flips): how likely a graph no faster than
    Inductor's wins that many of the paired rounds."""
    return sum(math.comb(n, k) for k in range(won, n + 1)) / 2**n if n else 1.0


def _note_rounds(timings: list[Timing], first: str = "") -> None:
    """Each graph with substitutions says in how many rounds it beat Inductor's (explain's
    whole-graph line; what :func:`consistent` decides on), and what a first look that a
    second replaced had read (``first``)."""
    theirs = next((t for t in timings if t.name == INDUCTOR and t.rounds), None)
    for t in timings:
        if theirs is not None and t is not theirs and t.rounds:
            won, n = _wins(t, theirs)
            t.note = f"faster than inductor's in {won} of {n} rounds"
            t.note += f"; {first}" if first else ""


def _wins(ours: Timing, theirs: Timing) -> tuple[int, int]:
    """(rounds ``ours`` was the faster in, rounds both ran)."""
    pairs = list(zip(ours.rounds, theirs.rounds, strict=False))
    return sum(a < b for a, b in pairs), len(pairs)


def consistent(ours: Timing, theirs: Timing) -> bool:
    """Whether ``ours`` was faster than ``theirs`` in at least ``WIN_SHARE`` of the rounds
    both ran (each round runs every graph once, moments apart, so a burst of load on a shared
    host hits both): a median lead alone is picked from noise too often where the graphs are
    about as fast. Seen on a Xeon with AMX: FP32 bert-mini, whose verdict needs a 3% lead on
    the medians, ran 1.027x and 1.036x Inductor's time with substitutions in two of four runs
    of benchmarks/x86_models.py. Without paired rounds (a verdict read from the cache), the
    medians decide. Over the rounds of an undecided verdict's second look (more than
    ``SAMPLES``), a smaller share will do where it is significant (a one-sided sign test at
    ``SIGN_LEVEL``) and the mean time leads by ``MARGIN`` as well: a graph fast in most rounds
    but much slower in the others (its mean behind) still loses."""
    won, n = _wins(ours, theirs)
    if n == 0 or won >= WIN_SHARE * n:
        return True
    if n <= SAMPLES or _sign_test(won, n) > SIGN_LEVEL:
        return False
    return statistics.fmean(ours.rounds) < statistics.fmean(theirs.rounds) * (1 - autotune.MARGIN)

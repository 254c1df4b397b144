"""Reading the whole-graph check's paired rounds into a verdict: which graph runs, whether
the rounds are undecided (more are taken), and what explain says of them.

    before: timings of the graphs with substitutions and of Inductor's (each a median and its
            rounds, taken round-robin by matcher/graph_guard.py)
    after:  ``faster(timings)`` names the graph that runs: the fastest with substitutions
            where it beats Inductor's by ``autotune.MARGIN`` and in ``WIN_SHARE`` of the
            rounds, else Inductor's
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence

from pdlkit.runtime_abi import autotune
from pdlkit.runtime_abi.autotune import Timing

SUBSTITUTED, INDUCTOR = "substituted", "inductor"
# samples per whole graph (round-robin, median): a graph runs for milliseconds, so these cost a
# fraction of a second against the seconds its compile took; 9 (the sites' count) left verdicts
# to chance on a loaded host (a Xeon with AMX, int8 bert-mini: verdicts 1.8% apart flipped
# between runs while the compiled graphs differed by 5-10% either way over 21 rounds)
SAMPLES = 21


# the share of rounds a graph with substitutions must win against Inductor's, run for run
WIN_SHARE = 0.7
# an undecided verdict's second look (see undecided): a one-sided sign test at this level
SIGN_LEVEL = 0.04


def faster(timings: Sequence[Timing]) -> str:
    """The fastest graph with substitutions, if it beats Inductor's by ``MARGIN`` (the sites'
    margin: a gain smaller than that is within a shared host's noise, and the graph must never
    be slower than Inductor's) and was the faster of the two in ``WIN_SHARE`` of the rounds
    (:func:`consistent`); otherwise, or when they failed, Inductor's code."""
    t = {x.name: x for x in timings}
    best, theirs = best_ours(t), t.get(INDUCTOR)
    if best is None:
        return INDUCTOR
    if theirs is None or theirs.us is None:
        return best.name
    if (best.us or 0.0) >= theirs.us * (1 - autotune.MARGIN) or not consistent(best, theirs):
        return INDUCTOR
    return best.name


def best_ours(t: dict[str, Timing]) -> Timing | None:
    """The fastest measured graph with substitutions (ties by name), or None."""
    ours = [x for n, x in t.items() if n != INDUCTOR and x.us is not None]
    return min(ours, key=lambda x: (x.us or 0.0, x.name)) if ours else None


def undecided(timings: Sequence[Timing]) -> bool:
    """Whether the fastest graph with substitutions leads Inductor's by ``MARGIN`` on the
    medians and was the faster in more than half of the rounds, yet in fewer than
    ``WIN_SHARE`` of them: on a noisy host a real lead of a few percent looks like this in
    21 rounds (seen on a 2-core Xeon with AMX, int8-dynamic bert-mini on 2 threads: the
    kernels-only graph 5.2% ahead on the medians, per-round ratios from 0.8 to 1.4, and 0.93x
    Inductor's time when measured at length). Such a verdict gets a second set of rounds."""
    t = {x.name: x for x in timings}
    best, theirs = best_ours(t), t.get(INDUCTOR)
    if best is None or theirs is None or theirs.us is None or not best.rounds:
        return False
    won, n = wins(best, theirs)
    led = (best.us or 0.0) < theirs.us * (1 - autotune.MARGIN)
    return led and 2 * won > n and not consistent(best, theirs)


def more_rounds(first: Sequence[Timing], more: Sequence[Timing]) -> list[Timing]:
    """Each graph's rounds of both measurements, its median over all of them."""
    extra = {x.name: x.rounds for x in more}
    merged = []
    for x in first:
        rounds = x.rounds + extra.get(x.name, [])
        us = statistics.median(rounds) * 1e6 if rounds else x.us
        merged.append(dataclasses.replace(x, us=us, rounds=rounds))
    return merged


def sign_test(won: int, n: int) -> float:
    """P(at least ``won`` wins in ``n`` fair coin flips): how likely a graph no faster than
    Inductor's wins that many of the paired rounds."""
    return sum(math.comb(n, k) for k in range(won, n + 1)) / 2**n if n else 1.0


def note_rounds(timings: list[Timing], first: str = "") -> None:
    """Each graph with substitutions says in how many rounds it beat Inductor's (explain's
    whole-graph line; what :func:`consistent` decides on), and what a first look that a
    second replaced had read (``first``)."""
    theirs = next((t for t in timings if t.name == INDUCTOR and t.rounds), None)
    for t in timings:
        if theirs is not None and t is not theirs and t.rounds:
            won, n = wins(t, theirs)
            t.note = f"faster than inductor's in {won} of {n} rounds"
            t.note += f"; {first}" if first else ""


def wins(ours: Timing, theirs: Timing) -> tuple[int, int]:
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
    won, n = wins(ours, theirs)
    if n == 0 or won >= WIN_SHARE * n:
        return True
    if n <= SAMPLES or sign_test(won, n) > SIGN_LEVEL:
        return False
    return statistics.fmean(ours.rounds) < statistics.fmean(theirs.rounds) * (1 - autotune.MARGIN)

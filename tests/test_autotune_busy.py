"""Measuring on a busy host (runtime_abi/autotune.py's ``steady`` / ``trusted``): timings whose
rounds swing widely were taken while another process had the cores; they decide nothing that
outlives the compilation, and they do not spare the whole-graph check."""

from __future__ import annotations

import itertools
import statistics

import pytest
import torch
from autotune_chain import graph_maker, install_clock
from pdlkit.matcher import choose, graph_guard
from pdlkit.matcher.report import GraphReport
from pdlkit.runtime_abi import autotune
from pdlkit.runtime_abi.autotune import KEEP, Decision, Timing

import pdlkit

STEADY_ROUNDS = [1.0e-4, 1.02e-4, 0.99e-4, 1.01e-4, 1.0e-4]
BUSY_ROUNDS = [1.0e-4, 4.0e-4, 1.0e-4, 9.0e-4, 1.1e-4, 5.0e-4]


def _site(rounds):
    t = Timing("k", statistics.median(rounds) * 1e6, rounds=list(rounds))
    return Decision("k", [t, Timing(KEEP, 500.0)])


def _cached_or_measured(tmp_path, monkeypatch, rounds, *more):
    """The cached decision and the unsteady count after measuring a site whose looks have
    these rounds (the last repeats)."""
    monkeypatch.setenv("PDLKIT_CACHE_DIR", str(tmp_path))
    cache = autotune.decision_cache()
    pdlkit.stats(reset=True)
    looks = [rounds, *more]
    choose.cached_or_measured(cache, "site", True, lambda: _site(looks.pop(0) if len(looks) > 1 else looks[0]))  # fmt: skip
    return cache.get("site"), pdlkit.stats()["tuning_unsteady"]


def test_a_site_decision_timed_steadily_is_cached(tmp_path, monkeypatch):
    cached, unsteady = _cached_or_measured(tmp_path, monkeypatch, STEADY_ROUNDS)
    assert cached is not None and cached.choice == "k" and unsteady == 0


def test_a_site_decision_timed_on_a_busy_host_is_used_and_not_cached(tmp_path, monkeypatch):
    """Its rounds swing 1-9x: this compilation takes it, the next one measures again, and
    ``stats()`` counts it."""
    cached, unsteady = _cached_or_measured(tmp_path, monkeypatch, BUSY_ROUNDS)
    assert cached is None and unsteady == 1


def test_a_site_timed_in_a_burst_of_load_is_looked_at_again(tmp_path, monkeypatch):
    """Rounds swinging 1-9x, then steady ones: the second look decides and is cached."""
    cached, unsteady = _cached_or_measured(tmp_path, monkeypatch, BUSY_ROUNDS, STEADY_ROUNDS)
    assert cached is not None and cached.choice == "k" and unsteady == 0


def test_a_whole_graph_verdict_timed_on_a_busy_host_is_not_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("PDLKIT_CACHE_DIR", str(tmp_path))
    compiled, clock = [], install_clock(monkeypatch)

    def busy(name):
        def make():
            compiled.append(name)
            # each graph's own swings, 1-8x, with an odd period (a lead call skips none): a
            # shared cycle gave each graph alternate values
            swings = itertools.cycle([0.001, 0.008, 0.002])
            return lambda *a: clock.sleep(next(swings))

        return make

    args = ("k", busy("substituted"), busy("inductor"), (torch.randn(2),), "cached")
    graph_guard.choose(*args)
    graph_guard.choose(*args)  # measured again: nothing was cached
    assert compiled == ["substituted", "inductor", "substituted", "inductor"]


def test_a_graph_whose_sites_were_timed_on_a_busy_host_is_not_remembered(tmp_path, monkeypatch):
    """Nothing substituted, but a site's timing was unsteady: the next compilation matches
    and measures again rather than compiling Inductor's graph unseen."""
    from pdlkit import whole_graph

    monkeypatch.setenv("PDLKIT_CACHE_DIR", str(tmp_path))
    whole_graph.nothing_substituted(
        "plan", None, GraphReport(index=0, nodes=1, sites_unsteady=True)
    )
    assert graph_guard.known_verdict("plan") is None
    whole_graph.nothing_substituted("plan", None, GraphReport(index=0, nodes=1))
    assert graph_guard.known_verdict("plan") == graph_guard.INDUCTOR


def test_a_large_saving_timed_on_a_busy_host_still_times_inductors_graph(tmp_path, monkeypatch):
    """The substituted graph's rounds swing 1-4 ms (another process had the cores): the
    sites' saving, timed then too, is not trusted, and Inductor's graph is compiled and
    timed; a warning says why."""
    monkeypatch.setenv("PDLKIT_CACHE_DIR", str(tmp_path))
    compiled, clock = [], install_clock(monkeypatch)
    swings = itertools.cycle([0.001, 0.004, 0.002])  # odd period: a lead call skips none

    def busy():
        compiled.append("substituted")
        return lambda *a: clock.sleep(next(swings))

    with pytest.warns(UserWarning, match="host was busy"):
        graph_guard.choose(
            "k", busy, graph_maker(compiled, "inductor", 0.001, clock), (torch.randn(2),), "cached",
            5000.0,
        )  # fmt: skip
    assert compiled == ["substituted", "inductor"]


def test_a_saving_timed_on_a_busy_host_counts_as_unknown():
    """A site whose timings a busy host made untrusted saved an unknown amount, so the
    whole-graph check times Inductor's graph: a saving read under load had skipped it (97 ms
    "saved" of a 4.5 ms graph on the 2-core Xeon beside a CPU burner)."""
    tuner = object.__new__(choose.Tuner)
    tuner.saved_us = 0.0
    tuner._account(_site(STEADY_ROUNDS))  # 100 us against the subgraph's 500
    assert tuner.saved_us == pytest.approx(400.0, rel=0.02)
    tuner._account(_site(BUSY_ROUNDS))
    assert tuner.saved_us is None


def test_a_dynamically_quantized_sites_saving_does_not_count():
    """A site whose activation's qparams the graph computes (PT2E's dynamic quantization)
    saves nothing toward the whole-graph check's confidence: GPT-2 int8-dynamic's sites
    "saved" 20% of a graph that ran 10% slower than Inductor's."""
    tuner = object.__new__(choose.Tuner)
    tuner.saved_us = 0.0
    tuner._account(_site(STEADY_ROUNDS), dynamic=True)
    assert tuner.saved_us == 0.0
    tuner._account(_site(STEADY_ROUNDS))
    assert tuner.saved_us == pytest.approx(400.0, rel=0.02)


def test_a_site_timed_on_a_busy_host_goes_by_priority(folders, monkeypatch):
    """A site's timings in rounds swinging 1-9x rank nothing: fast_chain "measured" three
    times faster than near_chain, yet near_chain, of higher priority, runs (with the same
    timings steady, fast_chain runs)."""
    from autotune_chain import FAST, calls, run
    from test_autotune_kernels_only import NEAR

    def measured(rounds):
        timings = [Timing("fast_chain", 100.0, rounds=rounds), Timing("near_chain", 300.0),
                   Timing(KEEP, 5000.0)]  # fmt: skip
        return lambda *a: (Decision("fast_chain", timings), 0.0)

    p, k = folders(FAST, NEAR)
    monkeypatch.setattr(autotune, "BUSY", 0.5)  # the fixture trusts any spread
    monkeypatch.setattr(choose, "cached_or_measured", measured(BUSY_ROUNDS))
    assert calls(run(p, k, "full"), "near_chain") == 1
    monkeypatch.setattr(choose, "cached_or_measured", measured(STEADY_ROUNDS))
    # the site's choice runs (the whole-graph check would also time static priority's graph,
    # near_chain's, here as fast: either may win that)
    monkeypatch.setattr(graph_guard, "faster", lambda timings: graph_guard.SUBSTITUTED)
    assert calls(run(p, k, "full"), "fast_chain") == 1

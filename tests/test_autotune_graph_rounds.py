"""The whole-graph check's rounds (matcher/graph_guard.py): more rounds where undecided, a
second look after a burst, early ends on a decisive lead."""

from __future__ import annotations

import pytest
import torch
from autotune_chain import alone, graph_maker, install_clock, paired, recorded_measures

# 21 paired rounds in which the substituted graph (0.9 ms) beats Inductor's (1.0 ms) in 13 and
# loses by a little in 8: a 10% lead on the medians and 4.7% on the means, short of the 70% of
# rounds a first look needs
_NOISY = ([0.90] * 13 + [1.02] * 8, [1.0] * 13 + [0.98] * 8)


def _choose_with(monkeypatch, tmp_path, measurements: list) -> tuple[str, int]:
    """graph_guard.choose over measurements given in advance: (verdict, times measured)."""
    from pdlkit.matcher import graph_guard

    monkeypatch.setenv("PDLKIT_CACHE_DIR", str(tmp_path))
    given = list(measurements)  # no saving given: the substituted graph is not timed alone
    monkeypatch.setattr(graph_guard, "_measure", lambda runs, device, *settled: given.pop(0))
    verdict, _, _ = graph_guard.choose(
        "k", lambda: lambda *a: None, lambda: lambda *a: None, (torch.randn(2),), "cached"
    )
    return verdict, len(measurements) - len(given)


def test_an_undecided_lead_that_holds_over_more_rounds_wins(monkeypatch, tmp_path):
    """A lead won in 13 of 21 rounds is undecided; 21 more rounds with the same lead, won in 16
    (29 of 42: a sign test's p = 0.01) and the mean ahead too: the substituted graph runs."""
    more = ([0.90] * 16 + [1.02] * 5, [1.0] * 16 + [0.98] * 5)
    verdict, measured = _choose_with(monkeypatch, tmp_path, [paired(*_NOISY), paired(*more)])
    assert (verdict, measured) == ("substituted", 2)


def test_an_undecided_lead_that_fades_keeps_inductors_graph(monkeypatch, tmp_path):
    """The same first look, then 21 rounds the graphs split evenly: Inductor's graph runs."""
    even = ([0.90] * 10 + [1.02] * 11, [1.0] * 10 + [0.98] * 11)
    verdict, measured = _choose_with(monkeypatch, tmp_path, [paired(*_NOISY), paired(*even)])
    assert (verdict, measured) == ("inductor", 2)


def test_a_clear_verdict_is_measured_once(monkeypatch, tmp_path):
    """A lead won in 18 of 21 rounds decides at the first look: no second set of rounds."""
    clear = ([0.90] * 18 + [1.02] * 3, [1.0] * 18 + [0.98] * 3)
    verdict, measured = _choose_with(monkeypatch, tmp_path, [paired(*clear)])
    assert (verdict, measured) == ("substituted", 1)


def test_many_rounds_won_with_the_mean_behind_are_not_consistent():
    """Won in 28 of 42 rounds (67%: a sign test's p = 0.02) by a little and lost in the others
    by far: the mean time is behind, so the graph is not consistently faster; lost by a
    little, it is."""
    from pdlkit.matcher import graph_verdict

    ours, theirs = paired([0.90] * 28 + [2.0] * 14, [1.0] * 42)
    assert not graph_verdict.consistent(ours, theirs)
    ours, theirs = paired([0.90] * 28 + [1.02] * 14, [1.0] * 42)
    assert graph_verdict.consistent(ours, theirs)


def _choose_saving(monkeypatch, tmp_path, saved_us: float, measurements: list):
    """graph_guard.choose with the sites' measured saving ``saved_us`` over measurements given
    in advance (the first of the substituted graph alone): (verdict, times measured, graphs
    compiled, the decision)."""
    from pdlkit.matcher import graph_guard

    monkeypatch.setenv("PDLKIT_CACHE_DIR", str(tmp_path))
    # the glance before the rounds really times the graph (a sleep(0)): on a VM it took over
    # the 95 us under which a 10 us saving goes on to the rounds; the rounds are the subject
    monkeypatch.setattr(graph_guard, "GLANCE_SHARE", 0.0)
    given, compiled = list(measurements), []
    monkeypatch.setattr(graph_guard, "_measure", lambda runs, device, *settled: given.pop(0))
    verdict, _, decision = graph_guard.choose(
        "k", graph_maker(compiled, "substituted", 0.0), graph_maker(compiled, "inductor", 0.0),
        (torch.randn(2),), "cached", saved_us,
    )  # fmt: skip
    return verdict, len(measurements) - len(given), compiled, decision


# six samples in 21 at twice the others' (a burst of load on the host): a 100% spread
_BURST = [1.0] * 15 + [2.0] * 6


def test_a_burst_in_the_substituted_graphs_rounds_is_looked_at_again(monkeypatch, tmp_path):
    """A 600 us saving of a 1 ms graph, its first rounds unsteady and its second steady: the
    saving is trusted, and Inductor's graph is not compiled."""
    verdict, measured, compiled, _ = _choose_saving(
        monkeypatch, tmp_path, 600.0, [alone(_BURST), alone([1.0] * 21)]
    )
    assert (verdict, measured, compiled) == ("substituted", 2, ["substituted"])


def test_rounds_unsteady_twice_compile_and_time_inductors_graph(monkeypatch, tmp_path):
    """Unsteady in both looks: the host is busy, the sites' saving is not trusted (a warning
    says so), and Inductor's graph is compiled and timed, here the faster in every round of
    both looks at the two graphs (the first against the sites' saving)."""

    looks = [alone(_BURST), alone(_BURST)] + [paired([1.1] * 21, [1.0] * 21)] * 2
    with pytest.warns(UserWarning, match="the host was busy while timing"):
        verdict, measured, compiled, _ = _choose_saving(monkeypatch, tmp_path, 600.0, looks)
    assert (verdict, measured, compiled) == ("inductor", 4, ["substituted", "inductor"])


def test_inductors_graph_winning_against_the_sites_saving_is_timed_again(monkeypatch, tmp_path):
    """The sites saved 100 us of a 1 ms graph (not CONFIDENT: both graphs are timed), yet
    Inductor's graph won every round of a first look; a second look, in which the substituted
    graph wins every round, decides, and explain shows what the first had read."""
    looks = [alone([1.0] * 21), paired([1.1] * 21, [1.0] * 21), paired([0.9] * 21, [1.0] * 21)]
    verdict, measured, _, decision = _choose_saving(monkeypatch, tmp_path, 100.0, looks)
    assert (verdict, measured) == ("substituted", 3)
    assert "a second look; the first read substituted 1100 us, inductor 1000 us" in (
        decision.describe()
    )


def test_inductors_graph_winning_both_looks_runs(monkeypatch, tmp_path):
    """The same, with the second look as the first: Inductor's graph runs (the fusions an
    opaque kernel call ends can make it faster whatever the sites saved)."""
    looks = [alone([1.0] * 21)] + [paired([1.1] * 21, [1.0] * 21)] * 2
    verdict, measured, _, _ = _choose_saving(monkeypatch, tmp_path, 100.0, looks)
    assert (verdict, measured) == ("inductor", 3)


def test_inductors_graph_winning_past_a_small_saving_is_timed_once(monkeypatch, tmp_path):
    """Sites that saved 10 us of an 1.1 ms graph (under MARGIN of it) do not contradict
    Inductor's graph winning: the verdict stands after one look at both graphs."""
    looks = [alone([1.0] * 21), paired([1.1] * 21, [1.0] * 21)]
    verdict, measured, _, _ = _choose_saving(monkeypatch, tmp_path, 10.0, looks)
    assert (verdict, measured) == ("inductor", 2)


def _rounds_of(tmp_path, monkeypatch, substituted_s, inductor_s):
    """graph_guard.choose over two graphs that take the given seconds on the check's clock:
    the verdict and each graph's rounds."""
    from pdlkit.matcher import graph_guard

    monkeypatch.setenv("PDLKIT_CACHE_DIR", str(tmp_path))
    clock = install_clock(monkeypatch)
    verdict, _, decision = graph_guard.choose(
        "k",
        graph_maker([], "substituted", substituted_s, clock),
        graph_maker([], "inductor", inductor_s, clock),
        (torch.randn(2),),
        "cached",
    )
    return verdict, [len(t.rounds) for t in decision.timings]


def test_a_decisive_lead_ends_the_rounds_early(tmp_path, monkeypatch):
    """A substituted graph at a fifth of Inductor's time, faster in every round: its verdict
    is settled after EARLY rounds, not SAMPLES (the rounds are most of a large graph's check)."""
    from pdlkit.matcher import graph_guard

    verdict, rounds = _rounds_of(tmp_path, monkeypatch, 0.001, 0.005)
    assert verdict == graph_guard.SUBSTITUTED
    assert rounds == [graph_guard.EARLY] * 2


def test_inductors_decisive_lead_ends_the_rounds_early_too(tmp_path, monkeypatch):
    from pdlkit.matcher import graph_guard

    verdict, rounds = _rounds_of(tmp_path, monkeypatch, 0.005, 0.001)
    assert verdict == graph_guard.INDUCTOR
    assert rounds == [graph_guard.EARLY] * 2


def test_only_a_lead_won_in_every_round_by_twice_the_margin_is_decisive():
    """graph_guard._decisive on given rounds (seconds): a lead under DECISIVE, one round lost,
    or fewer than EARLY rounds leave the verdict to all its rounds."""
    from pdlkit.matcher.graph_guard import EARLY, INDUCTOR, _decisive

    theirs = [1.0] * EARLY
    assert _decisive({"substituted": [0.9] * EARLY, INDUCTOR: theirs})
    assert not _decisive({"substituted": [0.95] * EARLY, INDUCTOR: theirs})  # 5% < 6%
    assert not _decisive({"substituted": [0.9] * (EARLY - 1) + [1.1], INDUCTOR: theirs})
    assert not _decisive({"substituted": [0.9] * (EARLY - 1), INDUCTOR: theirs[1:]})
    # Inductor's graph settles it only against every graph with substitutions
    both = {"substituted": [1.2] * EARLY, "kernels only": [0.97] * EARLY, INDUCTOR: theirs}
    assert not _decisive(both)
    assert _decisive({**both, "kernels only": [1.1] * EARLY})


def test_a_lead_in_unsteady_rounds_is_not_decisive():
    """A lead won in every round, but over rounds that spread more than autotune.STEADY: more
    rounds, as a verdict from unsteady rounds would not be cached (the next compile would
    measure again)."""
    from pdlkit.matcher.graph_guard import EARLY, INDUCTOR, _decisive

    unsteady = [0.5, 0.9] * EARLY
    assert not _decisive({"substituted": unsteady, INDUCTOR: [1.0] * 2 * EARLY})
    assert not _decisive({"substituted": [0.5] * EARLY, "kernels only": unsteady[:EARLY]})


def test_without_inductors_graph_the_graphs_with_substitutions_take_early_rounds(
    tmp_path, monkeypatch
):
    """A saving that skips Inductor's compile, and a kernels-only graph as fast as the
    substituted one: the graph alone and the two together take EARLY rounds each, not
    SAMPLES (neither choice can lose to Inductor's code)."""
    from pdlkit.matcher import graph_guard

    monkeypatch.setenv("PDLKIT_CACHE_DIR", str(tmp_path))
    clock = install_clock(monkeypatch)
    measured = recorded_measures(monkeypatch)
    graph = graph_maker([], "x", 0.001, clock)
    verdict, _, _ = graph_guard.choose(
        "k",
        graph,
        graph_maker([], "i", 0.003, clock),
        (torch.randn(2),),
        "cached",
        900.0,
        kernels_only=graph,
    )
    assert verdict in (graph_guard.SUBSTITUTED, graph_guard.KERNELS)
    early = graph_guard.EARLY
    rounds = [{t.name: len(t.rounds) for t in timings} for timings in measured]
    assert rounds == [{"substituted": early}, {"substituted": early, "kernels only": early}]


def test_the_graph_alone_settles_once_steady_and_clear_of_the_confident_line():
    """graph_guard._clear_of: EARLY steady rounds whose median puts the saving at least
    DECISIVE of CONFIDENT away from it, either side (1 ms rounds, CONFIDENT 15%)."""
    from pdlkit.matcher.graph_guard import EARLY, _clear_of

    steady = [0.001] * EARLY
    assert _clear_of(600.0)({"substituted": steady})  # 60%: clearly confident
    assert _clear_of(50.0)({"substituted": steady})  # 5%: clearly not
    assert not _clear_of(150.0)({"substituted": steady})  # on the line: all the rounds
    assert not _clear_of(600.0)({"substituted": steady[1:]})
    unsteady = [0.001, 0.002] * EARLY
    assert not _clear_of(600.0)({"substituted": unsteady})

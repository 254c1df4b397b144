"""The whole-graph check's hedges (matcher/hedges.py): the kernels-only and static-priority
graphs are compiled only where the sites at which they differ take a share of the sites' time
the check could see."""

from __future__ import annotations

import json
import math

import pytest
import torch
from autotune_chain import FAST, calls
from pdlkit.matcher import choose, graph_guard
from pdlkit.matcher.hedges import SHARE, Stakes
from pdlkit.runtime_abi.autotune import KEEP, Decision, Timing, fastest

import pdlkit


def _site(kernel_us: float | None, keep_us: float) -> Decision:
    timings = [Timing("k", kernel_us), Timing(KEEP, keep_us)]
    return Decision(fastest(timings, ["k"]), timings)


def _stakes(*sites: Decision) -> Stakes:
    s = Stakes()
    for d in sites:
        s.add(d, "k", None)  # a kernel at every site in the kernels-only graph
    return s


def test_a_kept_site_within_the_margin_puts_the_kernels_only_graph_in_place_alone():
    """A 10 ms site takes the kernel; a site kept its subgraph at 50 us against 80 us for the
    kernel: the kernels-only graph's sites add 30 us, under 3% of the sites' time."""
    s = _stakes(_site(10_000.0, 90_000.0), _site(80.0, 50.0))
    assert s.kernels_instead and not s.kernels_differ
    assert s.notes() == {
        "kernels only": "compiled in place of the measured choice: its sites add 30 us, "
        "under 3% of the sites' 10050 us"
    }


def test_a_kept_site_past_the_margin_has_both_graphs_compiled():
    s = _stakes(_site(1_000.0, 9_000.0), _site(80.0, 40.0))  # 40 of 1040 us: 3.8%
    assert 40.0 / 1040.0 > SHARE
    assert s.kernels_differ and not s.kernels_instead and s.notes() == {}


def test_a_site_whose_kernel_or_choice_was_not_timed_is_no_tie():
    s = _stakes(_site(10_000.0, 90_000.0), _site(None, 50.0))
    assert s.kernels_us == math.inf and s.kernels_differ
    s = _stakes(_site(10_000.0, 90_000.0), Decision(KEEP, [Timing("k", 80.0)]))
    assert s.kernels_differ and not s.kernels_instead


def test_no_difference_is_no_other_graph_and_no_note():
    s = _stakes(_site(10_000.0, 90_000.0))
    assert not (s.kernels_differ or s.kernels_instead or s.static_differs) and s.notes() == {}


def test_static_prioritys_graph_is_compiled_where_its_kernels_are_slower_past_the_margin():
    """Static priority's kernel "top" ran at a site that chose "k" (as the kernels-only graph
    does): its graph differs from both there."""
    far = Stakes()
    far.add(Decision("k", [Timing("k", 1_000.0), Timing("top", 1_300.0)]), "k", "top")
    assert far.static_differs and not far.kernels_differ
    near = Stakes()
    near.add(Decision("k", [Timing("k", 10_000.0), Timing("top", 10_100.0)]), "k", "top")
    assert not near.static_differs
    assert near.notes()["static priority"].startswith("not compiled: its sites add 100 us")


def test_static_prioritys_graph_is_left_out_beside_the_kernels_only_graph():
    """A site kept its subgraph (1000 us); the kernels-only graph takes "k" there (1300 us),
    static priority's "top" (1500 us): both differ past the margin, only one more is compiled."""
    s = Stakes()
    timings = [Timing("k", 1_300.0), Timing("top", 1_500.0), Timing(KEEP, 1_000.0)]
    s.add(Decision(KEEP, timings), "k", "top")
    assert s.kernels_differ and not s.static_differs
    assert s.notes() == {"static priority": "not compiled: the kernels-only graph is timed instead"}


def test_settled_stakes_give_the_verdicts_kept_with_match_records():
    for flags in [(False, False, False), (True, False, True), (False, True, False)]:
        s = Stakes.settled(*flags)
        assert (s.kernels_instead, s.kernels_differ, s.static_differs) == flags


class TwoChains(torch.nn.Module):
    """Two sites of the chain pattern (autotune_chain.py): a large one and a small one."""

    def forward(self, a, b, c, a2, b2, c2):
        return (a @ b) @ c, (a2 @ b2) @ c2


def _by_size(keep_small_us: float):
    """choose.decide with fixed timings: the large site's kernel 10 ms against 90 ms for its
    subgraph; the small site's subgraph ``keep_small_us`` against 4x that for the kernel."""

    def timed(runs, subgraph, reals, *_):
        large = reals[0][0].shape[0] > 64
        keep = 90_000.0 if large else keep_small_us
        kernel = 10_000.0 if large else 4 * keep_small_us
        timings = [Timing(n, kernel) for n, _ in runs] + [Timing(KEEP, keep)]
        return Decision(fastest(timings, [n for n, _ in runs]), timings)

    return timed


def _verdict_timings(cache) -> list[list]:
    entries = json.loads(next(cache.glob("**/host-*.json")).read_text())
    graphs = [d["timings"] for d in entries["decisions"].values()]
    return [t for t in graphs if any(row[0] == graph_guard.INDUCTOR for row in t)]


@pytest.mark.parametrize("keep_small_us, both", [(50.0, False), (1_000.0, True)])
def test_the_kernels_only_graph_takes_the_place_of_one_within_the_margin(
    folders, monkeypatch, tmp_path, keep_small_us, both
):
    """The small site keeps its subgraph, the kernel 4x its time. 150 us of 10 ms: the
    kernels-only graph alone is compiled and runs (the small site too takes the kernel);
    3 ms of 10 ms: both graphs are compiled and timed."""
    monkeypatch.setattr(choose, "decide", _by_size(keep_small_us))
    monkeypatch.setattr(graph_guard, "CONFIDENT", float("inf"))  # Inductor's graph timed too
    monkeypatch.setattr(graph_guard, "faster", lambda timings: timings[0].name)
    p, k = folders(FAST)
    g = torch.Generator().manual_seed(0)
    args = [torch.randn(s, generator=g) for s in [(384, 1), (1, 384), (384, 384)]]
    args += [torch.randn(s, generator=g) for s in [(8, 1), (1, 8), (8, 8)]]
    pdlkit.stats(reset=True)
    torch._dynamo.reset()
    with torch.no_grad():
        ys = pdlkit.optimize(TwoChains(), patterns=p, kernels=k, autotune="cached")(*args)
    for y, want in zip(ys, TwoChains()(*args), strict=True):
        torch.testing.assert_close(y, want, rtol=1e-4, atol=1e-3)
    (graph,) = _verdict_timings(tmp_path / "cache")
    names = [t[0] for t in graph if t[1] is not None]
    st = pdlkit.stats()
    if both:
        assert names[:2] == [graph_guard.SUBSTITUTED, graph_guard.KERNELS]
        assert calls(st, "fast_chain") == 1  # the substituted graph: the small site kept
    else:  # one graph with substitutions compiled and timed: the kernels-only one
        assert names == [graph_guard.KERNELS, graph_guard.INDUCTOR]
        assert calls(st, "fast_chain") == 2  # both sites take the kernel


def test_explain_says_why_the_kernels_only_graph_stood_in():
    from pdlkit.whole_graph import _noted

    timed = Decision(graph_guard.KERNELS, [Timing(graph_guard.KERNELS, 10.0),
                                           Timing(graph_guard.INDUCTOR, 12.0)])  # fmt: skip
    decision = _noted(timed, graph_guard.KERNELS, "compiled in place: why")
    assert decision.describe() == (
        "measured: kernels only 10.0 us (compiled in place: why), inductor 12.0 us -> kernels only"
    )

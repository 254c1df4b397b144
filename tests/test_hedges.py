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


def test_a_kept_site_under_the_share_of_the_sites_time_leaves_the_kernels_only_graph_out():
    """A 10 ms site takes the kernel; a 50 us site kept its subgraph: the kernels-only graph
    can gain 0.5% at most, under the check's margin."""
    s = _stakes(_site(10_000.0, 90_000.0), _site(80.0, 50.0))
    assert not s.kernels_differ
    assert s.left_out() == {
        "kernels only": "not compiled: it differs at sites taking 50 us, under 3% of the "
        "sites' 10050 us"
    }


def test_a_kept_site_over_the_share_compiles_the_kernels_only_graph():
    s = _stakes(_site(1_000.0, 9_000.0), _site(80.0, 50.0))  # 50 of 1050 us: 4.8%
    assert 50.0 / 1050.0 > SHARE
    assert s.kernels_differ and s.left_out() == {}


def test_a_site_whose_choice_was_not_timed_always_counts():
    s = _stakes(_site(10_000.0, 90_000.0), Decision(KEEP, [Timing("k", 80.0)]))
    assert s.kernels_us == math.inf and s.kernels_differ


def test_no_difference_is_no_hedge_and_no_note():
    s = _stakes(_site(10_000.0, 90_000.0))
    assert not s.kernels_differ and not s.static_differs and s.left_out() == {}


def test_static_prioritys_graph_counts_where_its_kernel_differs_from_both():
    """Static priority's kernel "top" ran at a site that chose "k" (as the kernels-only graph
    does): its graph differs from both there; worth compiling by the same share."""
    big = Stakes()
    big.add(_site(1_000.0, 9_000.0), "k", "top")
    assert big.static_differs and not big.kernels_differ
    small = Stakes()
    small.add(_site(10_000.0, 90_000.0), "k", "k")
    small.add(_site(20.0, 90.0), "k", "top")
    assert not small.static_differs
    assert "static priority" in small.left_out()


def test_settled_stakes_give_the_verdicts_kept_with_match_records():
    for kd in (False, True):
        for sd in (False, True):
            s = Stakes.settled(kd, sd)
            assert (s.kernels_differ, s.static_differs) == (kd, sd)


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
    return [t for t in graphs if any(row[0] == graph_guard.SUBSTITUTED for row in t)]


@pytest.mark.parametrize("keep_small_us, compiled", [(50.0, False), (1_000.0, True)])
def test_the_kernels_only_graph_is_compiled_only_for_a_stake_the_check_can_see(
    folders, monkeypatch, tmp_path, keep_small_us, compiled
):
    monkeypatch.setattr(choose, "decide", _by_size(keep_small_us))
    monkeypatch.setattr(graph_guard, "CONFIDENT", float("inf"))  # Inductor's graph timed too
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
    kernels_only = [t for t in graph if t[0] == graph_guard.KERNELS]
    assert len(kernels_only) == 1
    assert (kernels_only[0][1] is not None) == compiled  # timed, or left out with why
    if not compiled:
        assert kernels_only[0][2].startswith("not compiled: it differs at sites taking 50 us")
    assert calls(pdlkit.stats(), "fast_chain") >= 1

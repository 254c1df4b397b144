"""The whole-graph check's kernels-only graph (matcher/hedges.py's ``kernels_only``): a kernel
at every site, near ties going to the kernel of higher priority, compiled wherever it differs
from the substituted graph; and static priority's graph, compiled wherever it differs from
both."""

from __future__ import annotations

import json

from autotune_chain import FAST, calls, run
from pdlkit.matcher import choose, graph_guard, hedges
from pdlkit.runtime_abi.autotune import KEEP, Decision, Timing, fastest

ORDER = ["amx", "onednn"]  # priority order


def _decision(amx: float, onednn: float, keep: float) -> Decision:
    timings = [Timing("amx", amx), Timing("onednn", onednn), Timing(KEEP, keep)]
    return Decision(fastest(timings, ORDER), timings)


def test_a_near_tie_goes_to_the_kernel_of_higher_priority():
    d = _decision(amx=110.0, onednn=100.0, keep=200.0)
    assert d.choice == "onednn"  # the site's own choice: 10% is past its 3% tie
    assert hedges.kernels_only(d, ORDER).choice == "amx"


def test_a_clearly_faster_kernel_keeps_its_site():
    d = _decision(amx=130.0, onednn=100.0, keep=200.0)
    assert hedges.kernels_only(d, ORDER) is d


def test_a_site_that_kept_its_subgraph_takes_a_kernel():
    d = _decision(amx=120.0, onednn=110.0, keep=90.0)
    assert d.choice == KEEP
    other = hedges.kernels_only(d, ORDER)
    assert other.choice == "amx" and other.source == "kernels only"


def test_timings_a_busy_host_made_untrusted_leave_the_kernel_to_priority():
    """onednn measured twice as fast as amx, in rounds swinging 1-9x (a busy host): in the
    kernels-only graph that is no ranking, and the kernel of higher priority runs."""
    busy = [1.0e-4, 4.0e-4, 1.0e-4, 9.0e-4, 1.1e-4, 5.0e-4]
    timings = [Timing("amx", 200.0, rounds=busy), Timing("onednn", 100.0), Timing(KEEP, 90.0)]
    d = Decision(fastest(timings, ORDER), timings)
    assert hedges.kernels_only(d, ORDER).choice == "amx"
    steady = [Timing("amx", 200.0), Timing("onednn", 100.0), Timing(KEEP, 90.0)]
    assert hedges.kernels_only(Decision(KEEP, steady), ORDER).choice == "onednn"


def test_a_site_without_a_timed_kernel_is_left_as_it_is():
    d = Decision(KEEP, [Timing("amx", None, "declined"), Timing(KEEP, 90.0)])
    assert hedges.kernels_only(d, ORDER) is d


def _fixed(us: dict[str, float | None]):
    """choose.decide with fixed timings in place of the measurement (None: excluded)."""

    def timed(runs, *_):
        timings = [Timing(n, us[n], "" if us[n] else "raised") for n, _ in runs]
        timings.append(Timing(KEEP, 1000.0))
        return Decision(fastest(timings, [n for n, _ in runs]), timings)

    return timed


def _timed_graphs(p) -> list[list[str]]:
    entries = json.loads(next((p.parent / "cache").glob("**/host-*.json")).read_text())
    return [[t[0] for t in d["timings"]] for d in entries["decisions"].values()]


NEAR = """
@pdlkit.kernel(op="chain", meta=meta, priority=10)
def near_chain(a: Tensor, wb: Tensor, wc: Tensor) -> Tensor:
    return a @ (wb.t() @ wc.t())
"""


def _compiled(folders, monkeypatch, near_us: float, verdict: str | None):
    """The chain compiled with near_chain (priority 10) timed at ``near_us`` against
    fast_chain's 100 us, every candidate graph compiled, and ``verdict`` the check's (None:
    as measured): (patterns, kernels, stats)."""
    monkeypatch.setattr(choose, "decide", _fixed({"near_chain": near_us, "fast_chain": 100.0}))
    monkeypatch.setattr(graph_guard, "CONFIDENT", float("inf"))
    if verdict is not None:
        monkeypatch.setattr(graph_guard, "faster", lambda timings: verdict)
    p, k = folders(FAST, NEAR)
    return p, k, run(p, k, "cached")


def test_a_site_on_a_near_tie_compiles_and_can_run_the_kernels_only_graph(folders, monkeypatch):
    """The site measures fast_chain 5% faster than near_chain, of higher priority: it takes
    fast_chain, and the whole-graph check also times the graph with near_chain; when that
    graph is the fastest it runs."""
    p, k, st = _compiled(folders, monkeypatch, 105.0, graph_guard.KERNELS)
    assert calls(st, "near_chain") == 1 and calls(st, "fast_chain") == 0
    assert ["substituted", "kernels only", "inductor"] in _timed_graphs(p)


def test_a_site_whose_first_kernel_measured_far_slower_times_static_prioritys_graph(
    folders, monkeypatch
):
    """The site measures fast_chain 30% faster than near_chain, of higher priority: both the
    substituted and the kernels-only graph take fast_chain, and the whole-graph check times
    the graph static priority gives (near_chain) as well; when that graph is the fastest it
    runs, and the next compilation replays its match records as autotune="off" made them."""
    p, k, st = _compiled(folders, monkeypatch, 130.0, graph_guard.STATIC)
    assert calls(st, "near_chain") == 1 and calls(st, "fast_chain") == 0
    assert ["substituted", "static priority", "inductor"] in _timed_graphs(p)
    again = run(p, k, "cached")
    assert calls(again, "near_chain") == 1 and again["substitutions"] == 1
    assert again["tuning_hits"] == again["tuning_misses"] == 0  # matched as "off" matches
    assert again["matches_from_disk"] == 1  # the check's static rerun kept its records
    third = run(p, k, "cached")
    assert calls(third, "near_chain") == 1 and third["matches_from_disk"] == 1


def test_where_static_priority_chose_as_measured_no_fourth_graph_is_compiled(folders, monkeypatch):
    """near_chain, of higher priority, measured fastest: static priority's graph is the
    substituted one, and only that and Inductor's are timed."""
    p, _, _ = _compiled(folders, monkeypatch, 100.0 / 1.3, None)
    assert ["substituted", "inductor"] in _timed_graphs(p)
    assert all("static priority" not in graphs for graphs in _timed_graphs(p))


def test_a_first_kernel_excluded_from_its_sites_timing_makes_no_static_graph(folders, monkeypatch):
    """boom_chain, of the highest priority, raised while its site was timed: static
    priority's graph would run it, so it is not a candidate."""
    from test_autotune import RAISES

    us = {"boom_chain": None, "near_chain": 130.0, "fast_chain": 100.0}
    monkeypatch.setattr(choose, "decide", _fixed(us))
    monkeypatch.setattr(graph_guard, "CONFIDENT", float("inf"))
    p, k = folders(RAISES, FAST, NEAR)
    st = run(p, k, "cached")
    assert calls(st, "fast_chain") == 1 and calls(st, "boom_chain") == 0
    assert all("static priority" not in graphs for graphs in _timed_graphs(p))

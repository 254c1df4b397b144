"""The whole-graph check's second look taken after the compile, on the CPU
(matcher/graph_guard.py's LaterLook): Inductor's graph won a first look against the sites'
saving; it runs until the first call LATER_S after that look, which times the graphs again and
runs the faster from then on."""

from __future__ import annotations

import pytest
import torch
from autotune_chain import FAST, alone, paired, run


def _graph(name: str, seen: list[str]):
    """A compiled graph's code that notes its name on each call and returns it."""

    def make():
        def fn(*args):
            seen.append(name)
            return name

        return fn

    return make


def _looks(*then_ms: float) -> list:
    """The looks given in advance: the substituted graph alone at 1 ms (a 100 us saving is
    10% of it), then both graphs with Inductor's (1 ms) winning against the substituted
    graph's 1.1 ms, then a look at the substituted graph at each of ``then_ms``."""
    second = [paired([ms] * 21, [1.0] * 21) for ms in then_ms]
    return [alone([1.0] * 21), paired([1.1] * 21, [1.0] * 21), *second]


def _choose(
    monkeypatch, tmp_path, looks: list, heard: list, written=(), graphs=None, failed=None,
    saved=100.0, later=True,
):  # fmt: skip
    """graph_guard.choose with a 100 us saving of a 1 ms graph (Inductor's graph winning
    contradicts it; ``saved``: another, or None for an unknown one) over ``looks`` given in
    advance, a later look allowed (``later``); returns the code, the first decision, what the
    calls ran and the looks not taken."""
    from pdlkit.matcher import graph_guard

    monkeypatch.setenv("PDLKIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(graph_guard, "GLANCE_SHARE", 0.0)
    given = list(looks)
    monkeypatch.setattr(graph_guard, "_measure", lambda runs, device, *settled: given.pop(0))
    seen: list[str] = []
    sub, ind = graphs or (_graph("substituted", seen), _graph("inductor", seen))
    told = graph_guard.Later(
        heard=heard.append, failed=(failed if failed is not None else []).append
    )
    _, fn, decision = graph_guard.choose(
        "k", sub, ind, (torch.randn(2),), "cached", saved, written=written,
        later=told if later else None,
    )  # fmt: skip
    return fn, decision, seen, given


def _due_now(fn) -> None:
    fn._due = 0.0  # LATER_S has passed


def test_inductors_graph_runs_until_the_look_after_the_compile(monkeypatch, tmp_path):
    """Inductor's graph won the first look against the sites' saving: no second look inside
    the compile; Inductor's graph runs, and the verdict is not cached yet."""
    from pdlkit.matcher import graph_guard
    from pdlkit.runtime_abi import autotune

    heard: list = []
    looks = _looks(0.9)
    fn, decision, seen, given = _choose(monkeypatch, tmp_path, looks, heard)
    assert (decision.choice, decision.source) == ("inductor", graph_guard.PENDING)
    assert len(given) == 1  # the second look is still to come
    assert fn(torch.randn(2)) == "inductor"
    assert autotune.decision_cache().get("k") is None and heard == []


def test_the_look_after_the_compile_decides_and_is_cached(monkeypatch, tmp_path):
    """The first call past LATER_S times the graphs again (the substituted one wins every
    round): that call and the next run the substituted graph, the verdict is cached, and
    explain's text says what the first look had read."""
    from pdlkit.runtime_abi import autotune

    heard: list = []
    looks = _looks(0.9)
    fn, _, seen, given = _choose(monkeypatch, tmp_path, looks, heard)
    _due_now(fn)
    assert [fn(torch.randn(2)), fn(torch.randn(2))] == ["substituted", "substituted"]
    assert given == [] and [d.choice for d in heard] == ["substituted"]
    assert autotune.decision_cache().get("k").choice == "substituted"
    assert "a second look after the compile; the first read substituted 1100 us" in (
        heard[0].describe()
    )


def test_the_next_compile_of_a_graph_still_to_be_looked_at_takes_no_rounds(monkeypatch, tmp_path):
    """A compile left its verdict to the look after it, and that look was never taken (the
    process ended first): the next compile of the graph compiles both graphs but takes no
    rounds inside the compile, runs the first look's choice, and its own look after the
    compile decides (and is cached, so the one after that compiles the winner alone)."""
    from pdlkit.matcher import graph_guard
    from pdlkit.runtime_abi import autotune

    _choose(monkeypatch, tmp_path, _looks(0.9), [])  # the look after it is never taken
    heard: list = []
    looks = [paired([0.9] * 21, [1.0] * 21)]  # the second compile's look after it
    fn, decision, _, given = _choose(monkeypatch, tmp_path, looks, heard)
    assert (decision.choice, decision.source) == ("inductor", graph_guard.PENDING)
    assert len(given) == 1 and fn(torch.randn(2)) == "inductor"  # no rounds yet
    assert "an earlier compile's" in decision.describe()
    _due_now(fn)
    assert fn(torch.randn(2)) == "substituted" and given == []
    assert [d.choice for d in heard] == ["substituted"]
    assert autotune.decision_cache().get("k").choice == "substituted"


def test_a_look_after_the_compile_that_agrees_keeps_inductors_graph(monkeypatch, tmp_path):
    """The later look reads Inductor's graph faster again: it keeps running, now cached."""
    from pdlkit.runtime_abi import autotune

    heard: list = []
    looks = _looks(1.1)
    fn, _, _, _ = _choose(monkeypatch, tmp_path, looks, heard)
    _due_now(fn)
    assert fn(torch.randn(2)) == "inductor"
    assert autotune.decision_cache().get("k").choice == "inductor"


def test_a_look_after_the_compile_that_fails_keeps_inductors_graph(monkeypatch, tmp_path):
    """The later look's timing raises: one warning names it, Inductor's graph runs, nothing
    is cached, and no later call tries again."""
    from pdlkit.runtime_abi import autotune

    heard: list = []
    failed: list = []
    looks = _looks()
    fn, _, _, given = _choose(monkeypatch, tmp_path, looks, heard, failed=failed)
    _due_now(fn)
    with pytest.warns(UserWarning, match="the look after the compile failed"):
        assert fn(torch.randn(2)) == "inductor"  # _measure's list is empty: IndexError
    assert fn(torch.randn(2)) == "inductor"
    assert autotune.decision_cache().get("k") is None and heard == []
    assert failed == ["the look after the compile failed (IndexError: pop from empty list); "
                      "inductor's graph runs"]  # fmt: skip


def test_the_look_after_the_compile_writes_on_copies(monkeypatch, tmp_path):
    """A graph that writes its input in place (a KV cache) is timed on a copy: the caller's
    tensor is written once, by the call itself."""

    def adding(name):
        def make():
            return lambda x: (x.add_(1), name)[1]

        return make

    looks = _looks(0.9)
    graphs = (adding("substituted"), adding("inductor"))
    fn, _, _, _ = _choose(monkeypatch, tmp_path, looks, [], written=(0,), graphs=graphs)
    _due_now(fn)
    x = torch.zeros(2)
    assert fn(x) == "substituted"
    assert x.tolist() == [1.0, 1.0]


def test_without_a_later_look_the_second_look_is_taken_at_once(monkeypatch, tmp_path):
    """On a GPU (or without a compilation to hear it) the second look is taken inside the
    compile, as before: the substituted graph wins it and runs from the first call."""
    from pdlkit.matcher import graph_guard

    monkeypatch.setenv("PDLKIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(graph_guard, "GLANCE_SHARE", 0.0)
    given = _looks(0.9)
    monkeypatch.setattr(graph_guard, "_measure", lambda runs, device, *settled: given.pop(0))
    seen: list[str] = []
    verdict, fn, decision = graph_guard.choose(
        "k", _graph("substituted", seen), _graph("inductor", seen), (torch.randn(2),),
        "cached", 100.0,
    )  # fmt: skip
    assert (verdict, decision.source, given) == ("substituted", "measured", [])
    assert fn() == "substituted"


def _contradicted(monkeypatch, later_s: float) -> None:
    """Every compilation's first look at the whole graph reads Inductor's graph faster against
    its sites' saving, and the look after the compile reads the substituted graph faster."""
    from pdlkit.matcher import graph_guard

    monkeypatch.setattr(graph_guard, "CONFIDENT", float("inf"))  # always compile both
    monkeypatch.setattr(graph_guard, "_contradicts", lambda timings, saved: bool(saved))
    monkeypatch.setattr(
        graph_guard,
        "faster",
        lambda timings: "substituted" if "after" in str(timings) else "inductor",
    )
    monkeypatch.setattr(graph_guard, "LATER_S", later_s)


def test_a_model_runs_inductors_graph_right_until_the_look(folders, monkeypatch):
    """Through pdlkit.optimize: before the look, the model's output is right and no kernel
    call runs; stats() counts the look to come, none taken, and no substitution as undone yet."""
    p, k = folders(FAST)
    _contradicted(monkeypatch, later_s=3600.0)
    st = run(p, k, "cached")  # run() checks the output against eager
    assert st["graph_looks_due"] == 1 and st.get("graphs_looked_at_later", 0) == 0
    assert st.get("substitutions_undone", 0) == 0
    assert st["by_kernel"].get("fast_chain", {}).get("kernel_calls", 0) == 0


def test_a_model_runs_its_kernel_right_after_the_look(folders, monkeypatch):
    """The first call past LATER_S takes the look; the substituted graph runs that call, its
    kernel counted, and the output is right."""
    p, k = folders(FAST)
    _contradicted(monkeypatch, later_s=0.0)
    st = run(p, k, "cached")
    assert st["by_kernel"]["fast_chain"]["kernel_calls"] == 1
    assert st["graphs_looked_at_later"] == 1 and st.get("substitutions_undone", 0) == 0


def test_a_failed_look_is_counted_and_the_model_stays_right(folders, monkeypatch):
    """Through pdlkit.optimize, a look after the compile that raises: one warning, the output
    right, stats() counts it failed and none taken, and no kernel call runs."""
    from pdlkit.matcher import graph_guard

    p, k = folders(FAST)
    _contradicted(monkeypatch, later_s=0.0)

    def broken(*args, **kw):
        raise RuntimeError("timer broke")

    monkeypatch.setattr(graph_guard, "_first_look", broken)  # called by the look alone
    with pytest.warns(UserWarning, match="the look after the compile failed .RuntimeError"):
        st = run(p, k, "cached")
    assert st["graph_looks_failed"] == 1 and st.get("graphs_looked_at_later", 0) == 0
    assert st["by_kernel"].get("fast_chain", {}).get("kernel_calls", 0) == 0


def test_inductors_win_where_the_saving_is_unknown_is_looked_at_after_the_compile(
    monkeypatch, tmp_path
):
    """ViT BF16 at 16 threads on the Xeon with AMX: a site timed unsteady left the saving
    unknown, and Inductor's graph won the first look; the look after the compile times the
    graphs again and runs the faster."""
    from pdlkit.matcher import graph_guard

    looks = [paired([1.1] * 21, [1.0] * 21), paired([0.9] * 21, [1.0] * 21)]
    fn, decision, _, given = _choose(monkeypatch, tmp_path, looks, [], saved=None)
    assert decision.source == graph_guard.PENDING and fn(torch.randn(2)) == "inductor"
    _due_now(fn)
    assert fn(torch.randn(2)) == "substituted" and given == []


def test_an_unknown_saving_gets_no_second_look_inside_the_compile(monkeypatch, tmp_path):
    """Without a look after the compile (CUDA), Inductor's win over an unknown saving stands:
    the rounds are not taken twice inside the compile."""
    looks = [paired([1.1] * 21, [1.0] * 21), paired([0.9] * 21, [1.0] * 21)]
    _, decision, _, given = _choose(monkeypatch, tmp_path, looks, [], saved=None, later=False)
    assert decision.choice == "inductor" and len(given) == 1

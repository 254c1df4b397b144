"""Kernels chosen by measurement at a call site: the fastest of the eligible kernels or the
replaced subgraph, the candidates excluded, the decision cache, the settings, and per-bucket
choices for dynamic dimensions.

The subject is autotune_chain.py's matmul chain. The whole-graph check is
test_autotune_graph.py's; what a kernel is timed against (the subgraph's proxy) and what a
kept subgraph means to other patterns, test_autotune_subgraph.py's.
"""

from __future__ import annotations

import json
import operator
import shutil
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Callable

import pytest
import torch
from autotune_chain import FAST, SLOW, Chain, Clock, calls, inputs, install_clock, run
from conftest import write
from pdlkit.runtime_abi import autotune

import pdlkit


@pytest.fixture(autouse=True)
def _sites_alone(monkeypatch):
    """Each site's choice on its own: no whole-graph check (test_autotune_graph.py's subject),
    which on a busy host compiles Inductor's graph as well and may keep it (seen in a CI run of
    this VM: the chain's microsecond graphs spread 16-30% a round, and a test that expects
    fast_chain to run found Inductor's graph)."""
    from pdlkit import whole_graph

    monkeypatch.setattr(whole_graph, "measured", lambda *args: False)


RAISES = """
@pdlkit.kernel(op="chain", meta=meta, priority=20)
def boom_chain(a: Tensor, wb: Tensor, wc: Tensor) -> Tensor:
    raise RuntimeError("kaboom")
"""


WRONG_SHAPE = """
@pdlkit.kernel(op="chain", meta=meta, priority=20)
def liar_chain(a: Tensor, wb: Tensor, wc: Tensor) -> Tensor:
    return a.new_zeros((1, 1))
"""


def test_fastest_kernel_wins_over_a_higher_priority_one(folders):
    p, k = folders(FAST, SLOW)
    st = run(p, k, "full")
    assert calls(st, "fast_chain") == 1 and calls(st, "slow_chain") == 0


def test_a_near_tie_between_kernels_goes_to_the_higher_priority_one():
    """Within MARGIN (3%) of the fastest, the first kernel in priority order wins; beyond it,
    or where that one does not beat the subgraph by MARGIN, the fastest does."""
    from pdlkit.runtime_abi.autotune import KEEP, Timing, fastest

    order = ["amx", "onednn"]  # priority order

    def pick(amx: float, onednn: float, keep: float) -> str:
        return fastest([Timing("amx", amx), Timing("onednn", onednn), Timing(KEEP, keep)], order)

    assert pick(102.0, 100.0, 130.0) == "amx"  # 2% slower: a tie
    assert pick(104.0, 100.0, 130.0) == "onednn"  # 4% slower: measured faster
    assert pick(102.0, 100.0, 104.0) == "onednn"  # amx does not beat the subgraph by 3%
    assert pick(102.0, 100.0, 102.0) == KEEP


def test_off_is_the_static_priority(folders):
    p, k = folders(FAST, SLOW)
    st = run(p, k, "off")
    assert calls(st, "slow_chain") == 1 and st["tuning_misses"] == 0


def test_subgraph_kept_when_every_kernel_is_slower(folders):
    p, k = folders(SLOW)
    st = run(p, k, "full")
    assert st["substitutions"] == 0 and calls(st, "slow_chain") == 0
    text = str(pdlkit.explain(Chain(), *inputs(), patterns=p, kernels=k, autotune="cached"))
    assert "kept for Inductor, no kernel measured 3% faster (1)" in text
    assert "slow_chain" in text and "-> subgraph" in text


def test_explain_shows_each_candidates_time_and_the_choice(folders):
    p, k = folders(FAST, SLOW)
    report = pdlkit.explain(Chain(), *inputs(), patterns=p, kernels=k, autotune="full")
    (sub,) = report.substitutions
    assert sub.kernel == "fast_chain"
    assert sub.tuning.startswith("measured: ") and sub.tuning.endswith("-> fast_chain")
    for name in ("fast_chain", "slow_chain", "subgraph"):
        assert f"{name} " in sub.tuning
    assert " us" in sub.tuning


def test_pinned_kernel_wins_and_explain_says_what_was_faster(folders, tmp_path):
    p, k = folders(FAST, SLOW)
    write(
        p, "pins.yaml", "version: 1\npatterns:\n  - file: chain.pdl.mlir\n    kernel: slow_chain\n"
    )
    st = run(p / "pins.yaml", k, "full")
    assert calls(st, "slow_chain") == 1 and calls(st, "fast_chain") == 0
    report = pdlkit.explain(
        Chain(), *inputs(), patterns=p / "pins.yaml", kernels=k, autotune="cached"
    )
    (sub,) = report.substitutions
    assert sub.tuning.startswith("pinned: ") and "fast_chain " in sub.tuning


def test_kernel_that_raises_is_excluded_and_named(folders):
    p, k = folders(RAISES, FAST)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        st = run(p, k, "full")
    assert calls(st, "fast_chain") == 1 and calls(st, "boom_chain") == 0
    msgs = [str(w.message) for w in seen if "autotune" in str(w.message)]
    assert any("kernel boom_chain is not a candidate at" in m and "kaboom" in m for m in msgs)


def test_kernel_with_a_wrong_output_shape_is_excluded(folders):
    p, k = folders(WRONG_SHAPE, FAST)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        st = run(p, k, "full")
    assert calls(st, "fast_chain") == 1 and calls(st, "liar_chain") == 0
    assert any("kernel liar_chain is not a candidate" in str(w.message) for w in seen)


def test_decision_is_cached_and_reused(folders):
    p, k = folders(FAST, SLOW)
    first = run(p, k, "cached")
    second = run(p, k, "cached")
    assert (first["tuning_misses"], first["tuning_hits"]) == (1, 0)
    assert (second["tuning_misses"], second["tuning_hits"]) == (0, 1)
    assert calls(second, "fast_chain") == 1


def test_full_measures_again(folders):
    p, k = folders(FAST, SLOW)
    run(p, k, "cached")
    st = run(p, k, "full")
    assert (st["tuning_misses"], st["tuning_hits"]) == (1, 0)


def test_corrupted_cache_is_ignored_with_one_warning_and_rewritten(folders, tmp_path):
    p, k = folders(FAST, SLOW)
    run(p, k, "cached")
    (path,) = (tmp_path / "cache" / "autotune").glob("host-*.json")
    path.write_text("{not json")
    autotune._CACHES.clear()  # a new process: nothing read yet
    autotune._WARNED.clear()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        st = run(p, k, "cached")
    msgs = [str(w.message) for w in seen if "ignoring autotune cache" in str(w.message)]
    assert len(msgs) == 1 and str(path) in msgs[0]
    assert calls(st, "fast_chain") == 1
    choices = [d["choice"] for d in json.loads(path.read_text())["decisions"].values()]
    assert "fast_chain" in choices  # the site's decision, written again


def test_a_cache_made_with_other_copies_of_the_folders_spares_the_measuring(
    folders, tmp_path, monkeypatch
):
    """Deploying: the decision cache filled on one machine of a kind, shipped with the model to
    another whose pattern and kernel folders are copies at other paths (other inodes and
    times). Its first compile there matches again but measures nothing: the sites' decisions
    are keyed by the kernel files' contents, the whole-graph verdict by the graph."""
    from pdlkit.matcher import graph_guard

    p, k = folders(FAST, SLOW)
    run(p, k, "cached")
    there = tmp_path / "there"
    shutil.copytree(p, there / "patterns")
    shutil.copytree(k, there / "kernels", ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(graph_guard, "_measure", lambda *a, **kw: pytest.fail("measured"))
    st = run(there / "patterns", there / "kernels", "cached")
    assert (st["tuning_misses"], st["tuning_hits"]) == (0, 1)
    assert calls(st, "fast_chain") == 1


def test_two_processes_writing_at_once_lose_nothing(tmp_path):
    script = textwrap.dedent(
        """
        import sys
        from pdlkit.runtime_abi import autotune
        cache = autotune.decision_cache()
        for i in range(60):
            cache.put(f"{sys.argv[1]}-{i}", autotune.Decision("subgraph"))
        """
    )
    env = {"PDLKIT_CACHE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    procs = [subprocess.Popen([sys.executable, "-c", script, tag], env=env) for tag in ("a", "b")]
    assert [pr.wait(timeout=120) for pr in procs] == [0, 0]
    (path,) = (tmp_path / "autotune").glob("host-*.json")
    keys = json.loads(path.read_text())["decisions"].keys()
    assert {f"{t}-{i}" for t in "ab" for i in range(60)} <= set(keys)


def test_bad_mode_is_one_clear_error(monkeypatch):
    with pytest.raises(ValueError, match=r"autotune='fast': expected one of cached, off, full"):
        pdlkit.optimize(Chain(), autotune="fast")
    monkeypatch.setenv("PDLKIT_AUTOTUNE", "sometimes")
    with pytest.raises(ValueError, match=r"PDLKIT_AUTOTUNE='sometimes'"):
        pdlkit.optimize(Chain())


def test_a_candidate_over_the_site_budget_is_stopped(folders, monkeypatch):
    p, k = folders(FAST, SLOW)
    monkeypatch.setenv("PDLKIT_AUTOTUNE_BUDGET", "0.05")  # a share of 17 ms: slow_chain sleeps 20
    report = pdlkit.explain(Chain(), *inputs(), patterns=p, kernels=k, autotune="full")
    (sub,) = report.substitutions
    assert sub.kernel == "fast_chain"
    assert "slow_chain" in sub.tuning and "stopped: over the budget" in sub.tuning


def _starts_slow(first_s: float, clock: Clock) -> tuple[list[int], Callable[[], None]]:
    calls: list[int] = []

    def fn() -> None:
        calls.append(1)
        clock.sleep(first_s if len(calls) == 1 else 0.0001)

    return calls, fn


def test_a_slow_first_call_alone_does_not_stop_a_candidate(monkeypatch):
    """One-time costs (or a thread descheduled on a busy host) in the first call: the warm
    call decides, over the candidate's share of the budget (0.05 s each here)."""
    clock = install_clock(monkeypatch)
    _, cold_start = _starts_slow(0.07, clock)
    other = ("other", lambda: clock.sleep(0.0001))
    timed, _ = autotune.measure([("cold start", cold_start), other], "cpu", 0.1)
    assert timed.note == "" and timed.us is not None and timed.us < 20_000


def test_a_first_call_over_the_whole_budget_stops_the_candidate_there(monkeypatch):
    calls, hopeless = _starts_slow(0.15, install_clock(monkeypatch))
    (timed,) = autotune.measure([("hopeless", hopeless)], "cpu", 0.1)
    assert timed.note == "stopped: over the budget" and len(calls) == 1
    assert timed.us is not None and timed.us >= 150_000


def test_relative_cache_dir_is_not_used(monkeypatch):
    monkeypatch.setenv("PDLKIT_CACHE_DIR", "relative/cache")
    autotune._WARNED.clear()
    with pytest.warns(UserWarning, match="relative path; decisions are not cached"):
        assert autotune.cache_dir() is None


ROWS = """
@pdlkit.kernel(op="chain", meta=meta, priority=1)
def rows_chain(a: Tensor, wb: Tensor, wc: Tensor) -> Tensor:
    if a.shape[0] > 8:  # fast for a few rows only
        time.sleep(0.05)
    return a @ (wb.t() @ wc.t())
"""


def test_dynamic_dims_choose_per_bucket_at_run_time(folders, monkeypatch):
    # at a few rows rows_chain and the subgraph take microseconds alike, and a loaded CI host
    # once timed the subgraph faster at the compile-time bucket (no site substituted): the
    # subgraph 1 ms slower makes the few-rows choice the kernel's, the 300 rows' (50 ms of
    # sleep) still the subgraph's
    real = autotune.measure

    def measure(*args, **kwargs):
        out = real(*args, **kwargs)
        for t in out:
            if t.name == autotune.KEEP and t.us is not None:
                t.us += 1000.0
        return out

    monkeypatch.setattr(autotune, "measure", measure)
    p, k = folders(ROWS)
    pdlkit.stats(reset=True)
    _, b, c = inputs()
    f = pdlkit.optimize(Chain(), patterns=p, kernels=k, autotune="full", dynamic=True)
    with torch.no_grad():
        for rows in (4, 4, 300, 300, 5):  # buckets 4, 512, 8
            a = torch.randn(rows, 1)
            torch.testing.assert_close(f(a, b, c), Chain()(a, b, c), rtol=1e-4, atol=1e-3)
    st = pdlkit.stats()
    assert st["substitutions"] == 1  # one compilation, one site
    assert st["tuning_misses"] == 3  # the compile-time bucket, then 512 and 8 at run time
    assert calls(st, "rows_chain") == 3  # the few-rows calls; 300 rows ran the subgraph


def test_measure_runs_its_rounds_in_alternating_order(monkeypatch):
    """Every other round runs the candidates in reverse, so that none always follows the
    same other one; each candidate keeps its samples round by round."""
    clock, order = install_clock(monkeypatch), []

    def fn(name):  # over 1 ms: one call a sample
        return lambda: (order.append(name), clock.sleep(0.0011))

    timings = autotune.measure([("a", fn("a")), ("b", fn("b"))], "cpu", 10.0, samples=4)
    rounds = order[4:]  # after each candidate's two warm-up calls
    assert rounds == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert [len(t.rounds) for t in timings] == [4, 4]


def test_a_lead_call_times_each_candidate_after_its_own_call(monkeypatch):
    """With ``lead=1`` each sample follows an untimed call of the same candidate: one that runs
    slowly right after another candidate (its data out of the caches) is timed as it runs
    call after call (the whole-graph check's samples)."""
    last, clock = [""], install_clock(monkeypatch)

    def fn(name):  # 3 ms right after the other candidate, 1 ms after itself
        def call():
            clock.sleep(0.001 if last[0] == name else 0.003)
            last[0] = name

        return call

    runs = [("a", fn("a")), ("b", fn("b"))]
    plain = autotune.measure(runs, "cpu", 10.0, samples=6)
    led = autotune.measure(runs, "cpu", 10.0, samples=6, lead=1)
    # a, b / b, a rounds: half of each one's samples follow the other, medians 2-3 ms
    assert all(t.us is not None and t.us > 1900 for t in plain)
    assert all(t.us is not None and t.us < 1600 for t in led)
    # no sample followed the other candidate (3 ms)
    assert all(max(t.rounds) < 0.0025 for t in led)


def test_a_candidate_longer_than_lead_below_takes_no_lead_call(monkeypatch):
    """A long call's predecessor hardly matters (its data outgrow the caches): it is not run
    an extra time per sample."""
    calls, clock = {"short": 0, "long": 0}, install_clock(monkeypatch)

    def fn(name, seconds):
        def call():
            calls[name] += 1
            clock.sleep(seconds)

        return call

    runs = [("short", fn("short", 0.001)), ("long", fn("long", 0.02))]
    autotune.measure(runs, "cpu", 10.0, samples=4, lead=1, lead_below=0.01)
    assert calls == {"short": 2 + 4 * 2, "long": 2 + 4}  # warm-up 2, then samples (+ lead)


def test_timing_arguments_of_dynamic_quantization_are_valid_qparams():
    """A site's x_scale / x_zp made by choose_qparams are computed from the (fresh) activation
    they read, not drawn at random: a random zero point fell outside int8 as often as not, so
    the kernel declined while being timed and was never chosen (torchao's ArmInductorQuantizer,
    dynamic: every such site kept Inductor's code, 0.82x where the kernels gave 0.35x)."""
    import torch.ao.quantization.fx._decomposed  # noqa: F401 - registers quantized_decomposed
    from pdlkit.matcher.choose import Tuner
    from torch.fx.experimental.proxy_tensor import make_fx

    qd = torch.ops.quantized_decomposed

    def f(x):
        s, z = qd.choose_qparams.tensor(x * 3.0, -128, 127, 1e-5, torch.int8)
        return s, z

    gm = make_fx(f, tracing_mode="fake")(torch.randn(4, 8))
    items = [n for n in gm.graph.nodes if n.target is operator.getitem]
    for seed in range(5):
        torch.manual_seed(seed)
        tuner = Tuner("full", gm, [torch.randn(4, 8)])
        scale, zp = (tuner.value(n) for n in items)
        assert scale.item() > 0 and -128 <= zp.item() <= 127, (seed, scale, zp)


CONTIGUOUS = """
@pdlkit.kernel(op="chain", meta=meta, priority=1, shapes={"a": {"contiguous": True}})
def strict_chain(a: Tensor, wb: Tensor, wc: Tensor) -> Tensor:
    return a @ (wb.t() @ wc.t())
"""


@pytest.mark.parametrize(("body", "guarded"), [(FAST, False), (CONTIGUOUS, True)])
def test_a_timed_call_checks_shape_rules_only_where_the_compiled_call_will(
    folders, monkeypatch, body, guarded
):
    """A kernel with no per-call shape rule is timed on the op's fast path, as the compiled
    graph calls it; one whose rule is a property of each call's tensors (contiguity) is
    timed with the check."""
    from pdlkit.matcher import choose

    seen = []
    timing_site = choose.timing_site

    def spy(k, where, transposed=(), guard=True):
        seen.append(guard)
        return timing_site(k, where, transposed, guard)

    monkeypatch.setattr(choose, "timing_site", spy)
    p, k = folders(body)
    run(p, k, "full")
    assert seen and set(seen) == {guarded}

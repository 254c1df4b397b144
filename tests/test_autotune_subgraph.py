"""What a kernel's time is compared with at a call site: the replaced subgraph, timed through a
proxy of the code Inductor makes of it (matcher/lowered.py) or compiled by Inductor on request
(PDLKIT_AUTOTUNE_SUBGRAPH); and a subgraph kept by measurement, which a smaller pattern leaves
whole.

The subject is autotune_chain.py's matmul chain.
"""

from __future__ import annotations

import time

import pytest
import torch
from autotune_chain import FAST, SLOW, Chain, calls, inputs, run
from conftest import LINEAR, VNNI, pdl_pattern, write
from pdlkit.matcher import choose
from pdlkit.runtime_abi import autotune

import pdlkit

_RUNS: list[float] = []


def _slow_site(x):
    """A subgraph's run of 0.1 s (BF16 GEMMs on a CPU without BF16 arithmetic run longer)."""
    _RUNS.append(time.perf_counter())
    time.sleep(0.1)
    return x + 1


torch.fx.wrap("_slow_site")


def _calls_slow_site(x):
    return _slow_site(x)


def test_bad_subgraph_timing_setting_is_one_clear_error(monkeypatch):
    monkeypatch.setenv("PDLKIT_AUTOTUNE_SUBGRAPH", "guess")
    with pytest.raises(ValueError, match=r"PDLKIT_AUTOTUNE_SUBGRAPH='guess': expected one of"):
        pdlkit.optimize(Chain(), autotune="cached")


def _int8_site(residual=(32, 64)):
    """A PT2E int8 linear + residual add + quantize subgraph, as pdlkit replaces it, and its
    arguments (the weight and bias are the graph's constants: indices 1 and 2)."""
    from torch.ao.quantization.fx import _decomposed  # noqa: F401 (registers the ops)

    qd = torch.ops.quantized_decomposed

    def site(qx, qw, b, r):
        x = qd.dequantize_per_tensor.default(qx, 0.02, 128, 0, 255, torch.uint8)
        w = qd.dequantize_per_channel.default(qw, torch.full((64,), 0.01),
                                              torch.zeros(64, dtype=torch.int64), 0, -128, 127,
                                              torch.int8)  # fmt: skip
        y = torch.ops.aten.add.Tensor(torch.ops.aten.linear.default(x, w, b), r)
        return qd.quantize_per_tensor.default(y, 0.05, 128, 0, 255, torch.uint8)

    g = torch.Generator().manual_seed(0)
    args = [torch.randint(0, 255, (32, 48), dtype=torch.uint8, generator=g),
            torch.randint(-127, 127, (64, 48), dtype=torch.int8, generator=g),
            torch.randn(64, generator=g), torch.randn(*residual, generator=g)]  # fmt: skip
    return torch.fx.symbolic_trace(site), args


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs oneDNN (mkldnn)")
def test_the_proxy_of_an_int8_site_is_the_onednn_call_inductor_makes_under_freezing():
    """Under freezing the proxy runs the GEMM, the add and the quantize as one
    onednn.qlinear_pointwise.binary call on a packed weight, and computes what the site does."""
    from pdlkit.matcher import lowered

    gm, args = _int8_site()
    if not VNNI:
        # without VNNI oneDNN sums u8 x s8 pairs in int16 (vpmaddubsw), which saturates for
        # 8-bit weights (158 quanta off here on an AVX2-only EPYC): 7-bit weights cannot
        args[1] = args[1] // 2
    low = lowered.as_inductor_lowers(gm, args, (1, 2), freezing=True)
    targets = [n.target for n in low.module.graph.nodes if n.op == "call_function"]
    assert targets == [torch.ops.onednn.qlinear_pointwise.binary]
    assert low.faithful and low.lowered == 1
    got, want = low.module(*args), gm(*args)
    assert got.dtype == torch.uint8 and got.shape == want.shape
    assert (got.int() - want.int()).abs().max() <= 1  # one quantum of rounding


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs oneDNN (mkldnn)")
def test_the_proxy_on_another_copy_of_the_weights_packs_that_copy():
    """Lowered.on (matcher/cold.py's copies): the same code with the other weight packed, as a
    new rewrite for that weight computes; the first module keeps its own."""
    from pdlkit.matcher import lowered

    gm, args = _int8_site()
    other = list(args)
    other[1] = torch.randint(
        -127, 127, args[1].shape, dtype=torch.int8, generator=torch.Generator().manual_seed(5)
    )
    low = lowered.as_inductor_lowers(gm, args, (1, 2), freezing=True)
    fresh = lowered.as_inductor_lowers(gm, other, (1, 2), freezing=True).module(*other)
    assert torch.equal(low.on(other)(*other), fresh)
    assert not torch.equal(low.module(*other), fresh)  # still the first weight's pack


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs oneDNN (mkldnn)")
def test_a_broadcast_add_is_not_folded_into_the_int8_gemm():
    from pdlkit.matcher import lowered

    gm, args = _int8_site(residual=(64,))
    low = lowered.as_inductor_lowers(gm, args, (1, 2), freezing=True)
    targets = [n.target for n in low.module.graph.nodes if n.op == "call_function"]
    assert targets[0] is torch.ops.onednn.qlinear_pointwise.default
    assert torch.ops.aten.add.Tensor in targets
    assert low.module(*args).shape == gm(*args).shape


def _int8_conv_site():
    """A PT2E int8 convolution subgraph (ViT's patch embedding) and its arguments (weight and
    bias constants: indices 1 and 2)."""
    from torch.ao.quantization.fx import _decomposed  # noqa: F401 (registers the ops)

    qd = torch.ops.quantized_decomposed

    def site(qx, qw, b):
        x = qd.dequantize_per_tensor.default(qx, 0.02, 128, 0, 255, torch.uint8)
        w = qd.dequantize_per_channel.default(qw, torch.full((8,), 0.01),
                                              torch.zeros(8, dtype=torch.int64), 0, -128, 127,
                                              torch.int8)  # fmt: skip
        return torch.ops.aten.conv2d.default(x, w, b, [4, 4])

    g = torch.Generator().manual_seed(0)
    args = [torch.randint(0, 255, (1, 3, 16, 16), dtype=torch.uint8, generator=g),
            torch.randint(-127, 127, (8, 3, 4, 4), dtype=torch.int8, generator=g),
            torch.randn(8, generator=g)]  # fmt: skip
    return torch.fx.symbolic_trace(site), args


def test_an_int8_convolution_left_in_float_makes_the_proxy_unfaithful():
    """Inductor lowers an int8 convolution to oneDNN's int8 op under freezing; the proxy runs
    it in float, so its library call's time is no lower bound and the site's subgraph is timed
    as Inductor compiles it (a float convolution's time had picked a kernel 24% slower)."""
    from pdlkit.matcher import lowered

    gm, args = _int8_conv_site()
    low = lowered.as_inductor_lowers(gm, args, (1, 2), freezing=True)
    assert not low.faithful
    assert low.module(*args).shape == gm(*args).shape  # timed only: conversions stand in
    assert lowered.as_inductor_lowers(gm, args, (1, 2), freezing=False).faithful


def test_without_freezing_the_proxy_keeps_the_float_gemm():
    from pdlkit.matcher import lowered

    gm, args = _int8_site()
    low = lowered.as_inductor_lowers(gm, args, (1, 2), freezing=False)
    targets = {n.target for n in low.module.graph.nodes if n.op == "call_function"}
    assert torch.ops.aten.linear.default in targets and low.lowered == 0


def test_a_proxy_timing_keeps_its_lower_bound_in_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PDLKIT_CACHE_DIR", str(tmp_path))
    timing = autotune.Timing(autotune.KEEP, 120.0, "proxy", 80.0)
    autotune.decision_cache().put("site", autotune.Decision(autotune.KEEP, [timing]))
    autotune._CACHES.clear()  # a new process reads the file
    (back,) = autotune.decision_cache().get("site").timings
    assert (back.us, back.low, back.note) == (120.0, 80.0, "proxy")


def test_the_subgraph_is_compiled_only_on_request(folders, monkeypatch):
    """A kernel the eager bounds cannot place (here: bounds made wide) is compared with the
    proxy by default, with no Inductor compile of the subgraph; with
    PDLKIT_AUTOTUNE_SUBGRAPH=compile, with the subgraph compiled by Inductor."""
    from pdlkit.matcher import lowered
    from pdlkit.runtime_abi import fallback

    compiled = []
    original = fallback.ReplacedSubgraph.compile

    def counting(self, *a, **kw):
        compiled.append(1)
        return original(self, *a, **kw)

    monkeypatch.setattr(fallback.ReplacedSubgraph, "compile", counting)
    monkeypatch.setattr(lowered, "bounds", lambda runs, budget, best_us=None: (0.0, 1e9))
    p, k = folders(FAST)
    (sub,) = pdlkit.explain(
        Chain(), *inputs(), patterns=p, kernels=k, autotune="full"
    ).substitutions
    assert compiled == [] and "subgraph 1000000000.0 us (proxy: " in sub.tuning
    monkeypatch.setenv("PDLKIT_AUTOTUNE_SUBGRAPH", "compile")
    (sub,) = pdlkit.explain(
        Chain(), *inputs(), patterns=p, kernels=k, autotune="full"
    ).substitutions
    assert compiled == [1] and "(Inductor)" in sub.tuning and sub.kernel == "fast_chain"


# a single linear(x, w, b) replaced by one(x, w), walked after the chain (lower benefit)
ONE_PATTERN = pdl_pattern("one", LINEAR, "%lin", "one", "%x, %w", benefit=0)


ONE = """
def one_meta(a, w):
    return a.new_empty((a.shape[0], w.shape[0]))

@pdlkit.kernel(op="one", meta=one_meta)
def one_linear(a: Tensor, w: Tensor) -> Tensor:
    return a @ w.t()
"""


def _two_patterns(p):
    """A manifest: the chain (measured) and the single linear (pinned to one_linear, so it is
    substituted wherever it matches, unmeasured)."""
    write(p, "one.pdl.mlir", ONE_PATTERN)
    write(p, "both.yaml", "version: 1\npatterns:\n  - file: chain.pdl.mlir\n"
          "  - file: one.pdl.mlir\n    kernel: one_linear\n")  # fmt: skip
    return p / "both.yaml"


def test_a_kept_subgraph_is_not_rewritten_by_a_smaller_pattern(folders):
    """The chain measured faster as Inductor's code is kept whole: the single-linear pattern
    (lower benefit, walked after it) does not replace its linears, since "keep the subgraph"
    is what was timed against the kernels; explain names the kept match."""
    p, k = folders(SLOW, ONE)
    both = _two_patterns(p)
    st = run(both, k, "full")
    assert st["substitutions"] == 0 and calls(st, "one_linear") == 0
    report = pdlkit.explain(Chain(), *inputs(), patterns=both, kernels=k, autotune="cached")
    texts = [m.reason for m in report.near_misses if m.pattern == "one"]
    assert texts and all("kept by measurement" in t and "chain at " in t for t in texts), texts


def test_without_a_kept_match_the_smaller_pattern_still_applies(folders):
    """The same two patterns with no kernel for the chain: no match is kept by measurement
    (the chain is simply not matched), and the single-linear pattern replaces both linears."""
    p, k = folders(ONE)
    st = run(_two_patterns(p), k, "full")
    assert calls(st, "one_linear") == 2


def test_bounds_of_a_subgraph_slower_than_its_budget_take_one_sample():
    """With a 0.2 s budget, runs of 0.1 s: one warm-up run and one sample (its extern ops, its
    whole run), where the four samples taken whatever their length made 11 runs, 1.1 s."""
    from pdlkit.matcher import lowered

    gm = torch.fx.symbolic_trace(_calls_slow_site)
    _RUNS.clear()
    lower, upper = lowered.bounds([(gm, (torch.zeros(2),))], budget=0.2)
    assert len(_RUNS) == 3 and upper >= 100_000


def _counted(x):
    _RUNS.append(time.perf_counter())
    return x


torch.fx.wrap("_counted")


def _calls_fast_site(x):
    return _counted(torch.ops.aten.mm.default(x, x))  # an extern op: its time is the lower bound


def test_bounds_of_a_subgraph_a_kernel_beats_stop_early(monkeypatch):
    """A subgraph whose library calls alone take over 10x the fastest kernel's time has lost
    after one sample (its first warm-up run ends the warm-up too), over 2x after two: not the
    four its budget would allow."""
    from pdlkit.matcher import lowered

    gm = torch.fx.symbolic_trace(_calls_fast_site)
    x = torch.randn(64, 64)
    warm = 3  # warm-up runs, then each sample runs the module twice (extern ops, whole run)
    _RUNS.clear()
    lowered.bounds([(gm, (x,))], budget=10.0, best_us=0.01)
    assert len(_RUNS) == 1 + 2 * 1
    monkeypatch.setattr(lowered, "FAR", float("inf"))  # 2x: two samples
    _RUNS.clear()
    lowered.bounds([(gm, (x,))], budget=10.0, best_us=0.01)
    assert len(_RUNS) == warm + 2 * 2
    _RUNS.clear()
    lowered.bounds([(gm, (x,))], budget=10.0, best_us=1e6)  # the kernel is slower
    assert len(_RUNS) >= warm + 2 * 4


def test_bounds_beaten_by_far_warm_only_the_copies_they_sample():
    """Twenty copies of the weights, the kernel 10x faster than the first warm-up run: one
    warm-up run, then the second copy warmed before the sample that takes it: 4 runs, where
    warming every copy first took 22."""
    from pdlkit.matcher import lowered

    gm = torch.fx.symbolic_trace(_calls_fast_site)
    runs = [(gm, (torch.randn(64, 64),)) for _ in range(20)]
    _RUNS.clear()
    lowered.bounds(runs, budget=10.0, best_us=0.01)
    assert len(_RUNS) == 1 + 1 + 2


class _Subgraph:
    """What choose._subgraph_time reads of a replaced subgraph: its module (never compiled)."""

    def __init__(self, gm):
        self.gm = gm

    def module(self):
        return self.gm


def test_a_float_sites_proxy_keeps_its_library_calls_for_the_whole_graph_sweep(monkeypatch):
    """A float linear's proxy timing carries one run of its library calls (the whole-graph
    check sweeps them where the sites' saving is as large as the graph: graph_guard's
    BELIEVABLE), a run that returns their microseconds."""
    monkeypatch.setattr(torch._inductor.config, "freezing", False)
    aten = torch.ops.aten
    gm = torch.fx.symbolic_trace(lambda x, w, b: aten.relu.default(aten.linear.default(x, w, b)))
    reals = [[torch.randn(64, 128), torch.randn(256, 128), torch.randn(256)]]
    t = choose._subgraph_time([autotune.Timing("k", 1.0)], _Subgraph(gm), reals, "cpu", 0.2, ())
    assert t.name == autotune.KEEP and t.extern is not None and t.extern() > 0.0


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs oneDNN (mkldnn)")
def test_an_int8_sites_onednn_call_is_not_swept(monkeypatch):
    """oneDNN's int8 GEMM on a packed weight, swept at 16 threads on a Xeon with AMX, read
    1.56x Inductor's whole bert-mini graph: not a lower bound, so no run is kept for the
    sweep (the saving is then not believed past BELIEVABLE)."""
    monkeypatch.setattr(torch._inductor.config, "freezing", True)
    gm, args = _int8_site()
    args[1] = args[1] // 2  # 7-bit weights: exact without VNNI too
    t = choose._subgraph_time(
        [autotune.Timing("k", 1.0)], _Subgraph(gm), [args], "cpu", 0.2, (1, 2)
    )
    assert t.name == autotune.KEEP and t.low is not None and t.extern is None

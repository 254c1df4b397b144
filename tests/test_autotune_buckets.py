"""The whole-graph check of a graph compiled with dynamic shapes (matcher/graph_buckets.py):
the substituted graph and Inductor's code for the whole graph are both compiled once, and
each shape bucket runs the one timed faster on its first call; no recompilation.

The subject is autotune_chain.py's matmul chain, its rows dynamic.
"""

from __future__ import annotations

import pytest
import torch
from autotune_chain import FAST, N, calls
from autotune_chain import Chain as autotune_chain_model

import pdlkit


def _inputs(rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The chain's inputs with ``rows`` rows (not N: Dynamo would take the two sizes for one)."""
    g = torch.Generator().manual_seed(rows)
    return (torch.randn(rows, 1, generator=g), torch.randn(1, N, generator=g),
            torch.randn(N, N, generator=g))  # fmt: skip


def _run_rows(fast, rows: list[int]) -> dict:
    """Call ``fast`` with each row count, checking each result; stats() afterwards."""
    with torch.no_grad():
        for n in rows:
            args = _inputs(n)
            torch.testing.assert_close(
                fast(*args), autotune_chain_model()(*args), rtol=1e-4, atol=1e-3
            )
    return pdlkit.stats()


def _compiled(p, k):
    pdlkit.stats(reset=True)
    torch._dynamo.reset()
    return pdlkit.optimize(
        autotune_chain_model(), patterns=p, kernels=k, autotune="cached", dynamic=True
    )


@pytest.fixture
def timed(monkeypatch) -> list[list[str]]:
    """The candidates of each whole-graph verdict timed (not read from the cache), in order:
    graph_guard.choose, recorded. A verdict timed on a busy host is not cached
    (``autotune.trusted``), so the cache's entries would not count them all."""
    from pdlkit.matcher import graph_guard
    from pdlkit.runtime_abi import autotune

    seen: list[list[str]] = []
    choose = graph_guard.choose

    def recording(key, *args, **kw):
        cached = autotune.decision_cache().get(key) is not None
        verdict, fn, decision = choose(key, *args, **kw)
        names = [t.name for t in decision.timings]
        if "inductor" in names and not cached:
            seen.append(names)
        return verdict, fn, decision

    monkeypatch.setattr(graph_guard, "choose", recording)
    return seen


def test_each_shape_bucket_of_a_dynamic_graph_gets_its_own_whole_graph_verdict(folders, timed):
    from torch._dynamo.utils import counters

    p, k = folders(FAST)
    counters.clear()
    st = _run_rows(_compiled(p, k), [200, 300, 100, 150])  # buckets 256, 512, 128, 256
    assert counters["stats"]["unique_graphs"] == 1  # one compile for every shape
    assert st["graphs_not_measured"] == 0
    assert timed == [["substituted", "inductor"]] * 3
    assert calls(st, "fast_chain") == 4  # the kernel won every bucket: each call ran it


def test_a_bucket_inductors_graph_won_runs_inductors_code(folders, monkeypatch):
    from pdlkit.matcher import graph_guard

    p, k = folders(FAST)
    monkeypatch.setattr(graph_guard, "faster", lambda timings: graph_guard.INDUCTOR)
    st = _run_rows(_compiled(p, k), [200, 300, 150])
    assert st["buckets_to_inductor"] == 2
    assert calls(st, "fast_chain") == 0  # the timing's calls are not the model's


def test_a_second_process_reads_each_buckets_verdict_from_the_cache(folders, monkeypatch):
    from pdlkit.matcher import graph_guard

    p, k = folders(FAST)
    _run_rows(_compiled(p, k), [200, 300])
    timed = []
    choose = graph_guard.choose

    def recording(key, *args, **kw):
        verdict, fn, decision = choose(key, *args, **kw)
        timed.append(decision.choice)
        return verdict, fn, decision

    monkeypatch.setattr(graph_guard, "choose", recording)
    monkeypatch.setattr(graph_guard, "_measure", lambda *a, **kw: pytest.fail("timed again"))
    st = _run_rows(_compiled(p, k), [200, 300])
    assert timed == ["substituted", "substituted"] and calls(st, "fast_chain") == 2


def test_a_dynamic_graph_that_writes_its_input_writes_the_callers_tensor_once(folders, timed):
    p, k = folders(FAST)

    class WritingChain(torch.nn.Module):
        def forward(self, a, b, c, cache):
            cache.add_(1)
            return (a @ b) @ c

    pdlkit.stats(reset=True)
    torch._dynamo.reset()
    fast = pdlkit.optimize(WritingChain(), patterns=p, kernels=k, autotune="cached", dynamic=True)
    with torch.no_grad():
        for n in (200, 100):
            cache = torch.zeros(n)
            fast(*_inputs(n), cache)
            assert torch.equal(cache, torch.ones(n))
    assert len(timed) == 2


def test_the_bucket_of_a_dynamic_dim_and_of_a_symbolic_int():
    from pdlkit.matcher import graph_buckets

    dims = ((0, None), (1, 0))
    assert graph_buckets.buckets([5, torch.empty(200, 3)], dims) == (8, 256)


def _intercepts(monkeypatch, folders, traced: bool) -> list[str]:
    """The intercepts (type names) of the chain's call sites, compiled with dynamic shapes,
    the chain's kernel taken for one that Inductor launches (``traced``) or not."""
    from pdlkit.runtime_abi import triton_binding

    from pdlkit.optimized import session_of

    monkeypatch.setattr(triton_binding, "traced", lambda decl: traced)
    p, k = folders(FAST)
    fast = _compiled(p, k)
    _run_rows(fast, [200, 100])
    return [type(cs.intercept).__name__ for cs in session_of(fast).sites()]


def test_a_kernel_inductor_launches_takes_no_per_bucket_site_choice(folders, monkeypatch):
    """In a graph checked whole per bucket, the site of a kernel Inductor launches is not
    intercepted per call (that would make it an opaque call through pdlkit's runner): the
    graph's verdict per bucket decides between it and Inductor's code."""
    assert _intercepts(monkeypatch, folders, traced=True) == ["NoneType"]


def test_a_kernel_pdlkit_runs_keeps_its_per_bucket_site_choice(folders, monkeypatch):
    assert _intercepts(monkeypatch, folders, traced=False) == ["BucketChoice"]


def test_a_traced_kernels_choice_by_size_hint_adds_no_guard():
    """A traced kernel body that picks tiles or a kernel path by M reads M's hint (as
    Inductor's templates do): a comparison of the symbol itself is a guard, and each guard a
    recompilation of the model's frame as M crosses it."""
    from pdlkit.runtime_abi.triton_binding import size_hint
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

    env = ShapeEnv()
    m = env.create_symintnode(
        env.create_symbol(300, ConstantSource("m"), DimDynamic.DYNAMIC), hint=300
    )
    assert size_hint(m) == 300 and size_hint(7) == 7
    assert not env.guards
    assert not bool(m <= 64)  # the symbol compared: a guard
    assert len(env.guards) == 1


def test_a_llama_with_dynamic_shapes_is_checked_per_bucket_without_recompiling(
    tmp_path, monkeypatch, timed
):
    """A tiny transformers Llama compiled with ``dynamic=True`` and called at two batch and
    sequence sizes: correct each time, a whole-graph verdict for each bucket, and no more
    Dynamo graphs than Inductor alone compiles."""
    from pdlkit.matcher import graph_guard
    from test_dynamic_floats import _tiny_llama
    from torch._dynamo.utils import counters

    from pdlkit import whole_graph

    monkeypatch.setenv("PDLKIT_CACHE_DIR", str(tmp_path))
    # a kernel at every site (at these sizes each site's subgraph measures faster, and
    # nothing would be substituted to check)
    monkeypatch.setattr(whole_graph, "known", lambda key, opts: graph_guard.KERNELS)
    model = _tiny_llama()
    shapes = [(2, 5), (3, 9)]
    graphs = {}
    for backend in ("inductor", "pdlkit"):
        torch._dynamo.reset()
        counters.clear()
        pdlkit.stats(reset=True)
        if backend == "pdlkit":
            fn = pdlkit.optimize(model, autotune="cached", dynamic=True)
        else:
            fn = torch.compile(model, dynamic=True)
        with torch.no_grad():
            for b, s in shapes:
                ids = torch.randint(0, 64, (b, s), generator=torch.Generator().manual_seed(s))
                want = model(ids, use_cache=False).last_hidden_state
                got = fn(ids, use_cache=False).last_hidden_state
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        graphs[backend] = counters["stats"]["unique_graphs"]
    assert pdlkit.stats()["substitutions"] > 0
    assert graphs["pdlkit"] == graphs["inductor"]
    assert len(timed) == 2  # buckets (2, 8) and (4, 16)


def _explained(fast, rows: int) -> str:
    return pdlkit.explain(fast, *_inputs(rows)).graphs[0].whole_graph


def test_explain_of_a_dynamic_model_shows_the_verdict_of_the_inputs_bucket(folders):
    """explain traces with the ``dynamic`` optimize was given: it reads the verdict of the
    example's shape bucket, and says where that bucket was not timed yet."""
    p, k = folders(FAST)
    fast = _compiled(p, k)
    _run_rows(fast, [200])  # bucket 256 timed
    assert _explained(fast, 220).startswith("cached verdict:")
    assert _explained(fast, 220).endswith("-> substituted")
    assert _explained(fast, 300).startswith("not timed yet")  # bucket 512

"""The whole-graph check on graphs that write in place (a KV cache, a module constant, a
mask): timed on copies, or not run again, and explain says which (matcher/graph_writes.py)."""

from __future__ import annotations

import json
import re

import torch
from autotune_chain import FAST, SLOW, inputs, run

import pdlkit


def test_a_graph_that_writes_a_module_constant_is_not_run_again_to_time_it():
    from pdlkit.matcher import graph_guard

    g = torch.fx.Graph()
    x, seen = g.placeholder("x"), g.get_attr("seen")
    g.call_method("add_", (seen, 1))  # a write the module keeps, whatever is copied
    g.output(g.call_function(torch.mul, (x, 2)))
    root = torch.nn.Module()
    root.register_buffer("seen", torch.zeros(2))
    gm = torch.fx.GraphModule(root, g)
    assert graph_guard.untimeable(gm, [torch.randn(2)]) == "node add_ (add_) may write in place"
    assert graph_guard.timeable(torch.fx.symbolic_trace(lambda x: x * 2), [torch.randn(2)])


def test_a_graph_that_writes_its_input_is_timed_on_a_copy_of_it():
    from pdlkit.matcher import graph_guard, graph_writes

    def f(x, cache):
        cache.narrow(0, 0, 1).copy_(x[:1])  # as a decode step writes its KV cache: a view
        cache.add_(1)
        return x * 2

    gm = torch.fx.symbolic_trace(f)
    args = [torch.randn(2), torch.zeros(3)]
    assert graph_guard.timeable(gm, args)
    assert graph_writes.written_inputs(gm) == [1]
    scratch = graph_writes.scratch_inputs(args, [1])
    assert scratch[0] is args[0] and scratch[1] is not args[1]
    gm(*scratch)
    assert torch.equal(args[1], torch.zeros(3))  # the caller's cache as it was
    # captured in CUDA graphs, a static cache keeps its address: no copy, no timing
    assert "under CUDA graphs" in graph_guard.untimeable(gm, args, captured=True)
    assert graph_guard.timeable(torch.fx.symbolic_trace(lambda x: x * 2), args[:1], True)


def test_a_graph_that_writes_a_tensor_subclass_input_is_not_run_again():
    # a copy would be a plain tensor (a DTensor's shards would not be copied as one)
    from pdlkit.matcher import graph_guard

    class Sub(torch.Tensor):
        pass

    gm = torch.fx.symbolic_trace(lambda x, cache: cache.add_(1) + x)
    args = [torch.randn(2), torch.zeros(2).as_subclass(Sub)]
    assert graph_guard.untimeable(gm, args) == (
        "input cache is written in place and is not a plain tensor"
    )


def test_a_decode_like_graph_is_measured_whole_and_writes_the_callers_cache_once(folders):
    """The whole-graph check runs the graphs several times on a copy of the cache they
    write; the caller's cache is written by its own call alone."""
    p, k = folders(FAST)

    class WritingChain(torch.nn.Module):
        def forward(self, a, b, c, cache):
            cache.add_(1)
            return (a @ b) @ c

    cache = torch.zeros(2)
    pdlkit.stats(reset=True)
    torch._dynamo.reset()
    with torch.no_grad():
        fast = pdlkit.optimize(WritingChain(), patterns=p, kernels=k, autotune="cached")
        fast(*inputs(), cache)
    assert torch.equal(cache, torch.ones(2))
    assert pdlkit.stats().get("graphs_not_measured", 0) == 0
    entries = json.loads(next((p.parent / "cache").glob("**/host-*.json")).read_text())
    timed = [[t[0] for t in d["timings"]] for d in entries["decisions"].values()]
    assert any("substituted" in names for names in timed)  # the whole graph's verdict


def _masks_graph(op: str, target) -> tuple[torch.fx.GraphModule, list[torch.Tensor]]:
    """A graph of one ``op`` node (``call_function`` / ``call_method``) over two masks."""
    g = torch.fx.Graph()
    a, b = g.placeholder("a"), g.placeholder("b")
    g.output(g.create_node(op, target, (a, b)))
    masks = [torch.ones(2, dtype=torch.bool), torch.zeros(2, dtype=torch.bool)]
    return torch.fx.GraphModule(torch.nn.Module(), g), masks


def test_masks_combined_with_and_are_not_written_and_with_iand_are():
    """``operator.and_`` (``a & b``, as transformers' GPT-2 and Llama build their attention
    masks) returns a new value, though its name ends with "_"; ``operator.iand`` writes ``a``
    (which the whole-graph check then copies)."""
    import operator

    from pdlkit.matcher import graph_writes

    assert graph_writes.written_inputs(_masks_graph("call_function", operator.and_)[0]) == []
    assert graph_writes.written_inputs(_masks_graph("call_function", operator.or_)[0]) == []
    assert graph_writes.written_inputs(_masks_graph("call_function", operator.iand)[0]) == [0]


def test_a_special_method_that_compares_is_not_a_write_and_iand_is():
    """``call_method __eq__`` (transformers 5.17's GPT-2 and Llama masks under Dynamo on torch
    2.11) returns a new value, though its name ends with "_"; ``__iand__`` writes."""
    from pdlkit.matcher import graph_writes

    for method in ("__eq__", "__and__", "__getitem__"):
        assert graph_writes.written_inputs(_masks_graph("call_method", method)[0]) == [], method
    for method in ("__iand__", "__setitem__", "add_"):
        assert graph_writes.written_inputs(_masks_graph("call_method", method)[0]) == [0], method


def test_explain_says_why_a_graph_that_writes_in_place_is_not_measured_whole(folders):
    """A graph the whole-graph check cannot run again unseen keeps its sites' choices; explain
    says why (transformers 5.17's masks on torch 2.11 went unchecked for weeks, seen only as a
    missing verdict). Here the written input shares memory with another: copies of each
    would not share it."""
    p, k = folders(FAST)

    class WritingChain(torch.nn.Module):
        def forward(self, a, b, c, head, tail):
            head.add_(1)
            return (a @ b) @ c + tail.sum()

    def views():
        buf = torch.zeros(4)
        return buf[:2], buf[2:]

    report = pdlkit.explain(
        WritingChain(), *inputs(), *views(), patterns=p, kernels=k, autotune="cached"
    )
    (graph,) = report.graphs
    assert [s.kernel for s in graph.substitutions] == ["fast_chain"]
    assert re.fullmatch(
        r"not measured: input \w+ is written in place and shares memory with another",
        graph.whole_graph,
    )
    assert f"whole graph: {graph.whole_graph}" in str(report)
    pdlkit.stats(reset=True)
    torch._dynamo.reset()
    with torch.no_grad():  # compiled, the graph is counted: stats() shows it too
        fast = pdlkit.optimize(WritingChain(), patterns=p, kernels=k, autotune="cached")
        fast(*inputs(), *views())
    assert pdlkit.stats()["graphs_not_measured"] == 1


def test_parameters_that_require_grad_under_no_grad_do_not_stop_the_whole_graph_check():
    """Dynamo lifts a module's parameters to graph inputs (torch 2.13), and they require grad;
    under no_grad the graph is an inference graph all the same, and is timed. With grad mode
    on it is a training graph, and is not."""
    from pdlkit.matcher import graph_guard

    gm = torch.fx.symbolic_trace(lambda x, w: x @ w)
    args = [torch.randn(2, 2), torch.nn.Parameter(torch.randn(2, 2))]
    with torch.no_grad():
        assert graph_guard.timeable(gm, args)
    assert not graph_guard.timeable(gm, args)


def test_a_graph_where_every_site_kept_its_subgraph_is_not_matched_again(folders):
    """Nothing substituted (the only kernel measured slower): the next compilation of the
    graph (a new process, the decision cache warm) is Inductor's alone, with no re-trace,
    matching or tuning."""
    p, k = folders(SLOW)
    first = run(p, k, "cached")
    assert first["substitutions"] == 0 and first["tuning_misses"] == 1
    second = run(p, k, "cached")
    assert second["graphs_left_to_inductor"] == 1
    assert second["tuning_hits"] == 0 and second["tuning_misses"] == 0

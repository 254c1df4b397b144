"""The re-trace, reused: a second compilation of the same Dynamo graph copies the first trace."""

from __future__ import annotations

import pytest
import torch
from conftest import MLP, compile_static, counted_calls

from pdlkit import retrace, trace_store


@pytest.fixture
def traces(monkeypatch, tmp_path):
    """Counts the traces pdlkit makes (the cache starts empty, in memory and on disk)."""
    monkeypatch.setenv("PDLKIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(retrace, "_TRACED", type(retrace._TRACED)())
    return counted_calls(monkeypatch, retrace, "_trace")


def _compile_and_check(model: torch.nn.Module, x: torch.Tensor) -> int:
    return int(compile_static(model, x)["substitutions"])


def test_second_compilation_reuses_the_trace_with_the_same_substitutions(traces):
    torch.manual_seed(0)
    model, x = MLP().eval(), torch.randn(4, 16)
    first = _compile_and_check(model, x)
    assert len(traces) == 1 and first == 2
    assert _compile_and_check(model, x) == first
    assert len(traces) == 1  # the second compilation copied the first trace


def test_new_shapes_or_another_graph_trace_again(traces):
    torch.manual_seed(0)
    model = MLP().eval()
    _compile_and_check(model, torch.randn(4, 16))
    _compile_and_check(model, torch.randn(6, 16))  # other input shapes
    _compile_and_check(MLP(h=48).eval(), torch.randn(4, 16))  # other weight shapes
    assert len(traces) == 3


def test_each_compilation_gets_a_graph_of_its_own(traces):
    """The passes after the re-trace edit its graph in place: the cached one never changes,
    and each copy's values are in its compilation's fake mode."""
    torch.manual_seed(0)
    model, x = MLP().eval(), torch.randn(4, 16)
    got = []

    def backend(gm, example_inputs):
        got.append(retrace.retrace(gm, example_inputs))
        return gm.forward

    for _ in range(2):
        torch._dynamo.reset()
        with torch.no_grad():
            torch.compile(model, backend=backend)(x)
    a, b = got
    assert a is not b and a.graph is not b.graph and len(traces) == 1
    assert a.code == b.code
    first = next(n for n in a.graph.nodes if n.op == "call_function")
    first.meta["mark"] = True
    a.graph.erase_node(next(n for n in reversed(a.graph.nodes) if n.op == "output"))
    (cached,) = (g for _, g, _ in retrace._TRACED.values())
    assert all("mark" not in n.meta for n in cached.graph.nodes)
    assert any(n.op == "output" for n in cached.graph.nodes)
    modes = {
        id(n.meta["val"].fake_mode)
        for n in b.graph.nodes
        if isinstance(n.meta.get("val"), torch.Tensor)
    }
    assert len(modes) == 1


def _storage_groups(gm: torch.fx.GraphModule) -> list[int]:
    """Per tensor value, in node order, the index of the first value sharing its storage."""
    from torch.utils._pytree import tree_leaves

    vals = [
        t
        for n in gm.graph.nodes
        for t in tree_leaves(n.meta.get("val"))
        if isinstance(t, torch.Tensor)
    ]
    keys = [t.untyped_storage()._cdata for t in vals]
    return [keys.index(k) for k in keys]


@pytest.mark.parametrize("grad", [False, True])
def test_values_made_again_in_this_mode_keep_their_layout_and_aliasing(grad):
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x):
        y = x.t()  # a view of x
        return y.reshape(-1)[1:] * 2 + x.view(-1)[1:], y.contiguous()

    cached = make_fx(f, tracing_mode="fake")(torch.randn(4, 4))
    if grad:  # a value that needs a gradient (make_fx's values here need none)
        x = next(iter(cached.graph.nodes))
        x.meta["val"] = x.meta["val"].fake_mode.from_tensor(torch.randn(4, 4, requires_grad=True))
    vals = [n.meta["val"] for n in cached.graph.nodes if "val" in n.meta]
    assert all(map(trace_store.plain_value, vals)) is not grad  # needing grad: from_tensor
    mode = FakeTensorMode()
    copy = retrace._in_this_compilation(retrace._copy(cached), [mode.from_tensor(torch.ones(1))])
    pairs = [
        (a.meta["val"], b.meta["val"])
        for a, b in zip(cached.graph.nodes, copy.graph.nodes, strict=True)
        if isinstance(a.meta.get("val"), torch.Tensor)
    ]
    assert len(pairs) >= 5
    for old, new in pairs:
        assert new.fake_mode is mode and old.fake_mode is not mode
        assert (new.shape, new.stride(), new.storage_offset(), new.dtype, new.device) == (
            old.shape,
            old.stride(),
            old.storage_offset(),
            old.dtype,
            old.device,
        )
        assert new.requires_grad == old.requires_grad
    assert _storage_groups(copy) == _storage_groups(cached)
    assert len(set(_storage_groups(copy))) < len(pairs)  # the views share a storage


def _dynamo_graphs(model: torch.nn.Module, x: torch.Tensor, n: int) -> list[tuple]:
    """Dynamo's graph and inputs, ``n`` separate compilations of ``model``."""
    got = []

    def backend(gm, example_inputs):
        got.append((gm, example_inputs))
        return gm.forward

    for _ in range(n):
        torch._dynamo.reset()
        with torch.no_grad():
            torch.compile(model, backend=backend)(x)
    return got


def test_a_reused_trace_is_reused_prepared_keyed_by_the_pass(traces):
    """retrace_prepared runs its pass once per trace; another pass (by name) or plain
    retrace (explain's text before canonicalization) is another entry, never the prepared
    graph; each caller gets a result of its own."""
    torch.manual_seed(0)
    model, x = MLP().eval(), torch.randn(4, 16)
    runs = []

    def prepare(gm):
        runs.append(gm)
        next(iter(gm.graph.nodes)).meta["prepared"] = True
        return {"ran": 1}

    def other(gm):
        runs.append(gm)
        return {"other": 1}

    (gm1, in1), (gm2, in2), (gm3, in3), (gm4, in4) = _dynamo_graphs(model, x, 4)
    a, ra = retrace.retrace_prepared(gm1, in1, prepare)
    b, rb = retrace.retrace_prepared(gm2, in2, prepare)
    assert len(traces) == 1 and len(runs) == 1 and ra == rb == {"ran": 1} and ra is not rb
    assert a.code == b.code and a.graph is not b.graph
    assert next(iter(b.graph.nodes)).meta.get("prepared")
    _, rc = retrace.retrace_prepared(gm3, in3, other)
    assert rc == {"other": 1} and len(traces) == 2 and len(runs) == 2
    plain = retrace.retrace(gm4, in4)
    assert len(traces) == 3
    assert all("prepared" not in n.meta for n in plain.graph.nodes)


def test_a_copy_generates_its_code_when_read():
    """The copy a pass edits is lazy: its code follows the graph as it is when read."""
    from torch.fx.experimental.proxy_tensor import make_fx

    cached = make_fx(lambda x: (x + 1).relu(), tracing_mode="fake")(torch.randn(4))
    copy = retrace._copy(cached)
    relu = next(n for n in copy.graph.nodes if n.target is torch.ops.aten.relu.default)
    with copy.graph.inserting_after(relu):
        neg = copy.graph.call_function(torch.ops.aten.neg.default, (relu,))
    relu.replace_all_uses_with(neg, delete_user_cb=lambda u: u is not neg)
    copy.recompile()
    assert "neg" in copy.code and "neg" not in cached.code
    torch.testing.assert_close(copy(torch.ones(4)), -torch.full((4,), 2.0))

"""The prepared re-trace kept on disk (pdlkit/trace_store.py): a new process reads it back."""

from __future__ import annotations

import json
import math
from collections import Counter

import pytest
import torch
from conftest import MLP, compile_static, counted_calls

from pdlkit import kept_json, retrace, trace_store
from pdlkit.backend import prepare


@pytest.fixture
def new_process(monkeypatch, tmp_path):
    """A cache folder of this test's own; ``new_process()`` forgets what this process keeps
    in memory (as a restart would) and counts the traces made from then on."""
    monkeypatch.setenv("PDLKIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(retrace, "_TRACED", type(retrace._TRACED)())
    calls = counted_calls(monkeypatch, retrace, "_trace")

    def restart() -> list[object]:
        retrace._TRACED.clear()
        calls.clear()
        return calls

    return restart


def _kept_files(tmp_path) -> list:
    return sorted((tmp_path / "autotune" / "traces").glob("*.json"))


def test_a_new_process_reads_the_trace_instead_of_tracing(new_process, tmp_path):
    torch.manual_seed(0)
    model, x = MLP().eval(), torch.randn(4, 16)
    first = compile_static(model, x)
    assert len(_kept_files(tmp_path)) == 1 and first["traces_from_disk"] == 0
    traces = new_process()
    second = compile_static(model, x)
    assert traces == []  # nothing traced: the kept graph was read
    assert second["traces_from_disk"] == 1
    assert second["substitutions"] == first["substitutions"] == 2


def _dynamo_graph(model: torch.nn.Module, x: torch.Tensor) -> tuple:
    got = []

    def backend(gm, example_inputs):
        got.append((gm, example_inputs))
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=backend)(x)
    return got[0]


class _Viewing(torch.nn.Module):
    """Views of one value (aliasing to keep), GPT-2's tanh GELU spelled out (canonicalized,
    with a note holding numbers) and a dtype argument."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x.t().reshape(-1)[1:] * 2
        h = x @ x
        g = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h.pow(3.0))))
        return y.to(torch.float64), g


def test_the_kept_graph_is_the_traced_one(new_process, tmp_path):
    """Same code, values (shape, stride, offset, dtype, aliasing), source lines, notes and
    prepare result; values in the fake mode of the compilation that reads it."""
    gm, inputs = _dynamo_graph(_Viewing(), torch.randn(8, 8))
    traced = retrace._trace(gm, inputs)
    result = prepare(traced)
    key = trace_store.store_key("a graph")
    assert trace_store.save(key, traced, result)
    out = next(n for n in gm.graph.nodes if n.op == "output")
    outputs = [a.meta["example_value"] for a in out.args[0]]
    mode = torch._subclasses.fake_tensor.FakeTensorMode()
    kept, kept_result = trace_store.load(key, mode, outputs)
    assert kept.code == traced.code and kept_result == result and isinstance(kept_result, Counter)
    storages: dict[tuple, set] = {}
    for a, b in zip(traced.graph.nodes, kept.graph.nodes, strict=True):
        assert (a.op, a.name, a.target) == (b.op, b.name, b.target)
        for k in ("stack_trace", "pdlkit_canonical", "original_aten"):
            assert repr(a.meta.get(k)) == repr(b.meta.get(k))  # (overloads: by name)
        va, vb = a.meta.get("val"), b.meta.get("val")
        if isinstance(va, torch.Tensor):
            assert vb.fake_mode is mode and ("tensor_meta" in a.meta) == ("tensor_meta" in b.meta)
            layout = (va.shape, va.stride(), va.storage_offset(), va.dtype, va.device)
            assert layout == (vb.shape, vb.stride(), vb.storage_offset(), vb.dtype, vb.device)
            pair = (va.untyped_storage()._cdata, vb.untyped_storage()._cdata)
            storages.setdefault(pair[0], set()).add(pair[1])
    assert all(len(v) == 1 for v in storages.values())  # one storage each side per group
    assert len(storages) < sum(1 for n in traced.graph.nodes if "val" in n.meta)  # views alias
    assert any("pdlkit_canonical" in n.meta for n in kept.graph.nodes)


@pytest.mark.parametrize("damage", ["truncated", "not a table"])
def test_a_corrupted_kept_trace_is_ignored_with_one_warning_and_written_again(
    new_process, tmp_path, damage
):
    torch.manual_seed(0)
    model, x = MLP().eval(), torch.randn(4, 16)
    compile_static(model, x)
    (path,) = _kept_files(tmp_path)
    path.write_text(path.read_text()[:-40] if damage == "truncated" else "[1, 2]")
    traces = new_process()
    with pytest.warns(UserWarning, match=f"ignoring the kept trace {path}"):
        stats = compile_static(model, x)
    assert len(traces) == 1 and stats["traces_from_disk"] == 0
    assert json.loads(path.read_text())["format"] == trace_store.FORMAT  # written again
    new_process()
    assert compile_static(model, x)["traces_from_disk"] == 1


def test_a_kept_trace_whose_outputs_are_not_dynamos_is_not_used(new_process, tmp_path):
    """A file well formed but wrong (its checksum made again to match): its output values
    are checked against Dynamo's, and the graph is traced again."""
    torch.manual_seed(0)
    model, x = MLP().eval(), torch.randn(4, 16)
    compile_static(model, x)
    (path,) = _kept_files(tmp_path)
    data = json.loads(path.read_text())
    body = {k: v for k, v in data.items() if k != "sha256"}
    out = next(n for n in body["nodes"] if n["op"] == "output")
    last = next(n for n in body["nodes"] if n["name"] == out["args"]["t"][0]["t"][0]["n"])
    last["meta"]["val"]["T"][0][0] += 1  # one more row than Dynamo's output
    path.write_text(json.dumps({**body, "sha256": kept_json._checksum(body)}))
    traces = new_process()
    with pytest.warns(UserWarning, match="its outputs are not Dynamo's"):
        stats = compile_static(model, x)
    assert len(traces) == 1 and stats["traces_from_disk"] == 0


def test_a_graph_with_a_part_that_has_no_plain_form_is_not_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("PDLKIT_CACHE_DIR", str(tmp_path))
    gm, inputs = _dynamo_graph(MLP().eval(), torch.randn(4, 16))
    traced = retrace._trace(gm, inputs)
    node = next(n for n in traced.graph.nodes if n.op == "call_function")
    node.meta["seq_nr"] = object()  # no plain form
    assert not trace_store.save(trace_store.store_key("x"), traced, prepare(traced))
    assert _kept_files(tmp_path) == []


def test_at_most_max_files_are_kept_the_oldest_going_first(tmp_path, monkeypatch):
    monkeypatch.setenv("PDLKIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(trace_store.FILES, "max_files", 2)
    gm, inputs = _dynamo_graph(MLP().eval(), torch.randn(4, 16))
    traced = retrace._trace(gm, inputs)
    result = prepare(traced)
    for name in ("a", "b", "c"):
        assert trace_store.save(trace_store.store_key(name), traced, result)
    kept = {p.stem for p in _kept_files(tmp_path)}
    assert kept == {trace_store.store_key("b"), trace_store.store_key("c")}


def test_a_kept_trace_anyone_may_write_is_not_read(new_process, tmp_path):
    torch.manual_seed(0)
    model, x = MLP().eval(), torch.randn(4, 16)
    compile_static(model, x)
    (path,) = _kept_files(tmp_path)
    path.chmod(0o666)
    traces = new_process()
    with pytest.warns(UserWarning, match="world-writable"):
        stats = compile_static(model, x)
    assert len(traces) == 1 and stats["traces_from_disk"] == 0


def test_a_frozen_graph_is_kept_without_its_weights_and_reads_the_new_models(new_process, tmp_path):
    """Under Inductor's freezing the weights are attributes of Dynamo's graph: the kept trace
    names them, and a later compilation of another model of the same shapes reads that
    model's weights (its output is checked against that model's own)."""
    torch.manual_seed(0)
    x = torch.randn(4, 16)
    with torch._inductor.config.patch(freezing=True):
        first = compile_static(MLP().eval(), x)
        (path,) = _kept_files(tmp_path)
        assert json.loads(path.read_text())["attrs"]  # the weights, by Dynamo's names
        traces = new_process()
        other = MLP().eval()  # new random weights
        second = compile_static(other, x)
    assert traces == [] and second["traces_from_disk"] == 1
    assert second["substitutions"] == first["substitutions"] == 2

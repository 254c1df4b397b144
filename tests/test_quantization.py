"""pdlkit.quantization: quantize() for each scheme, on an MLP and a tiny random BERT."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch
from conftest import tiny_bert
from pdlkit.quantization import SCHEMES, cosine_similarity, max_abs_error, quantize

import pdlkit

needs_torchao = pytest.mark.skipif(
    importlib.util.find_spec("torchao") is None,
    reason="torchao is not installed (pip install -e '.[quant]'); the int8 schemes need it",
)
INT8 = ["int8-static", "int8-dynamic"]


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


@pytest.fixture(scope="module")
def mlp() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return MLP().eval(), torch.randn(8, 16)


@pytest.fixture(scope="module")
def bert() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    # initializer_range larger than BERT's 0.02, so that the GEMMs (and their quantization
    # error) move the residual stream visibly instead of vanishing under the embeddings.
    return tiny_bert(initializer_range=0.2), torch.randint(0, 100, (2, 16))


def _hidden(out: object) -> torch.Tensor:
    return out if isinstance(out, torch.Tensor) else out.last_hidden_state  # type: ignore[attr-defined]


@needs_torchao
@pytest.mark.parametrize("scheme", INT8)
def test_int8_mlp_close_to_fp32(mlp, scheme):
    model, x = mlp
    weight = model.fc1.weight.clone()
    q = quantize(model, (x,), scheme=scheme)
    with torch.no_grad():
        ref, out = model(x), q(x)
    assert cosine_similarity(ref, out) >= 0.99
    assert 0 < max_abs_error(ref, out) < 0.1  # quantized (not the FP32 graph), and close
    assert not model.training and torch.equal(model.fc1.weight, weight)  # input untouched
    assert q.eval() is q  # eval() is a no-op on the (already eval-mode) result
    with pytest.raises(NotImplementedError, match="inference"):
        q.train()


@needs_torchao
@pytest.mark.parametrize("scheme", INT8)
def test_int8_bert_last_hidden_state(bert, scheme):
    model, ids = bert
    q = quantize(model, (ids,), scheme=scheme)
    with torch.no_grad():
        ref, out = _hidden(model(ids)), _hidden(q(ids))
    assert cosine_similarity(ref, out) >= 0.99
    assert max_abs_error(ref, out) > 0


@pytest.mark.parametrize("which", ["mlp", "bert"])
def test_bf16(request, which):
    model, x = request.getfixturevalue(which)
    b = quantize(model, (x,), scheme="bf16")
    assert b is not model and next(model.parameters()).dtype == torch.float32
    assert all(p.dtype == torch.bfloat16 for p in b.parameters())
    with torch.no_grad():
        ref = _hidden(model(x))
        out = _hidden(b(x.to(torch.bfloat16) if x.is_floating_point() else x))
    assert out.dtype == torch.bfloat16
    assert cosine_similarity(ref, out.float()) >= 0.999
    torch.testing.assert_close(out.float(), ref, rtol=0.05, atol=0.05)


@needs_torchao
def test_static_graph_and_calibration(mlp):
    model, x = mlp
    q = quantize(model, (x,))
    text = str(q.graph)
    assert "quantized_decomposed.quantize_per_tensor" in text
    assert "quantized_decomposed.dequantize_per_tensor" in text
    assert "quantized_decomposed.dequantize_per_channel" in text

    def input_scale(m: torch.nn.Module) -> float:
        node = next(n for n in m.graph.nodes if "quantize_per_tensor" in str(n.target))  # type: ignore[union-attr]
        return float(node.args[1])

    # Calibration data 10x wider than the example input gives a ~10x wider input scale.
    wide = quantize(model, (x,), calibration=[(10 * x,), (10 * x[:8],)])
    assert input_scale(wide) == pytest.approx(10 * input_scale(q), rel=0.05)


@needs_torchao
def test_dynamic_graph_chooses_qparams(mlp):
    model, x = mlp
    text = str(quantize(model, (x,), scheme="int8-dynamic").graph)
    assert "quantized_decomposed.choose_qparams.tensor" in text
    assert "quantized_decomposed.dequantize_per_channel" in text


@needs_torchao
def test_explain_sees_the_quantized_graph(bert):
    model, ids = bert
    q = quantize(model, (ids,))
    report = pdlkit.explain(q, ids)
    assert len(report.graphs) >= 1 and not report.graphs[0].skipped
    assert "quantized_decomposed.dequantize_per_tensor" in report.graphs[0].graph_before


def test_unknown_scheme_names_the_schemes(mlp):
    model, x = mlp
    with pytest.raises(ValueError) as err:
        quantize(model, (x,), scheme="int4")
    assert all(s in str(err.value) for s in SCHEMES)


def test_missing_torchao_is_a_clear_error(mlp, monkeypatch):
    model, x = mlp
    # None in sys.modules makes the import fail, as with torchao not installed.
    monkeypatch.setitem(sys.modules, "torchao.quantization.pt2e.quantize_pt2e", None)
    with pytest.raises(ImportError, match=r"needs torchao \(pip install -e '\.\[quant\]'\)"):
        quantize(model, (x,), scheme="int8-static")


def test_metrics():
    a = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert cosine_similarity(a, a) == pytest.approx(1.0)
    assert cosine_similarity(a, -a) == pytest.approx(-1.0)
    assert cosine_similarity(a, 2 * a.to(torch.bfloat16)) == pytest.approx(1.0)
    assert cosine_similarity(torch.zeros(3), torch.zeros(3)) == 1.0
    assert cosine_similarity(torch.zeros(3), torch.ones(3)) == 0.0
    assert max_abs_error(a, a + torch.tensor([[0.0, 0.5], [-0.25, 0.0]])) == 0.5
    assert isinstance(max_abs_error(a, a), float)
    with pytest.raises(ValueError, match="shapes differ"):
        cosine_similarity(a, a.reshape(-1))


@pytest.mark.parametrize(
    "flags, pairs",
    [
        ({"avx2"}, True),
        ({"avx2", "avx512_vnni"}, False),
        ({"avx2", "avx_vnni"}, False),
        (set(), False),  # /proc/cpuinfo not read: not known, no warning
    ],
)
def test_int16_pairs_are_read_off_the_cpus_vnni_flags(monkeypatch, flags, pairs):
    from pdlkit.quantization import pt2e
    from pdlkit.runtime_abi import capability

    monkeypatch.setattr(capability, "cpu_flags", lambda arch: set(flags))
    monkeypatch.setattr("platform.machine", lambda: "x86_64")
    assert pt2e.int16_pairs() is pairs


def _activation_qmax(q: torch.fx.GraphModule) -> set[int]:
    ops = ("quantize_per_tensor", "choose_qparams")
    nodes = [n for n in q.graph.nodes if any(o in str(n.target) for o in ops)]
    assert nodes
    return {a for n in nodes for a in n.args if a in (127, 255)}


@needs_torchao
@pytest.mark.parametrize("scheme", INT8)
def test_reduce_range_quantizes_activations_to_7_bits(mlp, scheme):
    model, x = mlp
    q = quantize(model, (x,), scheme=scheme, reduce_range=True)
    assert _activation_qmax(q) == {127}
    torch.testing.assert_close(_hidden(q(x)), model(x), rtol=0.1, atol=0.1)


@needs_torchao
@pytest.mark.parametrize("pairs", [True, False])
def test_a_cpu_without_vnni_is_warned_and_keeps_8_bits(mlp, monkeypatch, recwarn, pairs):
    """Without VNNI oneDNN's u8 x s8 GEMM saturates pairs of 8-bit products in int16: the
    default keeps torchao's 8-bit activations and says so, naming the option."""
    from pdlkit.quantization import pt2e

    monkeypatch.setattr(pt2e, "int16_pairs", lambda: pairs)
    model, x = mlp
    q = quantize(model, (x,), scheme="int8-static")
    assert _activation_qmax(q) == {255}
    said = [str(w.message) for w in recwarn if "no VNNI" in str(w.message)]
    assert len(said) == (1 if pairs else 0)
    assert not said or "reduce_range=True" in said[0]
    recwarn.clear()
    quantize(model, (x,), scheme="int8-static", reduce_range=False)
    assert not [w for w in recwarn if "no VNNI" in str(w.message)]


@pytest.mark.parametrize(
    "qmin, qmax, ok",
    [(0, 255, True), (-128, 127, True), (0, 127, True), (-64, 63, True), (0, 256, False),
     (-129, 127, False), (-128, 128, False), (10, 5, False)],
)  # fmt: skip
def test_an_output_range_within_8_bits(qmin, qmax, ok):
    """Requantizing kernels take uint8, int8, or a part of one (7-bit codes)."""
    from pdlkit.runtime_abi.dtypes import within_8_bits

    assert within_8_bits(qmin, qmax) is ok

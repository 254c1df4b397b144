"""Models quantized with torchao's ``quantize_`` (weights as tensor subclasses, e.g.
``Int8Tensor``) on the CPU: pdlkit compiles them, computes what Inductor computes, and explain
says why no shipped pattern fired (on CUDA the int8 dynamic and weight-only configs' linears
get pdlkit's kernels: tests/test_cuda_torchao.py)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

import pdlkit
from pdlkit.distributed import subclass_weights

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torchao") is None,
    reason="torchao is not installed (pip install -e '.[quant]')",
)


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    layers = [torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 32)]
    return torch.nn.Sequential(*layers).eval()


def _quantized(config: str) -> torch.nn.Module:
    from torchao.quantization import (
        Int8DynamicActivationInt8WeightConfig,
        Int8WeightOnlyConfig,
        quantize_,
    )

    configs = {"int8-dynamic": Int8DynamicActivationInt8WeightConfig, "int8-weight-only": Int8WeightOnlyConfig}  # fmt: skip
    m = _mlp()
    quantize_(m, configs[config]())
    return m


@pytest.mark.parametrize("config", ["int8-dynamic", "int8-weight-only"])
def test_a_torchao_quantize_model_computes_what_inductor_computes(config: str) -> None:
    m = _quantized(config)
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        eager = m(x)
        torch._dynamo.reset()
        inductor = torch.compile(m)(x)
        torch._dynamo.reset()
        ours = pdlkit.optimize(m)(x)
    torch.testing.assert_close(ours, inductor, rtol=0, atol=1e-6)
    torch.testing.assert_close(ours, eager, rtol=1e-2, atol=2e-2)


@pytest.mark.parametrize(
    "config",
    [
        "Int8DynamicActivationInt8WeightConfig",
        "Int8WeightOnlyConfig",
        "IntxWeightOnlyConfig",
        "Int8DynamicActivationIntxWeightConfig",
        "Float8WeightOnlyConfig",
    ],
)
def test_a_bf16_torchao_model_nothing_matches_gets_inductors_numbers_bit_for_bit(config, tmp_path):
    # pdlkit desugars torchao's subclass graphs at the pre-dispatch level (pdlkit/distributed.py);
    # where nothing is substituted (no pattern here: an empty folder), Inductor compiles that
    # graph to torch.compile's numbers, bf16 roundings included. (With the shipped patterns
    # the Intx configs' dequantized bf16 linears are x86 bf16 kernel sites.)
    import torchao.quantization as tq

    torch.manual_seed(0)
    m = _mlp().to(torch.bfloat16)
    tq.quantize_(m, getattr(tq, config)())
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    with torch.no_grad():
        torch._dynamo.reset()
        inductor = torch.compile(m)(x)
        torch._dynamo.reset()
        ours = pdlkit.optimize(m, patterns=tmp_path)(x)
    assert torch.equal(ours, inductor)


def test_explain_says_a_torchao_models_weights_are_subclasses() -> None:
    m = _quantized("int8-dynamic")
    report = pdlkit.explain(m, torch.randn(8, 64))
    assert not report.substitutions
    text = str(report)
    assert "NO SUBSTITUTION" in text
    assert "torchao tensor subclasses (torchao." in text and "Int8Tensor x2" in text
    assert "pdlkit.quantization.quantize" in text


def test_a_model_of_plain_tensors_gets_no_subclass_note() -> None:
    assert subclass_weights(_mlp()) == []
    assert subclass_weights(lambda x: x) == []


def _compile_counting_desugars(m, x, monkeypatch) -> tuple[dict, int]:
    """(pdlkit.stats() of one fresh compilation with measured choice, how many desugaring
    traces it made)."""
    from pdlkit import distributed

    traces = []
    real = distributed.desugar
    monkeypatch.setattr(distributed, "desugar", lambda *a: traces.append(1) or real(*a))
    torch._dynamo.reset()
    pdlkit.stats(reset=True)
    with torch.no_grad():
        pdlkit.optimize(m, autotune="cached")(x)
    return pdlkit.stats(), len(traces)


def test_a_torchao_graph_left_to_inductor_is_not_desugared_again(
    tmp_path, monkeypatch, steady_host
) -> None:
    # nothing substituted on the CPU: the first compilation caches Inductor's verdict, and the
    # next one compiles Dynamo's graph as torch.compile does, without the desugaring trace
    monkeypatch.setenv("PDLKIT_CACHE_DIR", str(tmp_path))
    m, x = _quantized("int8-dynamic"), torch.randn(8, 64)
    first, first_traces = _compile_counting_desugars(m, x, monkeypatch)
    assert first_traces == 1 and first["graphs_left_to_inductor"] == 0
    second, second_traces = _compile_counting_desugars(m, x, monkeypatch)
    assert second_traces == 0 and second["graphs_left_to_inductor"] == 1
    with torch.no_grad():
        torch._dynamo.reset()
        inductor = torch.compile(m)(x)
        torch._dynamo.reset()
        ours = pdlkit.optimize(m, autotune="cached")(x)
    assert torch.equal(ours, inductor)


def test_the_verdict_of_a_torchao_graph_is_not_the_float_models(
    tmp_path, monkeypatch, steady_host
) -> None:
    # the FP32 model's Dynamo graph has the same text; its inputs are plain tensors
    monkeypatch.setenv("PDLKIT_CACHE_DIR", str(tmp_path))
    x = torch.randn(8, 64)
    _compile_counting_desugars(_mlp(), x, monkeypatch)
    stats, traces = _compile_counting_desugars(_quantized("int8-dynamic"), x, monkeypatch)
    assert traces == 1 and stats["graphs_left_to_inductor"] == 0


def _intx_bf16_layers() -> torch.nn.Module:
    import torchao.quantization as tq

    torch.manual_seed(0)
    layers = [torch.nn.Linear(128, 128), torch.nn.GELU(), torch.nn.Linear(128, 128)]
    m = torch.nn.Sequential(*layers, torch.nn.GELU(), torch.nn.Linear(128, 128))
    m = m.eval().to(torch.bfloat16)
    tq.quantize_(m, tq.IntxWeightOnlyConfig())  # bf16 weights dequantized at each call
    return m


def test_a_weight_the_graph_computes_is_not_taken_by_a_kernel_that_prepacks_it() -> None:
    # the dequantized weights of same-shaped layers share one Inductor buffer: a pre-pack kept
    # from the first layer was found for the others (0.34 off on outputs of about 0.35)
    m, x = _intx_bf16_layers(), torch.randn(64, 128).bfloat16()
    with torch.no_grad():
        torch._dynamo.reset()
        inductor = torch.compile(m)(x)
        torch._dynamo.reset()
        compiled = pdlkit.optimize(m, autotune="off")
        compiled(x)
        ours = compiled(x)
    torch.testing.assert_close(ours, inductor, rtol=0, atol=1e-2)


def test_explain_says_a_prepacking_kernel_does_not_take_a_computed_weight() -> None:
    m, x = _intx_bf16_layers(), torch.randn(64, 128).bfloat16()
    # planned for an AVX512_BF16 CPU, whose BF16 kernels pre-pack (on an AVX2-only host no
    # pre-packing kernel takes BF16, and the dtype is the reason given)
    text = str(pdlkit.explain(m, x, autotune="off", target="x86-avx512-vnni"))
    assert "pre-packs weight, which the graph computes at each call (dequantize_affine" in text
    assert "torchao.dequantize_affine.default): not a constant" in text

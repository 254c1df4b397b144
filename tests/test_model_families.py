"""Decoder families beyond Llama, as transformers builds them (tiny random configs): Qwen2
(biased Q, K, V projections, GQA) and Phi-3 (one fused QKV linear and one gate/up linear,
split after the GEMM). Their int8-dynamic graphs (PT2E) take a kernel at every GEMM, on this
host and planned for Yitian, and compute what the eager int8 model computes
(benchmarks/x86_models.py times them: results/x86_models_epyc_t1_zoo_df593a0.md)."""

from __future__ import annotations

import functools
import importlib.util

import pytest
import torch
from conftest import VNNI

import pdlkit

transformers = pytest.importorskip("transformers", reason="pip install transformers")
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torchao") is None,
    reason="torchao is not installed (pip install -e '.[quant]'); int8-dynamic needs it",
)

SIZES = dict(
    vocab_size=64, hidden_size=64, intermediate_size=96, num_attention_heads=4,
    num_key_value_heads=2, num_hidden_layers=1, max_position_embeddings=64,
)  # fmt: skip
FAMILIES = {  # name: (config, model, GEMMs per layer)
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2Model, 7),
    "phi3": (transformers.Phi3Config, transformers.Phi3Model, 4),
}


@functools.cache
def _int8_dynamic(family: str) -> tuple[torch.nn.Module, torch.Tensor, int]:
    """(the family's int8-dynamic PT2E model, its input ids, its GEMM count); built once,
    as neither explain nor optimize changes it."""
    from pdlkit.quantization import quantize

    config_cls, model_cls, gemms = FAMILIES[family]
    config = config_cls(**SIZES, pad_token_id=0, bos_token_id=1, eos_token_id=2, use_cache=False)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = model_cls(config).eval()
    ids = torch.randint(1, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return quantize(model, (ids,), scheme="int8-dynamic"), ids, gemms


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(
    "target, kernel", [("yitian", "a64_qlinear_dynamic_i8mm"), ("x86-avx512-vnni", "qlinear_dynamic_vnni")]
)  # fmt: skip
def test_every_gemm_of_the_family_takes_the_targets_int8_kernel(family, target, kernel):
    model, ids, gemms = _int8_dynamic(family)
    report = pdlkit.explain(model, ids, target=target, autotune="off")
    kernels = [s.kernel for g in report.graphs for s in g.substitutions]
    assert kernels == [kernel] * gemms


@pytest.mark.parametrize("family", FAMILIES)
def test_the_family_optimized_computes_what_the_eager_int8_model_does(family):
    model, ids, _ = _int8_dynamic(family)
    pdlkit.stats(reset=True)
    with torch.no_grad():
        want = model(ids)[0]
        got = pdlkit.optimize(model, autotune="off")(ids)[0]
    if VNNI:  # elsewhere no x86 int8 kernel runs: Inductor's code
        assert pdlkit.stats()["substitutions"] > 0
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)  # the same codes, the same sums

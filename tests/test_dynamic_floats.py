"""dynamic=True lifts a model's Python floats (an RMSNorm's epsilon, an embedding's norm_type)
to 0-d tensor inputs that the graph reads with ``.item()``: pdlkit's re-trace and Inductor's
compile of its graph must find their symbols again, as Inductor alone does."""

from __future__ import annotations

import pytest
import torch

import pdlkit


def _tiny_llama():
    transformers = pytest.importorskip("transformers", reason="pip install transformers")
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_attention_heads=4,
        num_key_value_heads=2, num_hidden_layers=1, max_position_embeddings=64,
    )  # fmt: skip
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return transformers.LlamaModel(config).eval()


def test_a_llama_compiled_with_dynamic_shapes_is_substituted_in_one_graph():
    model = _tiny_llama()
    ids = torch.randint(0, 64, (2, 5))
    pdlkit.stats(reset=True)
    with torch.no_grad():
        want = model(ids, use_cache=False).last_hidden_state
        fn = torch.compile(model, backend="pdlkit", dynamic=True, fullgraph=True)
        got = fn(ids, use_cache=False).last_hidden_state  # raised BackendCompilerFailed
    st = pdlkit.stats()
    assert st["kernel_calls"] > 0
    # the compile Dynamo restarted (AOT autograd makes the lifted floats constants) is counted
    # once: one substitution per site that ran
    assert st["substitutions"] == st["kernel_calls"]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)

"""Dynamic shapes: symbolic dims stay symbolic, substitutions survive, no extra recompiles."""

from __future__ import annotations

import pytest
import torch
from conftest import KERNEL_HEADER, linear_act_pattern, write
from pdlkit.matcher.to_mlir import import_graph, new_context

import pdlkit
from pdlkit.backend import retrace


class Counting:
    """A backend wrapper that counts compilations."""

    def __init__(self, backend):
        self.backend, self.compiles = backend, 0

    def __call__(self, gm, example_inputs):
        self.compiles += 1
        return self.backend(gm, example_inputs)


def test_marked_dynamic_dims_import_as_dynamic_torch_dims(mlp):
    model, _ = mlp
    texts = []

    def capture(gm, example_inputs):
        texts.append(str(import_graph(retrace(gm, example_inputs), new_context()).module))
        return gm.forward

    x = torch.randn(4, 6, 16)
    torch._dynamo.mark_dynamic(x, 0)
    torch._dynamo.mark_dynamic(x, 1)
    with torch.no_grad():
        torch.compile(model, backend=capture)(x)
    (text,) = texts
    assert "!torch.vtensor<[?,?,16],f32>" in text  # the input: batch and sequence symbolic
    assert "!torch.vtensor<[32,16],f32>" in text  # the weight stays static
    assert "!torch.vtensor<[?,?,32],f32>" in text  # linear's result


def test_marked_dynamic_batch_and_sequence_keep_substitutions(mlp):
    model, _ = mlp
    backend = Counting(pdlkit.PdlkitBackend(default_codegen="eager"))
    f = torch.compile(model, backend=backend)
    pdlkit.stats(reset=True)
    with torch.no_grad():
        for b, s in ((2, 3), (5, 7), (3, 11)):
            x = torch.randn(b, s, 16)
            torch._dynamo.mark_dynamic(x, 0)
            torch._dynamo.mark_dynamic(x, 1)
            torch.testing.assert_close(f(x), model(x))
    st = pdlkit.stats()
    assert backend.compiles == 1
    assert st["substitutions"] == 2 and st["kernel_calls"] == 6 and st["fallbacks"] == 0


def test_twenty_batch_sizes_recompile_no_more_than_inductor(mlp):
    from torch._inductor.compile_fx import compile_fx

    model, _ = mlp
    counts = {}
    pdlkit.stats(reset=True)
    for name, inner in (("inductor", compile_fx), ("pdlkit", pdlkit.PdlkitBackend())):
        torch._dynamo.reset()
        backend = Counting(inner)
        f = torch.compile(model, backend=backend)
        with torch.no_grad():
            for b in range(1, 21):
                x = torch.randn(b, 16)
                torch.testing.assert_close(f(x), model(x), rtol=1e-5, atol=1e-5)
        counts[name] = backend.compiles
    assert counts["pdlkit"] <= counts["inductor"], counts
    assert pdlkit.stats()["kernel_calls"] == 2 * 20  # every batch size ran both kernels


SHAPED_KERNEL = """
@pdlkit.kernel(op="lin_sigmoid", meta=meta, shapes={"x": {"divisible": {0: 4}}})
def k_lin_sigmoid4(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    assert x.shape[0] % 4 == 0
    return torch.sigmoid(torch.addmm(b, x, w.t()))
"""


@pytest.mark.parametrize("dynamic", ["mark_dynamic", "automatic"])
def test_unprovable_shape_rule_becomes_a_per_call_guard(tmp_path, mlp, dynamic):
    model, _ = mlp
    p, k = tmp_path / "p", tmp_path / "k"
    write(p, "ls.pdl.mlir", linear_act_pattern("lin_sigmoid", "sigmoid", "lin_sigmoid"))
    write(k, "k.py", KERNEL_HEADER + SHAPED_KERNEL)
    backend = Counting(pdlkit.PdlkitBackend(patterns=p, kernels=k, default_codegen="eager"))
    f = torch.compile(model, backend=backend)
    pdlkit.stats(reset=True)
    sizes = [8, 6, 12, 9, 16, 4, 10]
    with torch.no_grad():
        for b in sizes:
            x = torch.randn(b, 16)
            if dynamic == "mark_dynamic":
                torch._dynamo.mark_dynamic(x, 0)
            torch.testing.assert_close(f(x), model(x))
    st = pdlkit.stats()["by_kernel"]["k_lin_sigmoid4"]
    # automatic dynamic shapes: the first size compiles static, the second dynamic
    assert backend.compiles == (1 if dynamic == "mark_dynamic" else 2)
    static_calls = 0 if dynamic == "mark_dynamic" else 1
    dyn = sizes[static_calls:]
    assert st["kernel_calls"] == static_calls + sum(1 for b in dyn if b % 4 == 0)
    assert st["fallbacks"] == sum(1 for b in dyn if b % 4)

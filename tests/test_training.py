"""Graphs that need gradients: kernels with a backward are substituted, others are not."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import MLP, make_folders, sigmoid_kernel

import pdlkit


def _train(model: torch.nn.Module, fn, x: torch.Tensor, target: torch.Tensor, steps: int = 4):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(fn(x), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _train_both(compile_fn):
    """Four SGD steps of an MLP eagerly and of its copy through ``compile_fn(copy)``, the
    counters reset first: (eager losses, compiled losses, eager model, copy)."""
    torch.manual_seed(0)
    eager = MLP()
    mine = copy.deepcopy(eager)
    x, target = torch.randn(8, 16), torch.randn(8, 16)
    pdlkit.stats(reset=True)
    want = _train(eager, eager, x, target)
    return want, _train(mine, compile_fn(mine), x, target), eager, mine


def test_training_substitutes_kernels_with_a_backward_and_matches_eager():
    want, got, eager, compiled_model = _train_both(lambda m: torch.compile(m, backend="pdlkit"))
    st = pdlkit.stats()
    # the shipped linear_relu and linear kernels declare a backward
    assert st["by_kernel"]["linear_relu_onednn"]["substitutions"] == 1
    assert st["by_kernel"]["linear_onednn"]["substitutions"] == 1
    assert st["kernel_calls"] == 8
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for p, q in zip(compiled_model.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


@pytest.fixture
def no_backward_folders(tmp_path):
    return make_folders(tmp_path, sigmoid_kernel(decl=', dtypes={"x": [torch.float32]}'))


def test_kernel_without_backward_is_a_near_miss_in_training(no_backward_folders):
    p, k = no_backward_folders
    torch.manual_seed(0)
    model, x = MLP(), torch.randn(4, 16)
    report = pdlkit.explain(model, x, patterns=p, kernels=k, no_grad=False)
    assert report.counts() == {}
    reasons = [str(m.reason) for g in report.graphs for m in g.near_misses]
    assert any("k_lin_sigmoid: has no backward, and x needs a gradient" in r for r in reasons)
    # the same kernel is substituted for inference
    assert pdlkit.explain(model, x, patterns=p, kernels=k).counts() == {"lin_sigmoid": 1}


def test_training_graph_without_eligible_kernel_compiles_exactly_as_inductor(no_backward_folders):
    p, k = no_backward_folders
    torch.manual_seed(0)
    a = MLP()
    b = copy.deepcopy(a)
    x = torch.randn(4, 16)
    pdlkit.stats(reset=True)
    ya = pdlkit.optimize(a, patterns=p, kernels=k)(x)
    yb = torch.compile(b, backend="inductor")(x)
    ya.sum().backward()
    yb.sum().backward()
    assert pdlkit.stats()["substitutions"] == 0
    assert torch.equal(ya, yb)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert pa.grad is not None and torch.equal(pa.grad, pb.grad)


def test_user_kernel_backward_is_used_in_training(tmp_path):
    with_backward = """
def save(ctx, inputs, out):
    ctx.save_for_backward(inputs[0], inputs[1], out)

def backward(ctx, grad):
    x, w, out = ctx.saved_tensors
    g = grad * out * (1 - out)
    return g @ w, g.t() @ x, g.sum(0)
"""
    kernel = with_backward + sigmoid_kernel(decl=", backward=backward, setup_context=save")
    p, k = make_folders(tmp_path, kernel)
    want, got, _, _ = _train_both(
        lambda m: pdlkit.optimize(m, patterns=p, kernels=k, default_codegen="eager")
    )
    assert pdlkit.stats()["by_kernel"]["k_lin_sigmoid"]["kernel_calls"] == 4
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_setup_context_without_backward_is_refused():
    with pytest.raises(pdlkit.KernelDeclarationError, match="setup_context .* used with backward"):

        @pdlkit.kernel(op="x", meta=lambda a: a, setup_context=lambda ctx, i, o: None)
        def k(a: torch.Tensor) -> torch.Tensor:
            return a

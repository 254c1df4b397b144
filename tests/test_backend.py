"""End to end: torch.compile / optimize with patterns and kernels from folders."""

from __future__ import annotations

import os
import time

import pytest
import torch
from conftest import (
    KERNEL_HEADER,
    MLP,
    linear_act_pattern,
    make_folders,
    sigmoid_kernel,
    write,
)

import pdlkit

SIG_KERNEL = sigmoid_kernel(decl=', dtypes={"x": [torch.float32]}')


@pytest.fixture
def user_folders(tmp_path):
    return make_folders(tmp_path, SIG_KERNEL)


def test_shipped_patterns_fire_under_inductor(mlp):
    model, x = mlp
    pdlkit.stats(reset=True)
    with torch.no_grad():
        y = torch.compile(model, backend="pdlkit")(x)
        torch.testing.assert_close(y, model(x), rtol=1e-5, atol=1e-5)
    st = pdlkit.stats()
    assert st["substitutions"] == 2
    assert st["by_kernel"]["linear_relu_onednn"]["kernel_calls"] == 1
    assert st["by_kernel"]["linear_onednn"]["kernel_calls"] == 1


def test_explain_names_substitutions_and_silent_patterns(mlp):
    model, x = mlp
    report = pdlkit.explain(model, x)
    assert report.counts() == {"linear_relu": 1, "linear": 1}
    silent = report.silent_patterns()
    assert silent["linear_gelu"] == "root op torch.aten.gelu does not occur in the graph"
    assert (
        silent["qlinear"]
        == "op torch.quantized_decomposed.dequantize_per_channel does not occur in the graph"
    )
    assert "linear_relu" not in silent
    text = report.format(verbose=True)
    assert "linear_relu -> linear_relu_onednn" in text and "replaced relu, linear" in text
    # the pre-packed oneDNN kernel is the first choice for float32 (a BF16-only kernel that
    # ranks higher is passed over for its dtype, or on a host without AVX512_BF16 for the
    # features it lacks, and says which)
    assert "relu: passed over linear_relu_addmm" not in text
    passed = [ln for ln in text.splitlines() if "passed over linear_relu_bf16" in ln]
    assert all("takes bfloat16" in ln or "host lacks" in ln for ln in passed), passed


def test_optimize_with_user_folders_and_eager_codegen(mlp, user_folders):
    model, x = mlp
    p, k = user_folders
    with torch.no_grad():
        f = pdlkit.optimize(model, patterns=p, kernels=k, default_codegen="eager")
        torch.testing.assert_close(f(x), model(x))
    report = pdlkit.explain(model, x, patterns=p, kernels=k)
    assert report.counts() == {"lin_sigmoid": 1}


def test_folders_from_environment_only(mlp, user_folders, monkeypatch):
    model, x = mlp
    p, k = user_folders
    monkeypatch.setenv("PDLKIT_PATTERN_PATH", f"{p}{os.pathsep}@shipped")
    monkeypatch.setenv("PDLKIT_KERNEL_PATH", f"{k}{os.pathsep}@shipped")
    pdlkit.stats(reset=True)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend="pdlkit")(x), model(x))
    assert pdlkit.stats()["by_kernel"].keys() == {"k_lin_sigmoid", "linear_relu_onednn"}


def test_changed_kernel_file_takes_effect_in_next_compile(mlp, user_folders, monkeypatch):
    model, x = mlp
    p, k = user_folders
    monkeypatch.setenv("PDLKIT_PATTERN_PATH", str(p))
    monkeypatch.setenv("PDLKIT_KERNEL_PATH", str(k))
    with torch.no_grad():
        first = torch.compile(model, backend="pdlkit")(x)
        time.sleep(0.01)
        write(k, "k.py", KERNEL_HEADER + SIG_KERNEL.replace("torch.sigmoid(", "2 * torch.sigmoid("))
        second = torch.compile(model, backend="pdlkit")(x)
    torch.testing.assert_close(second, 2 * first)


def test_changed_pattern_file_takes_effect_in_next_compile(mlp, user_folders, monkeypatch):
    model, x = mlp
    p, k = user_folders
    monkeypatch.setenv("PDLKIT_PATTERN_PATH", str(p))
    monkeypatch.setenv("PDLKIT_KERNEL_PATH", str(k))
    pdlkit.stats(reset=True)
    with torch.no_grad():
        torch.compile(model, backend="pdlkit")(x)
        assert pdlkit.stats()["kernel_calls"] == 1
        time.sleep(0.01)
        write(p, "lin_sigmoid.pdl.mlir", linear_act_pattern("lin_sigmoid", "tanh", "lin_sigmoid"))
        torch.compile(model, backend="pdlkit")(x)
    assert (
        pdlkit.stats()["kernel_calls"] == 1
    )  # the new pattern matches nothing: kernel not called again


def test_dynamic_batch_keeps_substitution(mlp):
    model, _ = mlp
    pdlkit.stats(reset=True)
    with torch.no_grad():
        f = torch.compile(model, backend="pdlkit", dynamic=True)
        for n in (2, 5, 9):
            x = torch.randn(n, 16)
            torch.testing.assert_close(f(x), model(x))
    st = pdlkit.stats()
    assert st["substitutions"] == 2 and st["kernel_calls"] == 6


def test_bad_pattern_file_fails_compile_naming_the_file(tmp_path, mlp):
    model, x = mlp
    bad = write(tmp_path, "bad.pdl.mlir", "pdl.pattern @p : benefit(1) {\n  %x = pdl.operand\n}\n")
    with pytest.raises(pdlkit.PdlkitError, match=rf"{bad}:2:\d+: .*bindable user"):
        pdlkit.optimize(model, patterns=tmp_path)


def test_options_through_torch_compile(mlp, user_folders):
    model, x = mlp
    p, k = user_folders
    pdlkit.stats(reset=True)
    with torch.no_grad():
        f = torch.compile(model, backend="pdlkit", options={"patterns": p, "kernels": k})
        torch.testing.assert_close(f(x), model(x))
    assert pdlkit.stats()["by_kernel"].keys() == {"k_lin_sigmoid"}


def test_model_of_many_blocks_counts_exactly():
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[MLP() for _ in range(3)]).eval()
    x = torch.randn(4, 16)
    report = pdlkit.explain(model, x)
    assert report.counts() == {"linear_relu": 3, "linear": 3}
    with torch.no_grad():
        torch.testing.assert_close(pdlkit.optimize(model)(x), model(x))


def test_bf16_model_substitutes_and_matches_eager(mlp):
    model, x = mlp
    model = model.to(torch.bfloat16)
    x = x.to(torch.bfloat16)
    pdlkit.stats(reset=True)
    with torch.no_grad():
        y = pdlkit.optimize(model)(x)
        torch.testing.assert_close(y, model(x), rtol=1.6e-2, atol=1e-2)
    # both sites take a kernel: oneDNN's, or where it has no BF16 matmul (an AVX2-only CPU)
    # kernels/cpu/linear_widened.py's FP32 GEMMs
    assert y.dtype == torch.bfloat16 and pdlkit.stats()["kernel_calls"] == 2


def test_explain_for_a_foreign_target_runs_no_kernel(mlp):
    model, x = mlp
    pdlkit.stats(reset=True)
    report = pdlkit.explain(model, x, target="yitian")
    assert report.target.startswith("yitian (aarch64")
    assert report.counts() == {"linear_relu": 1, "linear": 1}
    assert pdlkit.stats()["kernel_calls"] == 0


def test_inductor_freezing_keeps_parameters_as_constants_and_still_substitutes(mlp):
    model, x = mlp
    pdlkit.stats(reset=True)
    with torch._inductor.config.patch(freezing=True), torch.no_grad():
        torch.testing.assert_close(pdlkit.optimize(model)(x), model(x))
    assert pdlkit.stats()["substitutions"] == 2

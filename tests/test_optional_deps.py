"""A missing optional dependency degrades with one clear message naming it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
from conftest import KERNEL_HEADER, linear_act_pattern, write

import pdlkit

NO_TORCH_MLIR = """
import json, sys, warnings
sys.modules["torch_mlir"] = None  # as if torch-mlir were not installed
import torch
sys.path.insert(0, "tests")
from conftest import MLP
import pdlkit
from pdlkit.check import check_paths
from pathlib import Path

torch.manual_seed(0)
model, x = MLP().eval(), torch.randn(4, 16)
out = {}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with torch.no_grad():
        for _ in range(2):  # two compilations, one message
            torch._dynamo.reset()
            y = pdlkit.optimize(model, default_codegen="eager")(x)
        out["equal"] = torch.equal(y, model(x))
out["warnings"] = [str(w.message) for w in caught if "pdlkit" in str(w.message)]
out["substitutions"] = pdlkit.stats()["substitutions"]
try:
    pdlkit.explain(model, x)
except pdlkit.PdlkitError as e:
    out["explain"] = str(e)
out["check"] = check_paths([Path("patterns")])[0]
print(json.dumps(out))
"""


def test_missing_torch_mlir_degrades_to_inductor_with_one_message():
    r = subprocess.run(
        [sys.executable, "-c", NO_TORCH_MLIR], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    (msg,) = out["warnings"]
    assert msg.startswith("pdlkit: pdlkit's pattern matcher needs torch-mlir, which cannot be")
    assert msg.endswith(
        ": pip install torch-mlir==20261001; compiling with Inductor alone, nothing is substituted"
    )
    assert out["equal"] and out["substitutions"] == 0
    assert "needs torch-mlir, which cannot be imported" in out["explain"]
    assert any("torch-mlir" in p and "pattern files cannot be checked" in p for p in out["check"])


@pytest.mark.parametrize(
    "module,install", [("numba", "pip install numba"), ("cupy", "pip install 'pdlkit[cuda]'")]
)
def test_kernel_file_needing_a_missing_package_is_skipped_with_one_warning(
    tmp_path, mlp, monkeypatch, module, install
):
    monkeypatch.setitem(sys.modules, module, None)  # as if it were not installed
    p, k = tmp_path / "p", tmp_path / "k"
    write(p, "ls.pdl.mlir", linear_act_pattern("lin_sigmoid", "sigmoid", "lin_sigmoid"))
    write(
        k,
        "good.py",
        KERNEL_HEADER
        + textwrap.dedent("""
        @pdlkit.kernel(op="lin_sigmoid", meta=meta)
        def k_good(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
            return torch.sigmoid(torch.addmm(b, x, w.t()))
        """),
    )
    needs = write(
        k,
        "needs.py",
        f"import {module}\n"
        + KERNEL_HEADER
        + textwrap.dedent("""
        @pdlkit.kernel(op="lin_sigmoid", meta=meta, priority=5)
        def k_needs(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
            raise AssertionError("never loaded")
        """),
    )
    model, x = mlp
    pdlkit.stats(reset=True)
    with pytest.warns(UserWarning) as caught, torch.no_grad():
        y = pdlkit.optimize(model, patterns=p, kernels=k, default_codegen="eager")(x)
    messages = [str(w.message) for w in caught if "pdlkit" in str(w.message)]
    assert messages == [
        f"pdlkit: {needs}:1: skipped: its kernels needs {module}, which is not installed: {install}"
        + (" (cupy-cuda13x)" if module == "cupy" else "")
    ]
    torch.testing.assert_close(y, model(x))
    assert pdlkit.stats()["by_kernel"]["k_good"]["kernel_calls"] == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same file version does not warn again
        pdlkit.optimize(model, patterns=p, kernels=k, default_codegen="eager")

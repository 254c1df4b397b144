"""kernels/cpu/linear_widened.py: BF16 linears as FP32 GEMMs where torch's oneDNN has no BF16
matmul (an AVX2-only CPU), whose BF16 GEMM runs a slow scalar loop."""

from __future__ import annotations

from pathlib import Path

import pdlkit.kernels
import pytest
import torch
import torch.nn.functional as F
from conftest import MLP, ONEDNN_BF16
from pdlkit.runtime_abi.registry import load_kernel_file

import pdlkit

WIDENED = Path(pdlkit.kernels.__file__).parent / "cpu" / "linear_widened.py"


def _module_globals() -> dict:
    """The kernel file's functions, on any host (its kernels are declared on some only)."""
    namespace: dict = {"__name__": "linear_widened_for_test"}
    exec(compile(WIDENED.read_text(), str(WIDENED), "exec"), namespace)  # noqa: S102
    return namespace


def test_declared_only_where_onednn_has_no_bf16_matmul():
    names = {k.name for k in load_kernel_file(WIDENED)}
    widened = {"linear_bf16_widened", "linear_relu_bf16_widened", "linear_gelu_bf16_widened"}
    assert names == (set() if ONEDNN_BF16 else widened)


@pytest.mark.parametrize("bias", [True, False])
def test_one_fp32_gemm_rounded_once(bias):
    g = _module_globals()
    torch.manual_seed(0)
    x = torch.randn(2, 5, 24).bfloat16()
    w = torch.randn(16, 24).bfloat16()
    b = torch.randn(16).bfloat16() if bias else None
    packed = g["_widen"](w, {})
    got = g["_bf16"](g["_gemm"](x, packed, b), x)
    want = F.linear(x.float(), w.float(), None if b is None else b.float()).bfloat16()
    assert packed.dtype == torch.float32 and got.shape == (2, 5, 16)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_other_dtypes_are_declined():
    g = _module_globals()
    with pytest.raises(pdlkit.KernelUnsupported, match="float32 input"):
        g["_gemm"](torch.randn(3, 4), torch.randn(2, 4), None)


@pytest.mark.skipif(
    ONEDNN_BF16, reason="oneDNN computes BF16 here: the widened kernels are not declared"
)
def test_bf16_mlp_runs_the_widened_kernels_and_matches_eager():
    torch.manual_seed(0)
    model, x = MLP().eval().to(torch.bfloat16), torch.randn(4, 16).bfloat16()
    pdlkit.stats(reset=True)
    with torch.no_grad():
        y = pdlkit.optimize(model, autotune="off")(x)
        torch.testing.assert_close(y, model(x), rtol=1.6e-2, atol=1e-2)
    by = pdlkit.stats()["by_kernel"]
    assert by["linear_relu_bf16_widened"]["kernel_calls"] == 1
    assert by["linear_bf16_widened"]["kernel_calls"] == 1

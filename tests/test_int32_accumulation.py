"""int8 GEMMs that sum u8 x s8 products in int32 (kernels/x86/qgemm_vnni.c, oneDNN through
kernels/x86/qlinear_onednn.py, kernels/aarch64/a64_gemm.c): exact up to the longest K for which
every sum_k (x - x_zp)(w - w_zp) fits in int32, declined beyond it (the reference runs), never
a wrapped sum (oneDNN's and a64's kernels take symmetric weights only). int_mm
(kernels/x86/vnni_int8_gemm.c) has torch._int_mm's int32 semantics, wrapping included.

The bound: each term is at most A B, A = max(|x_zp|, |255 - x_zp|), B = max(w_zp + 128,
127 - w_zp); K A B <= 2^31 - 1. x = 255 (or 0) with w = -128 throughout reaches it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
from conftest import VNNI
from pdlkit.runtime_abi.registry import load_kernel_file

import pdlkit

ROOT = Path(__file__).resolve().parents[1]
X86 = ROOT / "kernels" / "x86"
HAS_CC = shutil.which(os.environ.get("CC", "cc")) is not None
vnni_only = pytest.mark.skipif(
    not (VNNI and HAS_CC), reason="needs an x86-64 CPU with avx512_vnni and a C compiler"
)


def _extreme(k: int, x_zp: int, w_zp: int = 0, n: int = 16):
    """Operands whose every term is the largest A B in magnitude: x = 255 or 0 (the end farther
    from x_zp), w = -128 or 127 (farther from w_zp); the exact result in float64."""
    x = 255 if 255 - x_zp >= x_zp else 0
    w = -128 if w_zp + 128 >= 127 - w_zp else 127
    x_q = torch.full((2, k), x, dtype=torch.uint8)
    w_q = torch.full((n, k), w, dtype=torch.int8)
    ws = torch.full((n,), 1e-6)
    wz = torch.full((n,), w_zp, dtype=torch.int64)
    exact = torch.full((2, n), 1e-6 * k * (x - x_zp) * (w - w_zp), dtype=torch.float64)
    return (x_q, 1.0, x_zp, w_q, ws, wz, None, "none", ""), exact


def _call(decl, args):
    attrs = {
        p: a for p, a in zip(decl.params, args, strict=True) if not isinstance(a, torch.Tensor)
    }
    return decl.fn(*args[:3], decl.prepack(args[3], attrs), *args[4:])


@pytest.fixture(scope="module")
def qgemm():
    pytest.importorskip("torchao", reason="the qlinear kernels' meta needs torchao")
    load_kernel_file(ROOT / "kernels" / "ops" / "logical_ops.py")  # the ops, then kernels
    return {k.name: k for k in load_kernel_file(X86 / "qlinear_vnni.py")}["qlinear_vnni"]


@pytest.fixture(scope="module")
def onednn():
    load_kernel_file(ROOT / "kernels" / "ops" / "logical_ops.py")  # the ops, then kernels
    return {k.name: k for k in load_kernel_file(X86 / "qlinear_onednn.py")}["qlinear_onednn"]


@vnni_only
@pytest.mark.parametrize(("k", "x_zp"), [(65793, 0), (65793, 255), (131071, 128)])
def test_qgemm_is_exact_at_the_longest_k(qgemm, k, x_zp):
    args, exact = _extreme(k, x_zp)
    got = _call(qgemm, args).double()
    assert abs(exact[0, 0].item()) > 2147.0  # the sums reach 2^31 (times the 1e-6 scale)
    torch.testing.assert_close(got, exact, rtol=1e-6, atol=0)


@vnni_only
@pytest.mark.parametrize(("k", "x_zp"), [(65794, 0), (65794, 255), (131072, 128)])
def test_qgemm_declines_one_more(qgemm, k, x_zp):
    args, _ = _extreme(k, x_zp)
    with pytest.raises(pdlkit.KernelUnsupported, match="overflow the int32 accumulator"):
        _call(qgemm, args)


@vnni_only
def test_qgemm_with_weight_zero_points_is_exact_to_its_shorter_bound_and_declines_past_it(qgemm):
    args, exact = _extreme(33025, 0, w_zp=127)  # B = 255: K = 33025
    torch.testing.assert_close(_call(qgemm, args).double(), exact, rtol=1e-6, atol=0)
    args, _ = _extreme(33026, 0, w_zp=127)  # packed (symmetric bound), declined per call
    with pytest.raises(pdlkit.KernelUnsupported, match="too long for exact int32 sums"):
        _call(qgemm, args)


@vnni_only
def test_onednn_is_exact_at_the_longest_k_and_declines_beyond(onednn):
    args, exact = _extreme(65793, 0)
    torch.testing.assert_close(_call(onednn, args).double(), exact, rtol=1e-6, atol=0)
    args, _ = _extreme(65794, 0)
    with pytest.raises(pdlkit.KernelUnsupported, match="oneDNN's int32 sums could overflow"):
        _call(onednn, args)


@vnni_only
def test_int_mm_wraps_as_torch_int_mm_does(tmp_path):
    """torch._int_mm's int32 result of -128 * -128 * 140000 (past 2^31) wraps modulo 2^32:
    the VNNI kernel gives the same int32, its u8 shift and column-sum correction included."""
    from pdlkit.runtime_abi.native_build import build_library
    from pdlkit.runtime_abi.native_load import load_native_library

    lib = build_library(X86 / "vnni_int8_gemm.c", "x86_64", out_dir=tmp_path)
    int_mm = {k.name: k for k in load_native_library(lib)}["vnni_int8_gemm"]
    a = torch.full((3, 140000), -128, dtype=torch.int8)
    a[1] = 127
    b = torch.full((140000, 5), -128, dtype=torch.int8)
    want = torch._int_mm(a, b)
    assert want[0, 0].item() == (-128 * -128 * 140000 + 2**31) % 2**32 - 2**31
    assert torch.equal(int_mm.fn(a, b), want)


# -- AArch64, under qemu (the helpers and the session's library of tests/test_aarch64.py) --------

a64_tests = pytest.importorskip("test_aarch64")
a64 = a64_tests.a64  # the fixture: library and driver, built once per session


@pytest.mark.parametrize("variant", ["i8mm", "sdot"])
@pytest.mark.parametrize(("k", "x_zp"), [(65793, 0), (131071, 128)])
def test_a64_is_exact_at_the_longest_k_and_declines_one_more(a64, variant, k, x_zp):
    ok, exact = _extreme(k, x_zp, n=8)
    over, _ = _extreme(k + 1, x_zp, n=8)
    kernel = f"a64_qlinear_{variant}"
    cases = [a64_tests.write_case(a64.root, kernel, args) for args in (ok, over)]
    a64.run(cases)
    got = a64_tests.read_result(cases[0])
    assert isinstance(got, torch.Tensor)
    torch.testing.assert_close(got.double(), exact, rtol=1e-6, atol=0)
    status, message = a64_tests.read_result(cases[1])
    assert status == a64_tests.native.UNSUPPORTED and "int32 sums could overflow" in message

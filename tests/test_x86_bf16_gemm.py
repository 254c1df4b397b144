"""linear_bf16 / linear_relu_bf16 / linear_gelu_bf16 (kernels/x86/linear_bf16.py): one
AVX512_BF16 GEMM with bias and activation fused (kernels/x86/gemm_bf16.c)."""

from __future__ import annotations

import ctypes
import os
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import AVX512_BF16, on_this_host
from pdlkit.runtime_abi.native_build import build_library
from pdlkit.runtime_abi.registry import load_kernel_file

import pdlkit

ROOT = Path(__file__).resolve().parents[1]

if not AVX512_BF16:
    pytest.skip(
        "the BF16 GEMM kernels are declared for x86-64 hosts with avx512_bf16",
        allow_module_level=True,
    )
if shutil.which(os.environ.get("CC", "cc")) is None:
    pytest.skip("no C compiler (cc / $CC) to build gemm_bf16.c", allow_module_level=True)

ACTS = [("linear_bf16", None), ("linear_relu_bf16", None), ("linear_gelu_bf16", "none"),
        ("linear_gelu_bf16", "tanh")]  # fmt: skip
# M = 1 and M % 6 tails, K odd and K = 1, N % 16 / N % 64 tails, N > 64 (several panels)
SHAPES = [((1, 7), 5), ((5, 33), 17), ((2, 3, 70), 9), ((17, 64), 63), ((4, 1), 1), ((3, 256), 130)]


@pytest.fixture(scope="module")
def decls():
    return {k.name: k for k in load_kernel_file(ROOT / "kernels" / "x86" / "linear_bf16.py")}


def _call(decl, x, w, b, approximate):
    packed = decl.prepack(w, {} if approximate is None else {"approximate": approximate})
    if approximate is None:
        return decl.fn(x, packed, b)
    return decl.fn(x, packed, b, approximate)


def _reference(name, x, w, b, approximate):
    """The float32 result of the bf16 operands (what the kernel rounds once to bf16)."""
    y = F.linear(x.float(), w.float(), None if b is None else b.float())
    if "relu" in name:
        y = y.relu()
    if approximate is not None:
        y = F.gelu(y, approximate=approximate)
    return y


def _operands(g, x_shape, n, bias=True):
    k = x_shape[-1]
    x = torch.randn(x_shape, generator=g).bfloat16()
    w = (torch.randn(n, k, generator=g) / k**0.5).bfloat16()
    b = torch.randn(n, generator=g).bfloat16() if bias else None
    return x, w, b


@pytest.mark.parametrize(("name", "approximate"), ACTS)
def test_matches_the_float32_result_rounded_once(decls, name, approximate):
    g = torch.Generator().manual_seed(0)
    for x_shape, n in SHAPES:
        for bias in (True, False):
            x, w, b = _operands(g, x_shape, n, bias)
            got = _call(decls[name], x, w, b, approximate)
            want = _reference(name, x, w, b, approximate)
            assert got.dtype == torch.bfloat16 and got.shape == want.shape
            # one bf16 rounding of a float32 sum: 2^-8 relative, plus the summation order
            torch.testing.assert_close(got.float(), want, rtol=2**-8, atol=1e-5 * x.shape[-1])


def test_vector_path_equals_the_plain_c_path(decls):
    """gemm_bf16.c built with -DPDLKIT_SCALAR_REFERENCE registers the same kernels running its
    plain C loop: both libraries called through the C ABI agree."""
    from pdlkit.runtime_abi.native_load import load_native_library

    source = ROOT / "kernels" / "x86" / "gemm_bf16.c"
    lib = build_library(source, "x86_64", extra=("-DPDLKIT_SCALAR_REFERENCE",))
    plain = {k.name: k for k in load_native_library(lib)}
    g = torch.Generator().manual_seed(1)
    for (m, k), n in [((13, 131), 70), ((6, 2), 64), ((1, 1031), 3)]:
        x, w, b = _operands(g, (m, k), n)
        for name, approximate in ACTS:
            fast, slow = (_call(d[name], x, w, b, approximate) for d in (decls, plain))
            # the same float32 sums in another order: at most one bf16 step apart
            torch.testing.assert_close(fast.float(), slow.float(), rtol=2**-7, atol=1e-6 * k)


def test_strided_rows_are_read_in_place_and_other_layouts_copied(decls):
    g = torch.Generator().manual_seed(2)
    _, w, b = _operands(g, (1, 40), 12)
    rows = torch.randn(3, 5, 40, generator=g).bfloat16()[:, 0]  # BERT's pooler input
    cols = torch.randn(40, 6, generator=g).bfloat16().t()
    for x in (rows, cols):
        got = _call(decls["linear_bf16"], x, w, b, None)
        torch.testing.assert_close(
            got.float(), _reference("linear", x, w, b, None), rtol=2**-8, atol=1e-4
        )
    assert _call(
        decls["linear_bf16"], torch.empty(0, 40, dtype=torch.bfloat16), w, b, None
    ).shape == (0, 12)


def test_gemms_split_over_torch_threads_give_identical_results(decls):
    """Built with -fopenmp (where the compiler has it), a GEMM this large shares its tiles over
    torch's threads; without, it runs on one. Either way the result does not depend on them."""
    decl = decls["linear_gelu_bf16"]
    x, w, b = _operands(torch.Generator().manual_seed(4), (301, 256), 200)  # parallel size
    before = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            outs.append(_call(decl, x, w, b, "none"))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(outs[0], outs[1])  # tiles are independent: no reduction across threads


def test_sibling_header_is_part_of_the_build_hash(tmp_path):
    src = tmp_path / "k.c"
    src.write_text('#include "k.h"\nint f(void) { return K; }\n')
    (tmp_path / "k.h").write_text("#define K 1\n")
    first = build_library(src, "x86_64", out_dir=tmp_path / "out")
    (tmp_path / "k.h").write_text("#define K 2\n")
    second = build_library(src, "x86_64", out_dir=tmp_path / "out")
    assert first != second
    assert ctypes.CDLL(str(first)).f() == 1 and ctypes.CDLL(str(second)).f() == 2


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(64, 256), torch.nn.Linear(256, 64)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


def _bf16_run(module: type[torch.nn.Module], shape: tuple[int, ...], **opts):
    """The BF16 ``module``'s eager and pdlkit outputs on a random input, and pdlkit's stats."""
    torch.manual_seed(0)
    model = module().eval().to(torch.bfloat16)
    x = torch.randn(*shape).bfloat16()
    pdlkit.stats(reset=True)
    with torch.no_grad():
        ref = model(x)
        out = pdlkit.optimize(model, **opts)(x)
    return ref, out, pdlkit.stats()


def test_bf16_model_runs_the_fused_kernels():
    ref, out, st = _bf16_run(Mlp, (4, 10, 64))
    assert st["by_kernel"][on_this_host("linear_gelu_bf16")]["kernel_calls"] == 1
    assert st["by_kernel"][on_this_host("linear_bf16")]["kernel_calls"] == 1
    assert st["fallbacks"] == 0
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref.float(), rtol=0.02, atol=0.02)


class Qkv(torch.nn.Module):
    """A GQA attention's projections at small sizes: 64 and 32 columns from one input, the
    same packed bytes in 64-column panels."""

    def __init__(self) -> None:
        super().__init__()
        self.q = torch.nn.Linear(64, 64, bias=False)
        self.k = torch.nn.Linear(64, 32, bias=False)

    def forward(self, x):
        return self.q(x).sum(-1) + self.k(x).sum(-1)


def test_weights_of_one_packed_size_but_different_widths_each_get_their_own_output():
    # static priority puts linear_bf16 at both sites; the second used to get the first's
    # output shape and fail the output check (KernelCallError at k)
    ref, out, st = _bf16_run(Qkv, (4, 1, 64), autotune="off")
    assert st["by_kernel"][on_this_host("linear_bf16")]["kernel_calls"] == 2
    torch.testing.assert_close(out.float(), ref.float(), rtol=0.02, atol=0.05)


def test_a_bf16_model_runs_under_inference_mode():
    # activations made under torch.inference_mode() have no version counter to read
    with torch.inference_mode():
        ref, out, st = _bf16_run(Qkv, (4, 1, 64))
    assert st["by_kernel"][on_this_host("linear_bf16")]["kernel_calls"] == 2
    torch.testing.assert_close(out.float(), ref.float(), rtol=0.02, atol=0.05)


def test_load_c_library_falls_back_to_the_plain_build_and_checks_the_struct(tmp_path, monkeypatch):
    from pdlkit.runtime_abi.native_build import load_c_library

    monkeypatch.setenv("PDLKIT_BUILD_DIR", str(tmp_path / "cache"))
    src = tmp_path / "k.c"
    src.write_text("int size(void) { return 24; }\n")
    lib = load_c_library(src, "x86_64", "k", ("-fno-such-flag-pdlkit",), ("size", 24))
    assert lib is not None and lib.size() == 24  # the flag failed: built without it
    with pytest.warns(UserWarning, match=r"k\.c: parameter struct size mismatch"):
        assert load_c_library(src, "x86_64", "k", (), ("size", 32)) is None
    src.write_text("int size(void) { return }\n")
    with pytest.warns(UserWarning, match=r"k\.c could not be built, k not declared"):
        assert load_c_library(src, "x86_64", "k") is None

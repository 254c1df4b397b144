"""The BF16 AMX kernels (the *_amx kernels of kernels/x86/linear_bf16.py: gemm_bf16.c with
TDPBF16PS): the panels as AMX B tiles, the decline to the AVX512_BF16 path where the tiles do
not fit, the tile instructions on an AMX host ("needs amx_bf16 (lscpu)" elsewhere), and the AMX
engine with TDPBF16PS emulated in C against the AVX512_BF16 path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import AMX_BF16, AVX512_BF16
from pdlkit.runtime_abi.registry import load_kernel_file
from x86_amx_common import ROOT, skip_module_without_vnni_build

skip_module_without_vnni_build()

HAS_AMX_BF16 = AMX_BF16 and AVX512_BF16
needs_amx_bf16 = pytest.mark.skipif(not HAS_AMX_BF16, reason="needs amx_bf16 (lscpu)")


@pytest.fixture(scope="module")
def bf16():
    if not AVX512_BF16:
        pytest.skip("the BF16 kernels are declared for avx512_bf16 hosts")
    return {k.name: k for k in load_kernel_file(ROOT / "kernels" / "x86" / "linear_bf16.py")}


def _bf16_operands(m, k, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).bfloat16()
    w = (torch.randn(n, k, generator=g) / k**0.5).bfloat16()
    return x, w, torch.randn(n, generator=g).bfloat16()


def _bf16_call(decl, x, w, b, gelu):
    p = decl.prepack(w, {"approximate": "none"} if gelu else {})
    return (decl.fn(x, p, b, "none") if gelu else decl.fn(x, p, b)), p


def test_bf16_panels_are_amx_b_tiles(bf16):
    """gemm_bf16.c's panels, 64 columns x a pair of bf16 per k pair (256 bytes), read with
    stride 256 from 4 c0 bytes in: the VNNI-2 B tile of columns c0 .. c0 + 15."""
    _, w, _ = _bf16_operands(1, 64, 64, seed=2)
    p = bf16["linear_bf16"].prepack(w, {})
    flat = p.data[64:]  # the panels' bytes, after the 64-byte header
    for q0 in (0, 16):
        for c0 in (0, 16, 32, 48):
            base = q0 * 256 + 4 * c0
            tile = torch.stack([flat[base + 256 * r : base + 256 * r + 64] for r in range(16)])
            cols = w[c0 : c0 + 16, 2 * q0 : 2 * q0 + 32]  # [16 columns, 16 pairs x 2]
            want = cols.reshape(16, 16, 2).permute(1, 0, 2).contiguous()  # [pair][col][i]
            assert torch.equal(tile, want.view(torch.int16).view(torch.uint8).reshape(16, 64))


@pytest.mark.parametrize(("m", "k", "n"), [(1, 256, 96), (40, 100, 70), (70, 256, 100)])
@pytest.mark.parametrize("gelu", [False, True])
def test_bf16_amx_kernel_runs_the_avx512_path_where_the_tiles_do_not_fit(bf16, m, k, n, gelu):
    from pdlkit.kernels.x86 import linear_bf16

    x, w, b = _bf16_operands(m, k, n)
    name = "linear_gelu_bf16" if gelu else "linear_bf16"
    got, p = _bf16_call(bf16[name + "_amx"], x, w, b, gelu)
    fits = HAS_AMX_BF16 and k % 32 == 0 and m >= 32
    assert linear_bf16.uses_amx(p, m) == fits
    if not fits:
        assert torch.equal(got, _bf16_call(bf16[name], x, w, b, gelu)[0])


@needs_amx_bf16
@pytest.mark.parametrize(("m", "k", "n"), [(128, 768, 768), (70, 256, 100), (64, 3072, 64)])
@pytest.mark.parametrize("gelu", [False, True])
def test_bf16_amx_tiles_within_bf16_rounding(bf16, m, k, n, gelu):
    """TDPBF16PS sums in another order than vdpbf16ps: within bf16 rounding of the float
    reference and of the AVX512_BF16 kernel."""
    from pdlkit.kernels.x86 import linear_bf16

    x, w, b = _bf16_operands(m, k, n, seed=11)
    name = "linear_gelu_bf16" if gelu else "linear_bf16"
    got, p = _bf16_call(bf16[name + "_amx"], x, w, b, gelu)
    assert linear_bf16.uses_amx(p, m)
    y = F.linear(x.float(), w.float(), b.float())
    ref = F.gelu(y) if gelu else y
    torch.testing.assert_close(got.float(), ref, rtol=1.6e-2, atol=1e-2)
    peer, _ = _bf16_call(bf16[name], x, w, b, gelu)
    torch.testing.assert_close(got.float(), peer.float(), rtol=1.6e-2, atol=1e-2)


@pytest.mark.parametrize(("m", "k", "n"), [(70, 256, 130), (64, 1536, 200), (40, 64, 64)])
def test_emulated_amx_bf16_blocking_within_bf16_rounding(m, k, n):
    """gemm_bf16.c's AMX blocking (K chunks of 384, panel groups, AVX512_BF16 tail rows) with
    TDPBF16PS emulated: within bf16 rounding of the float32 reference."""
    if not AVX512_BF16:
        pytest.skip("the tail rows run the AVX512_BF16 micro-kernel: needs avx512_bf16")
    from pdlkit.kernels.x86 import linear_bf16 as lb
    from pdlkit.runtime_abi.native_build import build_library
    from pdlkit.runtime_abi.native_load import load_native_library

    lib = build_library(lb.SOURCE, "x86_64", extra=("-fopenmp", "-DPDLKIT_AMX_EMULATE"))
    decl = {k.name: k for k in load_native_library(lib)}["linear_bf16_amx"]
    x, w, b = _bf16_operands(m, k, n, seed=12)
    out, _ = _bf16_call(decl, x, w, b, False)
    ref = F.linear(x.float(), w.float(), b.float())
    torch.testing.assert_close(out.float(), ref, rtol=1.6e-2, atol=1e-2)


@pytest.fixture(scope="module")
def emulated_bf16():
    """gemm_bf16.c built with -DPDLKIT_AMX_EMULATE: its kernels by name and the library's count
    of 32 x 32 halves run on (emulated) tiles, pdlkit_amx_gemm_halves()."""
    if not AVX512_BF16:
        pytest.skip("the tail rows and the reference run the AVX512_BF16 path: needs avx512_bf16")
    import ctypes
    import hashlib

    from pdlkit.kernels.x86 import linear_bf16 as lb
    from pdlkit.runtime_abi.dlopen import open_library
    from pdlkit.runtime_abi.native_build import build_library
    from pdlkit.runtime_abi.native_load import load_native_library

    path = build_library(lb.SOURCE, "x86_64", extra=("-fopenmp", "-DPDLKIT_AMX_EMULATE"))
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    kernels = {k.name: k for k in load_native_library(path, digest, data)}
    halves = open_library(path, data, digest).pdlkit_amx_gemm_halves  # the kernels' handle
    halves.restype = ctypes.c_int64
    return kernels, halves


BF16_ACTS = [("linear_bf16", None), ("linear_relu_bf16", None), ("linear_gelu_bf16", "none"),
             ("linear_gelu_bf16", "tanh")]  # fmt: skip


@pytest.mark.parametrize(
    ("m", "k", "n", "threads"),
    [
        (45, 416, 33, 1),  # one block + 13 AVX512_BF16 rows; K: a chunk of 384 + 32; odd N < 64
        (70, 256, 130, 1),  # 2 blocks + 6 rows, 3 panels (the last of 2 columns)
        (96, 800, 200, 2),  # 3 chunks (384, 384, 32), groups, 2 threads; 8 columns in panel 3
        (128, 768, 96, 2),  # BERT-base's K: 2 whole chunks; a panel of 32 columns (one half)
        (32, 32, 17, 1),  # one tile step, one block, a half of 17 columns
    ],
)
@pytest.mark.parametrize(("name", "approximate"), BF16_ACTS)
def test_emulated_amx_bf16_engine_equals_the_avx512_path(
    emulated_bf16, m, k, n, threads, name, approximate
):
    """gemm_bf16.c on the shared AMX engine (qgemm_amx_gemm.h: halves, K chunks, panel groups,
    the epilogue run between the next half's K steps, AVX512_BF16 tail rows), TDPBF16PS
    emulated, on operands whose sums are exact in float32 (small integers): bit for bit the
    AVX512_BF16 kernel's outputs, whatever the order of the sums, for every activation; and the
    tiles did run (the library's count of halves)."""
    kernels, halves = emulated_bf16
    g = torch.Generator().manual_seed(m * k + n)
    x = torch.randint(-3, 4, (m, k), generator=g).bfloat16()
    w = torch.randint(-3, 4, (n, k), generator=g).bfloat16()
    b = torch.randint(-8, 9, (n,), generator=g).bfloat16()
    before, count = torch.get_num_threads(), halves()
    torch.set_num_threads(threads)
    try:
        got, _ = _bf16_call_act(kernels[name + "_amx"], x, w, b, approximate)
        ran = halves() - count
        peer, _ = _bf16_call_act(kernels[name], x, w, b, approximate)
    finally:
        torch.set_num_threads(before)
    blocks, halves_per_row = m // 32, sum(1 if n - c <= 32 else 2 for c in range(0, n, 64))
    assert ran == blocks * halves_per_row * -(-k // 384)  # every half of every K chunk
    assert halves() - count == ran  # and none for the AVX512_BF16 kernel
    assert torch.equal(got, peer)


def test_emulated_amx_bf16_fewer_than_32_rows_run_avx512(emulated_bf16):
    """M < 32 or K % 32 != 0: the AMX kernel runs the AVX512_BF16 path (no halves on tiles)."""
    kernels, halves = emulated_bf16
    for m, k in ((31, 256), (64, 100)):
        x, w, b = _bf16_operands(m, k, 40, seed=m)
        count = halves()
        got, _ = _bf16_call(kernels["linear_gelu_bf16_amx"], x, w, b, True)
        assert halves() == count
        assert torch.equal(got, _bf16_call(kernels["linear_gelu_bf16"], x, w, b, True)[0])


def _bf16_call_act(decl, x, w, b, approximate):
    """decl (linear / linear_relu / linear_gelu with `approximate`) with its own pre-pack."""
    p = decl.prepack(w, {} if approximate is None else {"approximate": approximate})
    return (decl.fn(x, p, b) if approximate is None else decl.fn(x, p, b, approximate)), p

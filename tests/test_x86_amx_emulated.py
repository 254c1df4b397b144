"""The AMX int8 path's blocking with the tile instructions emulated in C (qgemm_vnni.c built
with -DPDLKIT_AMX_EMULATE; runs on any x86-64 with AVX-512 VNNI): blocks of 32 rows, K chunks,
panel groups, VNNI tail rows, the epilogues, the add + LayerNorm entry and the merged QKV
attention's GEMM, each against the VNNI path bit for bit."""

from __future__ import annotations

import pytest
import torch
from conftest import AVX512_BF16
from x86_amx_common import _call, _operands, skip_module_without_vnni_build

skip_module_without_vnni_build()


@pytest.fixture(scope="module")
def emulated():
    """qgemm_vnni.c built with -DPDLKIT_AMX_EMULATE: qgemm_amx.h's tile instructions in plain C,
    everything around them (blocks of 32 rows, K chunks, panel groups, VNNI tail rows, the
    epilogue, threads) as on an AMX host."""
    from pdlkit.kernels.x86 import qlinear_vnni as v
    from pdlkit.runtime_abi.native_build import build_library
    from pdlkit.runtime_abi.native_load import load_native_library

    lib = build_library(v.SOURCE, "x86_64", extra=("-fopenmp", "-DPDLKIT_AMX_EMULATE"))
    return {k.name: k for k in load_native_library(lib)}


ACT_POSTS = {0: ("none", ""), 1: ("relu", ""), 2: ("gelu", "none"), 3: ("gelu", "tanh")}


def _emulated_run(kernels, x, w, x_zp, amx, out_dtype, threads, act=2):
    """Output of the emulated library's AMX kernel (a pre-pack asking for the tiles: every call
    here has K % 64 == 0) or its VNNI one."""
    n, k = w.shape
    g = torch.Generator().manual_seed(k)
    ws, b = torch.rand(n, generator=g) * 0.01 + 1e-3, torch.randn(n, generator=g)
    out = None if out_dtype is torch.float32 else out_dtype
    name = ("qlinear" if out is None else "qlinear_q") + ("_amx" if amx else "_vnni")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got, _ = _call(kernels[name], x, x_zp, w, ws, b, *ACT_POSTS[act], out)
    finally:
        torch.set_num_threads(before)
    return got


@pytest.mark.parametrize(
    ("m", "k", "n", "x_dtype", "threads"),
    [
        (70, 256, 130, torch.uint8, 1),  # 2 blocks of 32 rows + 6 VNNI rows, 3 panels, odd N
        (64, 3072, 200, torch.uint8, 1),  # 4 K chunks of 768, one group of 4 panels
        (96, 1536, 1100, torch.int8, 2),  # 2 K chunks, 3 groups of 6 panels, 2 threads
        (32, 64, 64, torch.int8, 1),  # one tile step
        (160, 512, 100, torch.uint8, 2),  # 5 blocks over 2 threads; 36 columns in panel 2
    ],
)
@pytest.mark.parametrize("out_dtype", [torch.uint8, torch.int8, torch.float32])
def test_emulated_amx_blocking_matches_the_vnni_path(
    emulated, m, k, n, x_dtype, threads, out_dtype
):
    """The AMX path's blocking, K chunks and panel groups, and its epilogue run half a block
    behind the tiles (tile instructions emulated) give the VNNI path's outputs bit for bit:
    the same exact int32 sums, the same epilogue arithmetic."""
    x, w, _, _, x_zp = _operands(m, k, n, x_dtype, seed=m + k)
    amx = _emulated_run(emulated, x, w, x_zp, True, out_dtype, threads)
    vnni = _emulated_run(emulated, x, w, x_zp, False, out_dtype, threads)
    assert torch.equal(amx, vnni)


def _emulated_add_ln(kernels, x, w, x_zp, amx, threads):
    """The emulated library's add + LayerNorm kernel, AMX or VNNI: float32 output and codes."""
    m, n = x.shape[0], w.shape[0]
    g = torch.Generator().manual_seed(n)
    ws, b = torch.rand(n, generator=g) * 0.01 + 1e-3, torch.randn(n, generator=g)
    res, gamma, beta = (
        torch.randn(m, n, generator=g),
        torch.rand(n, generator=g) + 0.5,
        torch.randn(n, generator=g),
    )
    attrs = {"x_scale": 0.02, "x_zp": x_zp, "normalized_shape": [n], "eps": 1e-12}
    attrs.update(out_scale=8 / 255, out_zp=128, out_qmin=0, out_qmax=255)
    decl = kernels["qlinear_add_layer_norm_q_" + ("amx" if amx else "vnni")]
    p, wz = decl.prepack(w, attrs), torch.zeros(n, dtype=torch.int64)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return decl.fn(
            x, 0.02, x_zp, p, ws, wz, b, res, [n], gamma, beta, 1e-12, 8 / 255, 128, 0, 255
        )
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("x_dtype", [torch.uint8, torch.int8])
def test_emulated_amx_add_layer_norm_matches_the_vnni_path(emulated, x_dtype):
    """The add + LayerNorm entry's AMX GEMM (3 blocks of 32 rows over 2 threads, 6 VNNI rows,
    a 36-column panel; tile instructions emulated) gives the VNNI path's float32 output and
    codes bit for bit."""
    x, w, _, _, x_zp = _operands(102, 512, 100, x_dtype, seed=5)
    amx = _emulated_add_ln(emulated, x, w, x_zp, True, 2)
    vnni = _emulated_add_ln(emulated, x, w, x_zp, False, 2)
    assert torch.equal(amx[0], vnni[0])
    assert torch.equal(amx[1], vnni[1])


def _qkv_args(b, s, n, heads, seed):
    """qkv_attention_q_merged's arguments for [b, s, n] activations and n / heads per head."""
    g = torch.Generator().manual_seed(seed)
    args = [torch.randint(0, 256, (b, s, n), generator=g, dtype=torch.uint8), 0.02, 128]
    for _ in "qkv":
        args += [torch.randint(-127, 128, (n, n), generator=g, dtype=torch.int8)]
        args += [torch.rand(n, generator=g) * 0.001 + 1e-4, torch.zeros(n, dtype=torch.int64)]
        args += [torch.randn(n, generator=g)]
    return [*args, [b, s, -1, n // heads], None, 0, 0.0, 0.05, 128, 0, 255]


def test_emulated_amx_qkv_attention_matches_the_vnni_path():
    """qkv_attention_q_merged's per-batch GEMM on (emulated) AMX tiles, bert-mini's 64 x 256 x
    768 per batch, gives the codes of the library built without emulation (VNNI where the host
    has no AMX): the projections' sums are the same, so is everything after them (both built
    with the attention on the vector units, -DPDLKIT_ATTENTION_NO_AMX: its tile path is
    tests/test_x86_amx_attention.py's)."""
    if not AVX512_BF16:
        pytest.skip("the attention needs avx512_bf16")
    from pdlkit.kernels.x86 import qlinear_vnni as v
    from pdlkit.runtime_abi.native_build import build_library
    from pdlkit.runtime_abi.native_load import load_native_library

    libs = [("-DPDLKIT_AMX_EMULATE", "-DPDLKIT_ATTENTION_NO_AMX"), ("-DPDLKIT_ATTENTION_NO_AMX",)]
    built = [build_library(v.SOURCE, "x86_64", extra=("-fopenmp", *f)) for f in libs]
    args = _qkv_args(2, 64, 256, 4, seed=11)
    outs = []
    for kernels in ({k.name: k for k in load_native_library(b)} for b in built):
        decl = kernels["qkv_attention_q_merged_vnni"]
        attrs = {
            p: a for p, a in zip(decl.params, args, strict=True) if not isinstance(a, torch.Tensor)
        }
        attrs.update(wk=args[7], wv=args[11])
        outs.append(decl.fn(*args[:3], decl.prepack(args[3], attrs), *args[4:]))
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("act", [0, 1, 3])  # none, ReLU, GELU tanh (erf: the test above)
def test_emulated_amx_epilogues_match_the_vnni_path(emulated, act):
    """Each activation of the AMX path's epilogue (tile instructions emulated) gives the VNNI
    path's codes."""
    x, w, _, _, x_zp = _operands(96, 256, 200, torch.uint8, seed=act)
    amx = _emulated_run(emulated, x, w, x_zp, True, torch.uint8, 1, act)
    vnni = _emulated_run(emulated, x, w, x_zp, False, torch.uint8, 1, act)
    assert torch.equal(amx, vnni)

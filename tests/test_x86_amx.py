"""The AMX int8 kernels (the *_amx kernels of qgemm_vnni.c's library, kernels/x86/qlinear_vnni.py:
the AMX path of qgemm_amx.h) and int8 activations on x86 (VNNI and AMX).

On a host without AMX the packing layout the tiles read, the declarations, the decline to the
VNNI path and the s8 activations are tested; the tests that run the tile instructions skip
there ("needs amx_int8 (lscpu)")."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from pdlkit.runtime_abi.capability import NAMED, host
from pdlkit.runtime_abi.native_build import host_arch
from pdlkit.runtime_abi.registry import KernelRegistry, load_kernel_file

import pdlkit

ROOT = Path(__file__).resolve().parents[1]

if host_arch() != "x86_64" or "avx512_vnni" not in host().features:
    pytest.skip(
        "the AMX kernels run their VNNI path where a call does not fit the tiles: needs "
        "avx512_vnni",
        allow_module_level=True,
    )
if shutil.which(os.environ.get("CC", "cc")) is None:
    pytest.skip("no C compiler (cc / $CC) to build qgemm_vnni.c", allow_module_level=True)
pytest.importorskip(
    "torchao", reason="the PT2E reference needs torchao (pip install -e '.[quant]')"
)

HAS_AMX = "amx_int8" in host().features
needs_amx = pytest.mark.skipif(not HAS_AMX, reason="needs amx_int8 (lscpu)")


@pytest.fixture(scope="module")
def amx():
    return {k.name: k for k in load_kernel_file(ROOT / "kernels" / "x86" / "qlinear_vnni.py")}


@pytest.fixture(scope="module")
def vnni():
    return {k.name: k for k in load_kernel_file(ROOT / "kernels" / "x86" / "qlinear_vnni.py")}


@pytest.fixture(scope="module")
def lib():
    from pdlkit.kernels.x86 import qlinear_vnni

    return qlinear_vnni


def _operands(m, k, n, x_dtype, seed=0, x_zp=None):
    g = torch.Generator().manual_seed(seed)
    lo, hi = (-128, 127) if x_dtype is torch.int8 else (0, 255)
    x = torch.randint(lo, hi + 1, (m, k), generator=g).to(x_dtype)
    w = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    ws = torch.rand(n, generator=g) * 0.01 + 1e-3
    b = torch.randn(n, generator=g)
    if x_zp is None:
        x_zp = -7 if x_dtype is torch.int8 else 128
    return x, w, ws, b, x_zp


def _reference(x, x_zp, w, ws, b, post, algo, out):
    """PT2E's chain: dequantize, linear, activation, quantize_per_tensor (or the float)."""
    xf = (x.float() - x_zp) * 0.02
    y = F.linear(xf, w.float() * (ws if isinstance(ws, float) else ws[:, None]), b)
    if post == "relu":
        y = torch.relu(y)
    elif post == "gelu":
        y = F.gelu(y, approximate=algo or "none")
    if out is None:
        return y
    qmin, qmax = (0, 255) if out is torch.uint8 else (-128, 127)
    q = torch.clamp(torch.round(y / 0.05) + 3, qmin, qmax)
    return q.to(out)


def _call(decl, x, x_zp, w, ws, b, post, algo, out, pt=False):
    """The kernel with a pre-pack made for it, as a compiled graph calls it; (output, packed)."""
    zp = 0 if pt else torch.zeros(w.shape[0], dtype=torch.int64)
    attrs = {"x_scale": 0.02, "x_zp": x_zp, "post_op": post, "algorithm": algo}
    if out is None:
        p = decl.prepack(w, attrs)
        return decl.fn(x, 0.02, x_zp, p, ws, zp, b, post, algo), p
    qmin, qmax = (0, 255) if out is torch.uint8 else (-128, 127)
    attrs.update(out_scale=0.05, out_zp=3, out_qmin=qmin, out_qmax=qmax)
    p = decl.prepack(w, attrs)
    return decl.fn(x, 0.02, x_zp, p, ws, zp, b, 0.05, 3, qmin, qmax, post, algo), p


def test_vnni_panels_are_amx_b_tiles(vnni):
    """What _tile_loadd(B, panel + 256 q0 + 4 c0, stride 256) reads from the VNNI pre-pack is
    the VNNI-4 B tile of columns c0 .. c0 + 15 and k groups q0 .. q0 + 15 (zero past N)."""
    w = torch.randint(-127, 128, (80, 128), generator=torch.Generator().manual_seed(1)).to(
        torch.int8
    )
    p = vnni["qlinear_vnni"].prepack(
        w, {"x_scale": 0.02, "x_zp": 0, "post_op": "none", "algorithm": ""}
    )
    flat, k4 = p.data[64:].view(torch.int8), 128 // 4  # after the 64-byte header
    wp = torch.cat((w, torch.zeros(128 - 80, 128, dtype=torch.int8)))  # two panels of 64
    for panel in range(2):
        for q0 in (0, 16):
            for c0 in (0, 16, 32, 48):
                base = panel * k4 * 256 + q0 * 256 + 4 * c0
                tile = torch.stack([flat[base + 256 * r : base + 256 * r + 64] for r in range(16)])
                cols = wp[panel * 64 + c0 : panel * 64 + c0 + 16, 4 * q0 : 4 * q0 + 64]
                want = cols.reshape(16, 16, 4).permute(1, 0, 2).reshape(16, 64)  # [group][col][i]
                assert torch.equal(tile, want), (panel, q0, c0)


def test_amx_kernels_are_chosen_on_amx_targets_only():
    """The shipped kernel folder: on an AMX target the AMX kernel comes first, then VNNI; on an
    AVX-512 VNNI one it is not eligible, and the reason names the missing flags."""
    reg = KernelRegistry.from_folders([ROOT / "kernels"])
    x, w, ws, b, _ = _operands(64, 256, 96, torch.uint8)
    zp = torch.zeros(96, dtype=torch.int64)
    args = (x, 0.02, 128, w, ws, zp, b, 0.05, 3, 0, 255, "none", "")
    on_amx, _ = reg.candidates("qlinear_q", args, NAMED["x86-amx"])
    on_vnni, why = reg.candidates("qlinear_q", args, NAMED["x86-avx512-vnni"])
    assert [k.name for k in on_amx][:2] == ["qlinear_q_amx", "qlinear_q_vnni"]
    assert [k.name for k in on_vnni][0] == "qlinear_q_vnni"
    assert any("qlinear_q_amx" in r and "amx_int8" in r for r in why)


@pytest.mark.parametrize(
    ("m", "k", "n", "post", "algo", "out", "x_dtype"),
    [
        (1, 256, 96, "gelu", "none", torch.uint8, torch.uint8),  # M = 1
        (31, 256, 64, "none", "", torch.int8, torch.uint8),  # less than one block of 32 rows
        (64, 100, 70, "relu", "", None, torch.uint8),  # K not a multiple of 64, odd N
        (64, 96, 33, "gelu", "tanh", torch.uint8, torch.int8),  # K % 64 = 32, s8 activations
        (70, 256, 130, "none", "", torch.uint8, torch.int8),  # 2 AMX blocks + 6 VNNI rows
    ],
)
def test_amx_kernel_runs_the_vnni_path_where_the_tiles_do_not_fit(
    amx, vnni, lib, m, k, n, post, algo, out, x_dtype
):
    """Shapes outside the tiles' rules (and every call on a host without AMX) run the VNNI
    path on the same packed weight: the VNNI kernel's outputs, within one code of PT2E's."""
    x, w, ws, b, x_zp = _operands(m, k, n, x_dtype)
    name = "qlinear_q" if out is not None else "qlinear"
    got, p = _call(amx[f"{name}_amx"], x, x_zp, w, ws, b, post, algo, out)
    fits = HAS_AMX and k % 64 == 0 and m >= 32
    assert lib.uses_amx(p, m, x_dtype) == fits
    peer, _ = _call(vnni[f"{name}_vnni"], x, x_zp, w, ws, b, post, algo, out)
    assert torch.equal(got, peer)  # exact int32 sums either way, one epilogue
    ref = _reference(x, x_zp, w, ws, b, post, algo, out)
    if out is None:
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-3)
    else:
        assert (got.int() - ref.int()).abs().max().item() <= 1


@pytest.mark.parametrize("x_zp", [-128, -7, 0, 127])
@pytest.mark.parametrize("post", ["none", "gelu"])
def test_s8_activations_on_vnni_within_one_code(vnni, x_zp, post):
    """int8 activations (symmetric quantizers) through the u8 view x + 128 and the
    -(x_zp + 128) sum_k w correction: within one code of PT2E's chain, any zero point."""
    x, w, ws, b, _ = _operands(24, 200, 48, torch.int8, seed=3)
    got, _ = _call(vnni["qlinear_q_vnni"], x, x_zp, w, ws, b, post, "", torch.int8)
    ref = _reference(x, x_zp, w, ws, b, post, "", torch.int8)
    assert (got.int() - ref.int()).abs().max().item() <= 1


def test_s8_activations_with_asymmetric_weights(vnni):
    """A weight zero point with int8 activations: the row sums are of the signed values."""
    x, w, ws, b, x_zp = _operands(16, 64, 32, torch.int8, seed=4)
    wz = torch.randint(-5, 6, (32,), generator=torch.Generator().manual_seed(5))
    decl = vnni["qlinear_vnni"]
    p = decl.prepack(w, {"x_scale": 0.02, "x_zp": x_zp, "post_op": "none", "algorithm": ""})
    got = decl.fn(x, 0.02, x_zp, p, ws, wz, b, "none", "")
    ref = F.linear((x.float() - x_zp) * 0.02, (w.float() - wz[:, None]) * ws[:, None], b)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-3)


def test_s8_k_past_exact_int32_is_declined(vnni):
    """x_zp = -128: the u8 view's zero point is 0, sums are exact up to K = 65793."""
    k = 65800
    x = torch.full((1, k), 127, dtype=torch.int8)
    w = torch.full((1, k), -127, dtype=torch.int8)
    decl = vnni["qlinear_vnni"]
    with pytest.raises(pdlkit.KernelUnsupported, match="65793"):
        p = decl.prepack(w, {"x_scale": 0.02, "x_zp": -128, "post_op": "none", "algorithm": ""})
        decl.fn(
            x, 0.02, -128, p, torch.ones(1), torch.zeros(1, dtype=torch.int64), None, "none", ""
        )


@pytest.mark.parametrize("x_dtype", [torch.uint8, torch.int8])
def test_per_tensor_weight_kernels(amx, x_dtype):
    x, w, _, b, x_zp = _operands(40, 128, 50, x_dtype, seed=6)
    for engine in ("vnni", "amx"):
        got, _ = _call(
            amx[f"qlinear_q_pt_{engine}"], x, x_zp, w, 0.004, b, "relu", "", torch.uint8, pt=True
        )
        ref = _reference(x, x_zp, w, 0.004, b, "relu", "", torch.uint8)
        assert (got.int() - ref.int()).abs().max().item() <= 1


def test_xnnpack_per_tensor_graph_is_substituted():
    """XNNPACKQuantizer's symmetric config: s8 activations, per-tensor weights
    (patterns/x86/qlinear_per_tensor.pdl.mlir); outputs as the PT2E model's."""
    xq = pytest.importorskip("torchao.testing.pt2e._xnnpack_quantizer")
    from conftest import pt2e

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 32)
    ).eval()
    x = torch.randn(40, 64)
    cfg = xq.get_symmetric_quantization_config(is_per_channel=False)
    q = pt2e(model, x, xq.XNNPACKQuantizer().set_global(cfg))
    assert pdlkit.explain(q, x).counts() == {"pt_qlinear_relu_q": 1, "pt_qlinear_q": 1}
    pdlkit.stats(reset=True)
    with torch.no_grad():
        ref, f = q(x), pdlkit.optimize(q)
        for _ in range(2):
            got = f(x)
    assert (got - ref).abs().max().item() <= 0.0050 * 1.01  # one output step of the last q
    st = pdlkit.stats()
    assert st["fallbacks"] == 0
    assert f"qlinear_q_pt_{'amx' if HAS_AMX else 'vnni'}" in st["by_kernel"]


# -- the AMX path's blocking with the tile instructions emulated in C (runs on any x86-64) --


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
    if "avx512_bf16" not in host().features:
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


# -- the tile instructions themselves --


@needs_amx
@pytest.mark.parametrize(
    ("m", "k", "n", "post", "algo", "out", "x_dtype"),
    [
        (128, 768, 768, "none", "", torch.uint8, torch.uint8),
        (128, 768, 3072, "gelu", "none", torch.uint8, torch.uint8),
        (128, 3072, 768, "none", "", None, torch.uint8),
        (64, 256, 100, "relu", "", torch.int8, torch.int8),  # TDPBSSD, odd N
        (70, 128, 64, "gelu", "tanh", torch.int8, torch.int8),  # tiles + VNNI tail rows, s8
    ],
)
def test_amx_tiles_match_vnni_exactly(amx, vnni, lib, m, k, n, post, algo, out, x_dtype):
    x, w, ws, b, x_zp = _operands(m, k, n, x_dtype, seed=7)
    name = "qlinear_q" if out is not None else "qlinear"
    got, p = _call(amx[f"{name}_amx"], x, x_zp, w, ws, b, post, algo, out)
    assert lib.uses_amx(p, m, x_dtype)
    peer, _ = _call(vnni[f"{name}_vnni"], x, x_zp, w, ws, b, post, algo, out)
    assert torch.equal(got, peer)
    if out is not None:
        ref = _reference(x, x_zp, w, ws, b, post, algo, out)
        assert (got.int() - ref.int()).abs().max().item() <= 1


@needs_amx
def test_amx_on_two_threads_matches_one(amx):
    x, w, ws, b, x_zp = _operands(256, 768, 768, torch.uint8, seed=8)
    decl = amx["qlinear_q_amx"]
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one, _ = _call(decl, x, x_zp, w, ws, b, "gelu", "none", torch.uint8)
        torch.set_num_threads(2)
        two, _ = _call(decl, x, x_zp, w, ws, b, "gelu", "none", torch.uint8)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)


@needs_amx
@pytest.mark.parametrize("x_dtype", [torch.uint8, torch.int8])
def test_amx_add_layer_norm_matches_vnni(amx, vnni, lib, x_dtype):
    m, k, n = 128, 768, 768
    x, w, ws, b, x_zp = _operands(m, k, n, x_dtype, seed=9)
    g = torch.Generator().manual_seed(10)
    res, gamma, beta = (
        torch.randn(m, n, generator=g),
        torch.rand(n, generator=g) + 0.5,
        torch.randn(n, generator=g),
    )
    attrs = {"x_scale": 0.02, "x_zp": x_zp, "normalized_shape": [n], "eps": 1e-12}
    attrs.update(out_scale=8 / 255, out_zp=128, out_qmin=0, out_qmax=255)
    wz = torch.zeros(n, dtype=torch.int64)
    outs = []
    for decl in (amx["qlinear_add_layer_norm_q_amx"], vnni["qlinear_add_layer_norm_q_vnni"]):
        p = decl.prepack(w, attrs)
        outs.append(
            decl.fn(x, 0.02, x_zp, p, ws, wz, b, res, [n], gamma, beta, 1e-12, 8 / 255, 128, 0, 255)
        )
    assert lib.uses_amx(p, m, x_dtype) is False  # the VNNI kernel's pre-pack
    torch.testing.assert_close(outs[0][0], outs[1][0], rtol=0, atol=0)
    assert torch.equal(outs[0][1], outs[1][1])


# -- BF16 (the *_amx kernels of kernels/x86/linear_bf16.py: gemm_bf16.c with TDPBF16PS) --

HAS_AMX_BF16 = "amx_bf16" in host().features and "avx512_bf16" in host().features
needs_amx_bf16 = pytest.mark.skipif(not HAS_AMX_BF16, reason="needs amx_bf16 (lscpu)")


@pytest.fixture(scope="module")
def bf16():
    if "avx512_bf16" not in host().features:
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
    if "avx512_bf16" not in host().features:
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
    if "avx512_bf16" not in host().features:
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


def test_per_tensor_kernel_with_a_new_bias_tensor_each_call(amx):
    """Eager callers pass new tensors each call: the cached [N] vectors are matched by
    identity, never by comparing tensors."""
    x, w, _, _, x_zp = _operands(8, 64, 16, torch.uint8, seed=13)
    decl = amx["qlinear_pt_vnni"]
    p = decl.prepack(w, {"x_scale": 0.02, "x_zp": x_zp, "post_op": "none", "algorithm": ""})
    for seed in range(3):
        b = torch.randn(16, generator=torch.Generator().manual_seed(seed))
        got = decl.fn(x, 0.02, x_zp, p, 0.004, 0, b, "none", "")
        torch.testing.assert_close(got, _reference(x, x_zp, w, 0.004, b, "none", "", None))


def test_explain_for_an_amx_target_plans_the_amx_kernels():
    """A PT2E model (X86InductorQuantizer, through pdlkit.quantization: its capture is the one
    the quantizer annotates on every torch, where torch 2.11's non-strict export alone left
    both linears FP32) planned for a Xeon with AMX: both GEMMs go to the AMX kernels
    (autotune off: declared priority decides)."""
    from pdlkit.quantization import quantize

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64)
    ).eval()
    x = torch.randn(64, 64)
    qmodel = quantize(model, (x,), scheme="int8-static")
    report = pdlkit.explain(qmodel, x, target="x86-amx", autotune="off")
    assert [s.kernel for s in report.substitutions] == ["qlinear_q_amx", "qlinear_amx"]

"""The AMX int8 kernels (the *_amx kernels of qgemm_vnni.c's library, kernels/x86/qlinear_vnni.py:
the AMX path of qgemm_amx.h) and int8 activations on x86 (VNNI and AMX), run on this host.

On a host without AMX the packing layout the tiles read, the declarations, the decline to the
VNNI path and the s8 activations are tested; the tests that run the tile instructions skip
there ("needs amx_int8 (lscpu)"). The AMX path's blocking with the tile instructions emulated
in C is test_x86_amx_emulated.py's; the BF16 AMX kernels are test_x86_amx_bf16.py's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import AMX_BF16, AMX_INT8
from pdlkit.runtime_abi.capability import NAMED
from pdlkit.runtime_abi.registry import KernelRegistry, load_kernel_file
from x86_amx_common import ROOT, _call, _operands, skip_module_without_vnni_build

import pdlkit

skip_module_without_vnni_build()

needs_amx = pytest.mark.skipif(not AMX_INT8, reason="needs amx_int8 (lscpu)")


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
    fits = AMX_INT8 and k % 64 == 0 and m >= 32
    assert lib.uses_amx(p, m, x_dtype) == fits
    peer, _ = _call(vnni[f"{name}_vnni"], x, x_zp, w, ws, b, post, algo, out)
    assert torch.equal(got, peer)  # exact int32 sums either way, one epilogue
    ref = _reference(x, x_zp, w, ws, b, post, algo, out)
    if out is None:
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-3)
    else:
        assert (got.int() - ref.int()).abs().max().item() <= 1


def _tiles(path) -> tuple[int, int]:
    """What a library built at ``path`` says of its tiles in this process (int8, bf16)."""
    import ctypes

    lib = ctypes.CDLL(str(path))
    return lib.pdlkit_amx_tiles(0), lib.pdlkit_amx_tiles(1)


@needs_amx
def test_the_shipped_build_passes_its_tile_self_test():
    """The library as shipped runs its tile code right here (amx_selftest.h): its AMX
    kernels use the tiles (a failed self-test would quietly run the AVX-512 path)."""
    from pdlkit.kernels.x86 import qlinear_vnni as v
    from pdlkit.runtime_abi.native_build import build_library

    lib = build_library(v.SOURCE, "x86_64", extra=("-fopenmp",))
    assert _tiles(lib) == (1, int(AMX_BF16))


@needs_amx
def test_a_build_whose_tiles_fault_declines_them_and_computes(vnni, capfd):
    """A build whose tile configuration faults (the one GCC 12 produced: every tile 0 rows,
    SIGILL at the first tile instruction; -DPDLKIT_AMX_BROKEN_CONFIG) does not crash: its self
    -test fails once, says so on stderr, and its AMX kernel gives the VNNI kernel's outputs."""
    from pdlkit.kernels.x86 import qlinear_vnni as v
    from pdlkit.runtime_abi.native_build import build_library
    from pdlkit.runtime_abi.native_load import load_native_library

    lib = build_library(v.SOURCE, "x86_64", extra=("-fopenmp", "-DPDLKIT_AMX_BROKEN_CONFIG"))
    broken = {k.name: k for k in load_native_library(lib)}
    x, w, ws, b, x_zp = _operands(64, 256, 128, torch.uint8)
    got, _ = _call(broken["qlinear_q_amx"], x, x_zp, w, ws, b, "gelu", "none", torch.uint8)
    want, _ = _call(vnni["qlinear_q_vnni"], x, x_zp, w, ws, b, "gelu", "none", torch.uint8)
    assert torch.equal(got, want)
    err = capfd.readouterr().err
    assert "AMX int8 tile code faulted (SIGILL) in its self-test" in err
    assert "its AMX kernels run their AVX-512 path instead" in err
    assert _tiles(lib) == (0, 0)


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
    assert f"qlinear_q_pt_{'amx' if AMX_INT8 else 'vnni'}" in st["by_kernel"]


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


# rows past the last block of 32, K in several chunks, several row groups of the add +
# LayerNorm entry (each a view of its rows for the engine), asymmetric weights (per-row terms)
@needs_amx
@pytest.mark.parametrize(("m", "k", "n"), [(77, 3072, 768), (400, 256, 768), (64, 128, 200)])
@pytest.mark.parametrize("threads", [1, 2])
def test_amx_add_layer_norm_matches_vnni_on_row_views(amx, vnni, m, k, n, threads):
    x, w, ws, b, x_zp = _operands(m, k, n, torch.uint8, seed=m + k)
    g = torch.Generator().manual_seed(n)
    res, gamma, beta = (
        torch.randn(m, n, generator=g),
        torch.rand(n, generator=g) + 0.5,
        torch.randn(n, generator=g),
    )
    wz = torch.randint(-3, 4, (n,), generator=g)
    attrs = {"x_scale": 0.02, "x_zp": x_zp, "normalized_shape": [n], "eps": 1e-12}
    attrs.update(out_scale=8 / 255, out_zp=128, out_qmin=0, out_qmax=255)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        outs = [
            decl.fn(x, 0.02, x_zp, decl.prepack(w, attrs), ws, wz, b, res, [n], gamma, beta,
                    1e-12, 8 / 255, 128, 0, 255)
            for decl in (amx["qlinear_add_layer_norm_q_amx"], vnni["qlinear_add_layer_norm_q_vnni"])
        ]  # fmt: skip
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(outs[0][0], outs[1][0], rtol=0, atol=0)
    assert torch.equal(outs[0][1], outs[1][1])

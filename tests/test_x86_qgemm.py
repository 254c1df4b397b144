"""qlinear_q_vnni / qlinear_vnni (kernels/x86/qlinear_vnni.py): one AVX-512 VNNI GEMM with the
epilogue fused (kernels/x86/qgemm_vnni.c)."""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import VNNI, on_this_host
from pdlkit.runtime_abi.registry import load_kernel_file

import pdlkit

ROOT = Path(__file__).resolve().parents[1]

if not VNNI:
    pytest.skip(
        "qlinear_q_vnni is declared for x86-64 hosts with avx512_vnni", allow_module_level=True
    )
if shutil.which(os.environ.get("CC", "cc")) is None:
    pytest.skip("no C compiler (cc / $CC) to build qgemm_vnni.c", allow_module_level=True)
pytest.importorskip(
    "torchao", reason="the qlinear_q reference needs torchao (pip install -e '.[quant]')"
)


@pytest.fixture(scope="module")
def decls():
    return {k.name: k for k in load_kernel_file(ROOT / "kernels" / "x86" / "qlinear_vnni.py")}


@pytest.fixture(scope="module")
def kernel(decls):
    return decls["qlinear_q_vnni"]


def _reference(*args):
    from pdlkit.kernels.ops.logical_ops import qlinear_q

    return qlinear_q(*args)


def _call_f32(kernel, x_q, xs, xzp, w_q, ws, wz, b, post, algo):
    packed = kernel.prepack(w_q, {"x_scale": xs, "x_zp": xzp, "post_op": post, "algorithm": algo})
    return kernel.fn(x_q, xs, xzp, packed, ws, wz, b, post, algo)


def _call(kernel, args):
    names = (
        "x_scale",
        "x_zp",
        "out_scale",
        "out_zp",
        "out_qmin",
        "out_qmax",
        "post_op",
        "algorithm",
    )
    x_q, xs, xzp, w_q, ws, wz, b, os_, ozp, qmin, qmax, post, algo = args
    packed = kernel.prepack(
        w_q, dict(zip(names, (xs, xzp, os_, ozp, qmin, qmax, post, algo), strict=True))
    )
    return kernel.fn(x_q, xs, xzp, packed, ws, wz, b, os_, ozp, qmin, qmax, post, algo)


POSTS = [("none", ""), ("relu", ""), ("gelu", "none"), ("gelu", "tanh")]
# M = 1 and M % 6 tails, K % 4 and K < 4, N % 16 / N % 64 tails, N > 64 (several panels)
SHAPES = [((1, 7), 5), ((5, 33), 17), ((2, 3, 70), 9), ((17, 64), 63), ((4, 1), 1), ((3, 256), 130)]


def _operands(g, x_shape, n, w_zp_nonzero):
    k = x_shape[-1]
    x_q = torch.randint(0, 256, x_shape, generator=g, dtype=torch.uint8)
    w_q = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    ws = torch.rand(n, generator=g) * 0.01 + 1e-3
    wz = (
        torch.randint(-4, 5, (n,), generator=g)
        if w_zp_nonzero
        else torch.zeros(n, dtype=torch.int64)
    )
    b = torch.randn(n, generator=g) if n % 2 else None
    return x_q, w_q, ws, wz, b


@pytest.mark.parametrize(("post", "algo"), POSTS)
# (qmin, qmax, zero point): uint8, int8, and 7-bit codes (quantize(..., reduce_range=True))
@pytest.mark.parametrize("qrange", [(0, 255, 3), (-128, 127, -5), (0, 127, 3)])
def test_matches_the_reference_within_one_code(kernel, post, algo, qrange):
    g = torch.Generator().manual_seed(0)
    for x_shape, n in SHAPES:
        for w_zp_nonzero in (False, True):
            k = x_shape[-1]
            x_q, w_q, ws, wz, b = _operands(g, x_shape, n, w_zp_nonzero)
            # out_scale small enough for the outputs to span (and saturate) the code range
            args = (
                x_q, 0.02, 117, w_q, ws, wz, b, 0.01 * math.sqrt(k), qrange[2], qrange[0],
                qrange[1], post, algo,
            )  # fmt: skip
            want, got = _reference(*args), _call(kernel, args)
            assert got.dtype == want.dtype and got.shape == want.shape
            diff = (got.int() - want.int()).abs()
            assert diff.max().item() <= 1, (x_shape, n, w_zp_nonzero)
            assert diff.float().mean().item() < 0.05  # a code apart only where the float sums tie
            if want.numel() >= 64:
                assert want.int().unique().numel() > 20  # not all clamped


@pytest.mark.parametrize(("post", "algo"), POSTS)
def test_float32_output_matches_the_reference(decls, post, algo):
    from pdlkit.kernels.ops.logical_ops import qlinear

    g = torch.Generator().manual_seed(3)
    for x_shape, n in SHAPES:
        for w_zp_nonzero in (False, True):
            x_q, w_q, ws, wz, b = _operands(g, x_shape, n, w_zp_nonzero)
            args = (x_q, 0.02, 117, w_q, ws, wz, b, post, algo)
            got, want = _call_f32(decls["qlinear_vnni"], *args), qlinear(*args)
            assert got.dtype == torch.float32 and got.shape == want.shape
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


def test_non_contiguous_activations_strided_rows_and_no_rows(kernel):
    g = torch.Generator().manual_seed(1)
    w_q = torch.randint(-127, 128, (12, 40), generator=g, dtype=torch.int8)
    ws, wz, b = (
        torch.rand(12, generator=g) * 0.01,
        torch.zeros(12, dtype=torch.int64),
        torch.randn(12),
    )
    x_q = torch.randint(0, 256, (40, 6), generator=g, dtype=torch.uint8).t()  # transposed
    args = (x_q, 0.02, 128, w_q, ws, wz, b, 0.05, 3, 0, 255, "gelu", "none")
    assert (_call(kernel, args).int() - _reference(*args).int()).abs().max() <= 1
    # BERT's pooler: x[:, 0] of [B, S, K], rows S * K bytes apart, read in place
    rows = torch.randint(0, 256, (3, 5, 40), generator=g, dtype=torch.uint8)[:, 0]
    args = (rows, *args[1:])
    assert (_call(kernel, args).int() - _reference(*args).int()).abs().max() <= 1
    empty = (torch.empty(0, 40, dtype=torch.uint8), *args[1:])
    assert _call(kernel, empty).shape == (0, 12)


def test_the_openmp_build_splits_gemms_over_torch_threads_with_identical_results(kernel):
    g = torch.Generator().manual_seed(6)
    x_q, w_q, ws, wz, b = _operands(g, (301, 256), 200, False)  # 2^24 multiply-adds: parallel
    args = (x_q, 0.02, 117, w_q, ws, wz, b, 0.05, 3, 0, 255, "gelu", "none")
    before = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            outs.append(_call(kernel, args))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(outs[0], outs[1])  # tiles are independent: no reduction across threads
    assert (outs[1].int() - _reference(*args).int()).abs().max() <= 1


@pytest.fixture(scope="module")
def plain():
    """qgemm_vnni.c built with -DPDLKIT_SCALAR_REFERENCE: the same kernels, through the same C
    ABI, on the plain C path (libm erff / tanhf / nearbyintf) the tests compare with."""
    from pdlkit.runtime_abi.native_build import build_library
    from pdlkit.runtime_abi.native_load import load_native_library

    source = ROOT / "kernels" / "x86" / "qgemm_vnni.c"
    lib = build_library(source, "x86_64", extra=("-DPDLKIT_SCALAR_REFERENCE",))
    return {k.name: k for k in load_native_library(lib)}


ACT_POSTS = {0: ("none", ""), 1: ("relu", ""), 2: ("gelu", "none"), 3: ("gelu", "tanh")}


def _run_c(kernels, x_q, w_q, ws, act, x_scale=1.0, x_zp=0):
    """``qlinear_vnni`` of ``kernels`` (the library, or its plain C build), float32 output:
    act(x_scale * ws[n] * (x - x_zp) . w[n])."""
    post, algo = ACT_POSTS[act]
    wz = torch.zeros(w_q.shape[0], dtype=torch.int64)
    return _call_f32(kernels["qlinear_vnni"], x_q, x_scale, x_zp, w_q, ws, wz, None, post, algo)


@pytest.mark.parametrize(("act", "approximate"), [(2, "none"), (3, "tanh")])
@pytest.mark.parametrize("out_scale", [0.03, 0.002])
def test_quantized_gelu_codes(decls, act, approximate, out_scale):
    """GELU followed by a quantize uses the cheaper degree-3 form (gelu_avx512.h, qgelu16):
    its codes against float64 GELU quantized, y over [-6, 6] (K = 1: y = s x[m] w[n]). An
    error of at most 3e-6 moves a code only where GELU lands that close to a rounding
    boundary: by one, on a few in ten thousand of the values at the finer scale."""
    x_q = torch.arange(256, dtype=torch.uint8).reshape(256, 1)
    w_q = torch.arange(-127, 128, dtype=torch.int8).reshape(255, 1)
    s = 6.0 / (255 * 127)
    ws = torch.full((255,), s, dtype=torch.float32)
    y = (x_q.double() @ w_q.double().t()) * float(torch.tensor(s, dtype=torch.float32))
    inv = float(torch.tensor(1.0 / out_scale, dtype=torch.float32))
    want = (F.gelu(y, approximate=approximate) * inv).round().add(7).clamp(0, 255)
    wz = torch.zeros(255, dtype=torch.int64)
    args = (x_q, 1.0, 0, w_q, ws, wz, None, out_scale, 7, 0, 255, "gelu", approximate)
    got = _call(decls["qlinear_q_vnni"], args)
    diff = (got.double() - want).abs()
    assert diff.max().item() <= 1
    assert (diff > 0).double().mean().item() < 1e-3
    assert want.unique().numel() > 100  # the codes span the range, not all clamped


def test_an_unknown_post_op_is_declined(decls):
    """The kernel picks one of 12 specialised GEMMs by (activation, output kind): a post op
    it has none for is declined per call (the reference runs), not looked up out of range."""
    x_q, w_q, ws, wz, _ = _operands(torch.Generator().manual_seed(5), (3, 8), 5, False)
    for post, algo in (("sigmoid", ""), ("gelu", "exact"), ("relu", "tanh")):
        with pytest.raises(pdlkit.KernelUnsupported, match="post op"):
            _call_f32(decls["qlinear_vnni"], x_q, 0.02, 3, w_q, ws, wz, None, post, algo)


def test_vnni_path_equals_the_plain_c_path(decls, plain):
    g = torch.Generator().manual_seed(4)
    for (m, k), n in [((13, 131), 70), ((6, 4), 64), ((1, 1030), 3)]:
        x_q, w_q, ws, _, _ = _operands(g, (m, k), n, False)
        for act in (0, 1):
            fast, plain_c = (_run_c(d, x_q, w_q, ws, act, 0.02, 100) for d in (decls, plain))
            torch.testing.assert_close(fast, plain_c, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(("act", "approximate"), [(2, "none"), (3, "tanh")])
def test_vectorised_gelu_accuracy(decls, plain, act, approximate):
    """The AVX-512 GELU (piecewise degree-4 tables) against float64 GELU, y in [-12, 12]:
    K = 1, so y = x_scale * w_scale * x[m] * w[n] over every u8 x s8 product."""
    x_q = torch.arange(256, dtype=torch.uint8).reshape(256, 1)
    w_q = torch.arange(-127, 128, dtype=torch.int8).reshape(255, 1)
    s = 12.0 / (255 * 127)
    ws = torch.full((255,), s, dtype=torch.float32)
    y = (x_q.double() @ w_q.double().t()) * float(torch.tensor(s, dtype=torch.float32))
    want = F.gelu(y, approximate=approximate)
    for kernels in (decls, plain):
        got = _run_c(kernels, x_q, w_q, ws, act).double()
        err = (got - want).abs() / want.abs().clamp(min=1.0)
        assert err.max().item() < 2e-6, (kernels is plain, err.max().item())


def quantize_static(model: torch.nn.Module, x: torch.Tensor) -> torch.nn.Module:
    from pdlkit.quantization import quantize

    return quantize(model, (x,), scheme="int8-static")


class Net(torch.nn.Module):
    def __init__(self, d: int, h: int):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(d, h), torch.nn.Linear(h, d)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


def _int8_weight_of(model: torch.nn.Module, shape: tuple[int, ...]) -> torch.Tensor:
    found = [
        t for t in [*model.parameters(), *model.buffers(), *vars(model).values()]
        if isinstance(t, torch.Tensor) and t.dtype == torch.int8 and tuple(t.shape) == shape
    ]  # fmt: skip
    assert len(found) == 1, [tuple(t.shape) for t in found]
    return found[0]


def test_weight_changed_in_place_after_compilation_is_packed_again():
    torch.manual_seed(0)
    x = torch.randn(6, 16)
    q = quantize_static(Net(16, 48).eval(), x)
    pdlkit.stats(reset=True)
    with torch.no_grad():
        f = pdlkit.optimize(q)
        for _ in range(3):
            torch.testing.assert_close(f(x), q(x), rtol=0, atol=0.02)
        w = _int8_weight_of(q, (48, 16))
        w.copy_(torch.randint(-127, 128, w.shape, dtype=torch.int8))  # bumps its version
        ref = q(x)
        torch.testing.assert_close(f(x), ref, rtol=0, atol=0.02)
    st = pdlkit.stats()["by_kernel"][on_this_host("qlinear_q_vnni")]
    assert st["kernel_calls"] == 4 and st["prepack_misses"] == 2
    assert pdlkit.stats()["fallbacks"] == 0


def test_quantized_bert_ffn_gemms_use_the_kernel():
    transformers = pytest.importorskip("transformers", reason="the BERT test needs transformers")
    from pdlkit.quantization import cosine_similarity

    torch.manual_seed(0)
    config = transformers.BertConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
        vocab_size=100, max_position_embeddings=32, initializer_range=0.2,
    )  # fmt: skip
    model, ids = transformers.BertModel(config).eval(), torch.randint(0, 100, (2, 16))
    q = quantize_static(model, ids)
    pdlkit.stats(reset=True)
    with torch.no_grad():
        ref = q(ids).last_hidden_state
        out = pdlkit.optimize(q)(ids).last_hidden_state
    st = pdlkit.stats()
    assert (
        st["by_kernel"][on_this_host("qlinear_q_vnni")]["kernel_calls"] == config.num_hidden_layers
    )
    # Q, K, V per layer: one GEMM with the attention after it; the pooler: float32 output; the
    # attention output and FFN down projections carry their add + LayerNorm (+ quantize, but
    # in the last block)
    calls = config.num_hidden_layers
    assert st["by_kernel"][on_this_host("qkv_attention_q_merged_vnni")]["kernel_calls"] == calls
    assert st["by_kernel"][on_this_host("qlinear_vnni")]["kernel_calls"] == 1
    assert st["by_kernel"][on_this_host("qlinear_add_layer_norm_q_vnni")]["kernel_calls"] == 3
    assert st["by_kernel"][on_this_host("qlinear_add_layer_norm_vnni")]["kernel_calls"] == 1
    assert st["fallbacks"] == 0
    assert cosine_similarity(ref, out) >= 0.999
    torch.testing.assert_close(out, ref, rtol=0, atol=0.1)


def test_scales_and_bias_are_read_at_every_call(kernel):
    """The per-site pointer cache keeps tensors, not values: an in-place update shows."""
    g = torch.Generator().manual_seed(5)
    x_q, w_q, ws, wz, b = _operands(g, (6, 32), 7, False)
    attrs = dict(x_scale=0.02, x_zp=120, out_scale=0.05, out_zp=3, out_qmin=0, out_qmax=255)
    packed = kernel.prepack(w_q, {**attrs, "post_op": "none", "algorithm": ""})

    def call():
        return kernel.fn(x_q, 0.02, 120, packed, ws, wz, b, 0.05, 3, 0, 255, "none", "")

    first = call()
    ws.mul_(0.5)
    b.add_(1.0)
    want = _reference(x_q, 0.02, 120, w_q, ws, wz, b, 0.05, 3, 0, 255, "none", "")
    assert (call().int() - want.int()).abs().max() <= 1
    assert not torch.equal(first, want)


def test_onednn_kernel_gives_7_bit_codes_as_the_reference():
    """oneDNN saturates to the whole uint8 range; qlinear_q_onednn clamps a 7-bit output range
    ([0, 127]: quantize(..., reduce_range=True)) after it, the reference's codes."""
    onednn = {k.name: k for k in load_kernel_file(ROOT / "kernels" / "x86" / "qlinear_onednn.py")}
    g = torch.Generator().manual_seed(0)
    x_q, w_q, ws, wz, b = _operands(g, (9, 64), 40, False)
    args = (x_q, 0.02, 117, w_q, ws, wz, b, 0.08, 3, 0, 127, "relu", "")
    want, got = _reference(*args), _call(onednn["qlinear_q_onednn"], args)
    assert want.max().item() == 127 and got.max().item() == 127  # saturated codes
    assert (got.int() - want.int()).abs().max().item() <= 1

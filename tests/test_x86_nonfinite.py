"""NaN, infinities and huge values through the x86 kernels (kernels/x86): what eager torch gives.

Float results keep NaN where eager does (ReLU of NaN is NaN); GELU of a huge pre-activation is
exactly y or 0; where a kernel cannot tell what torch would give (a NaN scale or bias, a NaN
in attention's inputs) it declines the call and the reference runs.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import on_this_host
from pdlkit.runtime_abi.capability import host
from pdlkit.runtime_abi.native_build import host_arch
from pdlkit.runtime_abi.registry import load_kernel_file

import pdlkit

ROOT = Path(__file__).resolve().parents[1]
X86 = ROOT / "kernels" / "x86"
NAN, INF = float("nan"), float("inf")

if host_arch() != "x86_64" or not {"avx512_vnni", "avx512_bf16"} <= host().features:
    pytest.skip("the x86 kernels need avx512_vnni and avx512_bf16", allow_module_level=True)
if shutil.which(os.environ.get("CC", "cc")) is None:
    pytest.skip("no C compiler (cc / $CC) to build the x86 kernels", allow_module_level=True)
pytest.importorskip("torchao", reason="the references need torchao (pip install -e '.[quant]')")

from pdlkit.kernels.ops import logical_ops as ref  # noqa: E402


@pytest.fixture(scope="module")
def bf16():
    return {k.name: k for k in load_kernel_file(X86 / "linear_bf16.py")}


@pytest.fixture(scope="module")
def vnni():
    return {k.name: k for k in load_kernel_file(X86 / "qlinear_vnni.py")}


@pytest.fixture(scope="module")
def onednn():
    return {k.name: k for k in load_kernel_file(X86 / "qlinear_onednn.py")}


@pytest.fixture(scope="module")
def attention():
    from pdlkit.kernels.x86 import attention

    return attention.x86_attention_q_bf16.fn


def _same_nan_and_close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert torch.equal(got.isnan(), want.isnan())
    finite = ~want.isnan()
    torch.testing.assert_close(got[finite], want[finite], rtol=2**-7, atol=1e-2)


# -- BF16 linears --------------------------------------------------------------------------------


def test_bf16_linear_relu_keeps_nan_and_infinities_where_eager_has_them(bf16):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, 40, generator=g).bfloat16()
    x[1, 3], x[3, 0], x[5, 39] = NAN, INF, -INF  # NaN rows, inf - inf, +-inf rows
    w = (torch.randn(70, 40, generator=g) / 8).bfloat16()
    w[:, 0] = w[:, 0].abs()  # row 3 (x = +inf at k = 0): +inf everywhere, not NaN
    b = torch.randn(70, generator=g).bfloat16()
    decl = bf16["linear_relu_bf16"]
    got = decl.fn(x, decl.prepack(w, {}), b)
    want = torch.relu(F.linear(x, w, b))
    assert got[1].isnan().all() and (got[3] == INF).all()
    _same_nan_and_close(got.float(), want.float())


def test_bf16_model_with_a_nan_input_gives_eager_nans_through_the_fused_kernel():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU()).eval().bfloat16()
    x = torch.randn(6, 32).bfloat16()
    x[2, 5] = NAN
    pdlkit.stats(reset=True)
    with torch.no_grad():
        want = model(x)
        got = pdlkit.optimize(model)(x)
    st = pdlkit.stats()
    assert (
        st["by_kernel"][on_this_host("linear_relu_bf16")]["kernel_calls"] == 1
        and st["fallbacks"] == 0
    )
    assert got[2].isnan().all()
    _same_nan_and_close(got.float(), want.float())


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_bf16_gelu_of_huge_pre_activations_is_exactly_y_or_zero(bf16, approximate):
    x = torch.tensor([[1.0], [-1.0]], dtype=torch.bfloat16)
    w = torch.tensor([[1e6], [3e30], [-1e6], [-3e30], [6.0], [-6.0]], dtype=torch.bfloat16)
    decl = bf16["linear_gelu_bf16"]
    got = decl.fn(x, decl.prepack(w, {"approximate": approximate}), None, approximate)
    y = F.linear(x.float(), w.float())
    want = torch.where(y > 0, y, torch.zeros_like(y)).bfloat16()  # GELU beyond |y| = 6
    assert torch.equal(got[:, :4], want[:, :4])
    torch.testing.assert_close(got.float(), F.gelu(y, approximate=approximate), atol=1e-5, rtol=0)


# -- int8 GEMMs ----------------------------------------------------------------------------------


def _qargs(g, n=24, k=40, post="relu", algo=""):
    x_q = torch.randint(0, 256, (5, k), generator=g, dtype=torch.uint8)
    w_q = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    ws = torch.rand(n, generator=g) * 0.01 + 1e-3
    return x_q, 0.02, 117, w_q, ws, torch.zeros(n, dtype=torch.int64), torch.randn(n), post, algo


def _call(decl, args):
    attrs = {
        p: a for p, a in zip(decl.params, args, strict=True) if not isinstance(a, torch.Tensor)
    }
    return decl.fn(*args[:3], decl.prepack(args[3], attrs), *args[4:])


@pytest.mark.parametrize("where", ["bias", "w_scale"])
@pytest.mark.parametrize("value", [NAN, INF])
@pytest.mark.parametrize("family", ["vnni", "onednn"])
def test_qlinear_declines_a_non_finite_bias_or_scale(vnni, onednn, family, where, value):
    """A NaN or inf in the epilogue's terms: the reference runs (its NaN / inf, and the codes
    torch's quantize_per_tensor gives them, are torch's to define; oneDNN gave a NaN code -128
    where torch gives 0)."""
    decls = vnni if family == "vnni" else onednn
    args = list(_qargs(torch.Generator().manual_seed(1)))
    args[6 if where == "bias" else 4][3] = value
    with pytest.raises(pdlkit.KernelUnsupported, match="not finite"):
        _call(decls[f"qlinear_{family}"], tuple(args))
    qargs = (*args[:7], 0.05, 3, -128, 127, *args[7:])
    with pytest.raises(pdlkit.KernelUnsupported, match="not finite"):
        _call(decls[f"qlinear_q_{family}"], qargs)


def test_quantized_model_with_a_nan_bias_gives_eager_nans():
    from pdlkit.quantization import quantize

    torch.manual_seed(0)
    x = torch.randn(4, 16)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    q = quantize(net.eval(), (x,), scheme="int8-static")
    biases = [t for t in q.parameters() if t.shape == (8,)]
    assert len(biases) == 1
    with torch.no_grad():
        biases[0][2] = NAN
        want = q(x)
        pdlkit.stats(reset=True)
        got = pdlkit.optimize(q)(x)
    assert want[:, 2].isnan().all()
    assert torch.equal(got.isnan(), want.isnan())
    torch.testing.assert_close(got[~want.isnan()], want[~want.isnan()], rtol=0, atol=0.02)
    assert pdlkit.stats()["fallbacks"] >= 1


def _k1_gemm(vnni, values, act, out_kind, out_scale=1.0):
    """y = values[n] (K = 1: x = 1, w = 1, w_scale = values) through the kernels, float32
    (out_kind 2: qlinear_vnni) or uint8 codes with zero point 128 (out_kind 0: qlinear_q_vnni)."""
    n = len(values)
    post = ("gelu", "tanh" if act == 3 else "none")
    x_q = torch.ones(1, 1, dtype=torch.uint8)
    w_q = torch.ones(n, 1, dtype=torch.int8)
    ws, wz = torch.tensor(values, dtype=torch.float32), torch.zeros(n, dtype=torch.int64)
    attrs = {"x_scale": 1.0, "x_zp": 0, "post_op": post[0], "algorithm": post[1]}
    if out_kind == 2:
        k = vnni["qlinear_vnni"]
        return k.fn(x_q, 1.0, 0, k.prepack(w_q, attrs), ws, wz, None, *post)[0]
    k = vnni["qlinear_q_vnni"]
    attrs.update(out_scale=out_scale, out_zp=128, out_qmin=0, out_qmax=255)
    packed = k.prepack(w_q, attrs)
    return k.fn(x_q, 1.0, 0, packed, ws, wz, None, out_scale, 128, 0, 255, *post)[0]


@pytest.mark.parametrize("act", [2, 3])  # GELU erf, tanh
def test_float_gelu_of_huge_pre_activations_is_y_or_exactly_zero(vnni, act):
    y = [1e6, -1e6, 1e20, -1e20, 6.0, -6.0, 5.7, -5.7]
    got = _k1_gemm(vnni, y, act, 2)
    assert got[1] == 0.0 and got[3] == 0.0  # not a polynomial's 1e-7 of -1e6
    torch.testing.assert_close(got[[0, 2]], torch.tensor([1e6, 1e20]), rtol=3e-7, atol=0)
    want = F.gelu(torch.tensor(y), approximate="tanh" if act == 3 else "none")
    torch.testing.assert_close(got, want, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("act", [2, 3])
def test_quantized_gelu_of_huge_negative_pre_activations_is_the_zero_point(vnni, act):
    """GELU(y) is 0 to float32's resolution below y = -5.66: code 128 exactly, even where a
    table's tiny error at its edge (2e-8 of y) would be many codes (-1e9: -20, 400 codes at this
    output scale)."""
    y = [-1e9, -3e7, -1e6, -40.0, -5.7, 1e9, 3.0]
    got = _k1_gemm(vnni, y, act, 0, out_scale=0.05)
    assert got.tolist() == [128, 128, 128, 128, 128, 255, 128 + 60]


def _ln_args(g, n=20, k=16, m=4, signed=True):
    return [
        torch.randint(0, 256, (m, k), generator=g, dtype=torch.uint8), 0.02, 120,
        torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8),
        torch.rand(n, generator=g) * 0.01 + 1e-3, torch.zeros(n, dtype=torch.int64),
        torch.randn(n, generator=g), torch.randn(m, n, generator=g), [n], torch.rand(n) + 0.5,
        torch.randn(n) * 0.1, 1e-5, 8 / 255, 5 if signed else 128,
        *((-128, 127) if signed else (0, 255)),
    ]  # fmt: skip


@pytest.mark.parametrize("value", [NAN, INF, 1e20])
def test_add_layer_norm_declines_a_residual_row_torch_turns_into_nan(vnni, value):
    """torch's LayerNorm gives NaN for a row with a NaN, an infinity, or (in a short row) a
    value whose square overflows float32 (1e20: its variance goes through x^2), where two
    passes would not."""
    args = _ln_args(torch.Generator().manual_seed(3), n=3)
    args[7][1, 2] = value
    assert ref.qlinear_add_layer_norm_q(*args)[0][1].isnan().all()
    with pytest.raises(pdlkit.KernelUnsupported, match="LayerNorm gives NaN"):
        _call(vnni["qlinear_add_layer_norm_q_vnni"], tuple(args))


def test_add_layer_norm_codes_of_nan_are_what_quantize_per_tensor_gives(vnni):
    """A NaN LayerNorm weight makes its column NaN (as in eager); torch's quantize_per_tensor
    turns NaN into code 0, whatever the zero point: int8 codes with zero point 5 here."""
    args = _ln_args(torch.Generator().manual_seed(4))
    args[9][3] = NAN
    y, codes = _call(vnni["qlinear_add_layer_norm_q_vnni"], tuple(args))
    want_y, want_codes = ref.qlinear_add_layer_norm_q(*args)
    assert y[:, 3].isnan().all() and want_y[:, 3].isnan().all()
    assert (codes[:, 3] == 0).all() and (want_codes[:, 3] == 0).all()
    assert (codes.int() - want_codes.int()).abs().max() <= 1


# -- attention -----------------------------------------------------------------------------------


def _attn_args(g, mask=None, b=1, h=2, s=9, d=16):
    q, k, v = (torch.randn(b, h, s, d, generator=g) for _ in "qkv")
    return [q, k, v, mask, 0, 0.0, 0.01, 128, 0, 255]


@pytest.mark.parametrize(
    ("where", "value"),
    [(0, NAN), (1, INF), (2, NAN), (2, -INF), (3, NAN), (3, INF)],
    ids=["q nan", "k inf", "v nan", "v -inf", "mask nan", "mask +inf"],
)
def test_attention_declines_non_finite_inputs(attention, where, value):
    g = torch.Generator().manual_seed(4)
    args = _attn_args(g, mask=torch.zeros(1, 1, 9, 9))
    args[where] = args[where].clone()
    args[where][0, 0, 2, 3] = value
    with pytest.raises(pdlkit.KernelUnsupported, match="not finite"):
        attention(*args)


def test_attention_declines_scores_that_overflow(attention):
    g = torch.Generator().manual_seed(5)
    args = _attn_args(g)
    args[0] = args[0] * 1e20
    args[1] = args[1] * 1e20  # q . k about 1e40: inf in float32
    with pytest.raises(pdlkit.KernelUnsupported, match="not finite"):
        attention(*args)


def test_attention_mask_of_minus_inf_still_computes_fully_masked_rows_as_zeros(attention):
    g = torch.Generator().manual_seed(6)
    mask = torch.zeros(1, 1, 9, 9)
    mask[..., 4, :] = -INF
    mask[..., 2, 5:] = -INF
    args = _attn_args(g, mask=mask)
    out = attention(*args)
    assert (out[:, :, 4] == 128).all()  # zeros before the quantize, as torch's SDPA on the CPU
    assert (out.int() - ref.attention_q(*args).int()).abs().max() <= 1


def test_attention_mask_of_the_float_minimum_averages_a_fully_masked_row_as_eager(attention):
    """HF's additive masks use torch.finfo(float32).min, not -inf: a fully masked row then has
    equal scores (the mask absorbs q . k) and torch averages v over it."""
    g = torch.Generator().manual_seed(7)
    mask = torch.zeros(1, 1, 9, 9)
    mask[..., 4, :] = torch.finfo(torch.float32).min
    args = _attn_args(g, mask=mask)
    args[6] = 0.004
    want = ref.attention_q(*args)
    assert (want[:, :, 4] != 128).any()  # the mean of v, not zeros
    assert (attention(*args).int() - want.int()).abs().max() <= 1


def test_qkv_attention_declines_a_non_finite_projection_bias(vnni):
    from pdlkit.kernels.ops.logical_ops import _qkv_attention_examples

    args = list(_qkv_attention_examples(torch.float32)[1])
    args[6] = args[6].clone()
    args[6][0] = NAN  # bq
    decl = vnni["qkv_attention_q_merged_vnni"]
    attrs = {
        p: a for p, a in zip(decl.params, args, strict=True) if not isinstance(a, torch.Tensor)
    }
    attrs.update(wk=args[7], wv=args[11])
    with pytest.raises(pdlkit.KernelUnsupported, match="not finite"):
        decl.fn(*args[:3], decl.prepack(args[3], attrs), *args[4:])

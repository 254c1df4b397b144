"""qlinear_q_intmm (kernels/x86/qlinear_intmm.py): x ^ 0x80 -> torch._int_mm -> C epilogue."""

from __future__ import annotations

import ctypes
import math
import os
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from pdlkit.runtime_abi.capability import host
from pdlkit.runtime_abi.native_build import host_arch
from pdlkit.runtime_abi.registry import load_kernel_file

import pdlkit

ROOT = Path(__file__).resolve().parents[1]

if host_arch() != "x86_64" or "avx512_vnni" not in host().features:
    pytest.skip(
        "qlinear_q_intmm is declared for x86-64 hosts with avx512_vnni", allow_module_level=True
    )
if shutil.which(os.environ.get("CC", "cc")) is None:
    pytest.skip("no C compiler (cc / $CC) to build int8_epilogue.c", allow_module_level=True)
pytest.importorskip(
    "torchao", reason="the qlinear_q reference needs torchao (pip install -e '.[quant]')"
)


@pytest.fixture(scope="module")
def kernel():
    decls = {k.name: k for k in load_kernel_file(ROOT / "kernels" / "x86" / "qlinear_intmm.py")}
    return decls["qlinear_q_intmm"]


def _reference(*args):
    from pdlkit.kernels.reference.logical_ops import qlinear_q

    return qlinear_q(*args)


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
SHAPES = [((1, 7), 5), ((5, 33), 17), ((2, 3, 70), 9), ((17, 64), 63), ((4, 1), 1), ((3, 256), 130)]


@pytest.mark.parametrize(("post", "algo"), POSTS)
@pytest.mark.parametrize("signed_out", [False, True])
def test_matches_the_reference_within_one_code(kernel, post, algo, signed_out):
    g = torch.Generator().manual_seed(0)
    for x_shape, n in SHAPES:
        for w_zp_nonzero in (False, True):
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
            qrange = (-128, 127, -5) if signed_out else (0, 255, 3)
            # out_scale small enough for the outputs to span (and saturate) the code range
            args = (
                x_q,
                0.02,
                117,
                w_q,
                ws,
                wz,
                b,
                0.01 * math.sqrt(k),
                qrange[2],
                qrange[0],
                qrange[1],
                post,
                algo,
            )
            want, got = _reference(*args), _call(kernel, args)
            assert got.dtype == want.dtype and got.shape == want.shape
            diff = (got.int() - want.int()).abs()
            assert diff.max().item() <= 1, (x_shape, n, w_zp_nonzero)
            assert diff.float().mean().item() < 0.05  # a code apart only where the float sums tie
            if want.numel() >= 64:
                assert want.int().unique().numel() > 20  # not all clamped


def test_non_contiguous_activations_and_no_rows(kernel):
    g = torch.Generator().manual_seed(1)
    w_q = torch.randint(-127, 128, (12, 40), generator=g, dtype=torch.int8)
    ws, wz, b = (
        torch.rand(12, generator=g) * 0.01,
        torch.zeros(12, dtype=torch.int64),
        torch.randn(12),
    )
    x_q = torch.randint(0, 256, (40, 6), generator=g, dtype=torch.uint8).t()  # strided
    args = (x_q, 0.02, 128, w_q, ws, wz, b, 0.05, 3, 0, 255, "gelu", "none")
    assert (_call(kernel, args).int() - _reference(*args).int()).abs().max() <= 1
    empty = (torch.empty(0, 40, dtype=torch.uint8), *args[1:])
    assert _call(kernel, empty).shape == (0, 12)


@pytest.mark.parametrize("why", ["large weight", "threads"])
def test_where_onednn_is_faster_the_kernel_calls_it(kernel, monkeypatch, why):
    g = kernel.fn.__globals__
    if why == "large weight":
        monkeypatch.setitem(g, "INTMM_MAX_WEIGHT", 100)
    else:
        monkeypatch.setitem(g, "SERIAL_MAX_OUTPUT", 10)
        monkeypatch.setitem(g, "_threads", lambda: 2)
    calls = []

    def int_mm(*a):
        calls.append(1)
        return torch._int_mm(*a)

    monkeypatch.setitem(g, "_int_mm", int_mm)
    gen = torch.Generator().manual_seed(2)
    w_q = torch.randint(-127, 128, (24, 40), generator=gen, dtype=torch.int8)
    ws, wz, b = (
        torch.rand(24, generator=gen) * 0.01,
        torch.zeros(24, dtype=torch.int64),
        torch.randn(24),
    )
    x_q = torch.randint(0, 256, (2, 5, 40), generator=gen, dtype=torch.uint8)
    for post, algo in POSTS:
        args = (x_q, 0.02, 120, w_q, ws, wz, b, 0.05, 3, 0, 255, post, algo)
        assert (_call(kernel, args).int() - _reference(*args).int()).abs().max() <= 1
    assert not calls


def _epilogue_f32(
    kernel, acc: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor, act: int, scalar: bool
) -> torch.Tensor:
    """The epilogue alone in float32-output mode: act(acc * scale + bias), x_zp = 128."""
    g = kernel.fn.__globals__
    lib, params_t = g["_LIB"], g["_Params"]
    m, n = acc.shape
    colcorr = torch.zeros(n, dtype=torch.int32)
    p = params_t(
        n=n,
        k=1,
        colcorr=colcorr.data_ptr(),
        x_scale=1.0,
        inv_out_scale=1.0,
        x_zp=128,
        act=act,
        out_kind=2,
    )
    out = torch.empty(m, n)
    run = lib.pdlkit_qepi_run_scalar if scalar else lib.pdlkit_qepi_run
    acc = acc.clone()
    run(
        acc.data_ptr(),
        m,
        out.data_ptr(),
        n,
        scale.data_ptr(),
        bias.data_ptr(),
        None,
        None,
        0,
        ctypes.addressof(p),
    )
    return out


@pytest.mark.parametrize(("act", "approximate"), [(2, "none"), (3, "tanh")])
def test_vectorised_gelu_accuracy(kernel, act, approximate):
    """The AVX-512 GELU (piecewise degree-4 tables) against float64 GELU, y in [-12, 12]."""
    n = 37  # a masked tail
    acc = torch.arange(-1_200_000, 1_200_000, 7, dtype=torch.int32)
    acc = acc[: acc.numel() // n * n].reshape(-1, n)
    scale, bias = torch.full((n,), 1e-5), torch.zeros(n)
    y = acc.double() * 1e-5
    want = F.gelu(y, approximate=approximate)
    assert kernel.fn.__globals__["_LIB"].pdlkit_qepi_init() == 1  # this host runs AVX-512
    for scalar in (False, True):
        got = _epilogue_f32(kernel, acc, scale, bias, act, scalar).double()
        err = (got - want).abs() / want.abs().clamp(min=1.0)
        assert err.max().item() < 2e-6, (scalar, err.max().item())


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
    st = pdlkit.stats()["by_kernel"]["qlinear_q_intmm"]
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
    assert st["by_kernel"]["qlinear_q_intmm"]["kernel_calls"] == config.num_hidden_layers
    assert st["fallbacks"] == 0
    assert cosine_similarity(ref, out) >= 0.999
    torch.testing.assert_close(out, ref, rtol=0, atol=0.1)

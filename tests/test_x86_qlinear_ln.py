"""qlinear_add_layer_norm[_q]_vnni (kernels/x86/qlinear_vnni.py): a PT2E transformer block's
output projection, residual add, LayerNorm and quantize as one VNNI GEMM
(patterns/x86/qlinear_add_layer_norm.pdl.mlir, the epilogue in kernels/x86/qgemm_vnni.c)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
from conftest import VNNI, on_this_host
from pdlkit.runtime_abi.registry import load_kernel_file

import pdlkit

ROOT = Path(__file__).resolve().parents[1]

if not VNNI:
    pytest.skip(
        "the VNNI kernels are declared for x86-64 hosts with avx512_vnni", allow_module_level=True
    )
if shutil.which(os.environ.get("CC", "cc")) is None:
    pytest.skip("no C compiler (cc / $CC) to build qgemm_vnni.c", allow_module_level=True)
pytest.importorskip("torchao", reason="the references need torchao (pip install -e '.[quant]')")


@pytest.fixture(scope="module")
def decls():
    return {k.name: k for k in load_kernel_file(ROOT / "kernels" / "x86" / "qlinear_vnni.py")}


def _operands(g, x_shape, n, *, w_zp=False, affine=(True, True), codes=(0, 255)):
    """The arguments of qlinear_add_layer_norm_q ((x_q, ..., eps, out_scale, ...)); the codes'
    scale covers the LayerNorm's output range of about +-4, as a calibrated observer's would."""
    k = x_shape[-1]
    x_q = torch.randint(0, 256, x_shape, generator=g, dtype=torch.uint8)
    w_q = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    ws = torch.rand(n, generator=g) * 0.01 + 1e-3
    wz = torch.randint(-4, 5, (n,), generator=g) if w_zp else torch.zeros(n, dtype=torch.int64)
    b = torch.randn(n, generator=g)
    res = torch.randn(*x_shape[:-1], n, generator=g) * 3
    gamma = torch.rand(n, generator=g) + 0.5 if affine[0] else None
    beta = torch.randn(n, generator=g) * 0.1 if affine[1] else None
    zp = 128 if codes[0] == 0 else 0
    return (x_q, 0.02, 120, w_q, ws, wz, b, res, [n], gamma, beta, 1e-12, 8 / 255, zp, *codes)


def _call(decl, args):
    """Pre-pack and call as a compiled graph does (the pre-pack sees the non-tensor args)."""
    params = decl.params
    attrs = {p: a for p, a in zip(params, args, strict=True) if not isinstance(a, torch.Tensor)}
    packed = decl.prepack(args[3], attrs)
    return decl.fn(*args[:3], packed, *args[4:])


def _reference(args):
    from pdlkit.kernels.ops.logical_ops import qlinear_add_layer_norm_q

    return qlinear_add_layer_norm_q(*args)


# M = 1 and M % 6 tails, K % 4, N % 16 and N % 64 tails, several panels, 3-D activations,
# M across row groups (126 rows per group at N = 256)
SHAPES = [((1, 7), 5), ((5, 33), 17), ((2, 3, 70), 130), ((2, 150, 40), 256)]


@pytest.mark.parametrize(("x_shape", "n"), SHAPES)
def test_matches_the_reference_float32_and_codes(decls, x_shape, n):
    args = _operands(torch.Generator().manual_seed(n), x_shape, n)
    y, codes = _call(decls["qlinear_add_layer_norm_q_vnni"], args)
    want_y, want_codes = _reference(args)
    assert y.shape == codes.shape == (*x_shape[:-1], n) and codes.dtype == torch.uint8
    torch.testing.assert_close(y, want_y, rtol=1e-4, atol=1e-4)
    assert (codes.int() - want_codes.int()).abs().max() <= 1


@pytest.mark.parametrize(
    ("affine", "w_zp", "codes"),
    [
        ((False, False), False, (0, 255)),
        ((True, False), True, (-128, 127)),
        ((False, True), False, (-128, 127)),
    ],
)
def test_layer_norms_without_weight_or_bias_asymmetric_weights_and_int8_codes(
    decls, affine, w_zp, codes
):
    g = torch.Generator().manual_seed(3)
    args = _operands(g, (13, 48), 72, w_zp=w_zp, affine=affine, codes=codes)
    y, q = _call(decls["qlinear_add_layer_norm_q_vnni"], args)
    want_y, want_q = _reference(args)
    assert q.dtype == (torch.int8 if codes[0] < 0 else torch.uint8)
    torch.testing.assert_close(y, want_y, rtol=1e-4, atol=1e-4)
    assert (q.int() - want_q.int()).abs().max() <= 1


def test_the_float32_only_op_is_the_first_output_of_the_quantized_one(decls):
    args = _operands(torch.Generator().manual_seed(4), (9, 64), 96)
    y = _call(decls["qlinear_add_layer_norm_vnni"], args[:12])
    assert torch.equal(y, _call(decls["qlinear_add_layer_norm_q_vnni"], args)[0])


def test_a_layer_norm_over_more_than_the_gemm_row_is_declined(decls):
    args = list(_operands(torch.Generator().manual_seed(5), (4, 16), 8))
    args[8] = [4, 8]  # normalized_shape: the last two dims
    with pytest.raises(
        pdlkit.KernelUnsupported, match=r"layer_norm over \[4, 8\], not the GEMM's row \[8\]"
    ):
        _call(decls["qlinear_add_layer_norm_q_vnni"], args)


def test_a_broadcast_residual_is_declined(decls):
    args = list(_operands(torch.Generator().manual_seed(6), (4, 16), 8))
    args[7] = torch.randn(8)  # broadcasts over the rows: the kernel reads [M, N]
    with pytest.raises(pdlkit.KernelUnsupported, match=r"residual \(8,\)"):
        _call(decls["qlinear_add_layer_norm_q_vnni"], args)


def test_the_openmp_build_splits_row_groups_over_torch_threads_identically(decls):
    decl = decls["qlinear_add_layer_norm_q_vnni"]
    args = _operands(torch.Generator().manual_seed(7), (301, 256), 256)  # 2^24 MACs: parallel
    before = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 2, 3):  # 301 rows = 51 blocks of 6: uneven shares, a short last block
            torch.set_num_threads(threads)
            outs.append(_call(decl, args))
    finally:
        torch.set_num_threads(before)
    for out in outs[1:]:
        assert torch.equal(outs[0][0], out[0]) and torch.equal(outs[0][1], out[1])


class Block(torch.nn.Module):
    """A transformer block's tail: projection, dropout, residual add, LayerNorm, then a
    quantized linear that reads the LayerNorm and an add that reads it again."""

    def __init__(self, d: int):
        super().__init__()
        self.fc, self.drop = torch.nn.Linear(d, d), torch.nn.Dropout(0.1)
        self.ln, self.out = torch.nn.LayerNorm(d), torch.nn.Linear(d, d)

    def forward(self, x):
        h = self.ln(self.drop(self.fc(x)) + x)
        return self.out(h) + h


def test_pt2e_block_becomes_one_kernel_call_with_two_outputs():
    from pdlkit.quantization import quantize

    torch.manual_seed(0)
    x = torch.randn(2, 7, 40)
    q = quantize(Block(40).eval(), (x,), scheme="int8-static")
    report = pdlkit.explain(q, x)
    assert report.counts() == {"qlinear_dropout_add_layer_norm_q": 1, "qlinear": 1}
    lines = report.graphs[0].graph_after.splitlines()
    after = "\n".join(line for line in lines if not line.lstrip().startswith("#"))  # code only
    kernel = on_this_host("qlinear_add_layer_norm_q_vnni")
    assert after.count(f"torch.ops.pdlkit.{kernel}.default(") == 1
    # the block's GEMM, eval dropout, add, LayerNorm and quantize are gone (the quantize left
    # is the input's); both outputs are used: the float32 one by the last add, the codes by
    # the last linear
    for gone in ("aten.linear", "aten.dropout", "aten.layer_norm", "dequantize_per_tensor"):
        assert gone not in after, gone
    assert after.count("quantize_per_tensor.default(") == 1
    assert f'"f32[2, 7, 40]" = {kernel}_default[0]' in after
    assert f'"u8[2, 7, 40]" = {kernel}_default[1]' in after
    pdlkit.stats(reset=True)
    with torch.no_grad():
        ref = q(x)
        out = pdlkit.optimize(q)(x)
    assert pdlkit.stats()["by_kernel"][kernel]["kernel_calls"] == 1
    assert pdlkit.stats()["fallbacks"] == 0
    torch.testing.assert_close(out, ref, rtol=0, atol=0.05)  # a code of the last linear's input

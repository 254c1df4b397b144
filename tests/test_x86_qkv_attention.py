"""qkv_attention_q_merged_vnni (kernels/x86/qlinear_vnni.py): a PT2E self-attention block's Q, K
and V projections as one VNNI GEMM, then attention.c on head views of its output, batch by
batch (patterns/x86/qkv_attention.pdl.mlir)."""

from __future__ import annotations

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

if host_arch() != "x86_64" or not {"avx512_vnni", "avx512_bf16"} <= host().features:
    pytest.skip(
        "the kernel is declared for x86-64 hosts with avx512_vnni and avx512_bf16",
        allow_module_level=True,
    )
if shutil.which(os.environ.get("CC", "cc")) is None:
    pytest.skip("no C compiler (cc / $CC) to build the kernels", allow_module_level=True)
pytest.importorskip("torchao", reason="the references need torchao (pip install -e '.[quant]')")

from pdlkit.kernels.ops.logical_ops import (  # noqa: E402
    _qkv_attention_examples,
    qkv_attention_q_merged,
)


@pytest.fixture(scope="module")
def decl():
    decls = {k.name: k for k in load_kernel_file(ROOT / "kernels" / "x86" / "qlinear_vnni.py")}
    return decls["qkv_attention_q_merged_vnni"]


def _call(decl, args):
    """Pre-pack and call as a compiled graph does: the pre-pack sees the non-tensor args and
    the prepack_with weights (wk, wv) by name."""
    attrs = {
        p: a for p, a in zip(decl.params, args, strict=True) if not isinstance(a, torch.Tensor)
    }
    attrs.update(wk=args[7], wv=args[11])
    return decl.fn(*args[:3], decl.prepack(args[3], attrs), *args[4:])


EXAMPLES = _qkv_attention_examples(torch.float32)


@pytest.mark.parametrize("args", EXAMPLES, ids=[str(tuple(a[0].shape)) for a in EXAMPLES])
def test_matches_the_reference_within_one_code(decl, args):
    # S = 1, K % 4, one head, D % 16, no bias, bool / float / no mask, causal, int8 codes
    out = _call(decl, args)
    want = qkv_attention_q_merged(*args)
    assert out.shape == want.shape and out.dtype == want.dtype
    diff = (out.int() - want.int()).abs()
    assert diff.max() <= 1  # BF16 products: a value beside a rounding boundary moves a code
    assert diff.float().mean() < 0.15


def test_weights_of_different_shapes_are_declined(decl):
    args = list(EXAMPLES[1])
    args[11] = args[11][:-1]  # wv with one row less than wq
    with pytest.raises(pdlkit.KernelUnsupported, match=r"Q, K, V weights .*not one \[N, K > 0\]"):
        _call(decl, args)


def test_a_view_that_does_not_split_the_projection_into_heads_is_declined(decl):
    args = list(EXAMPLES[1])  # N = 16 = 2 heads x 8
    args[15] = [2, 7, -1, 5]
    with pytest.raises(pdlkit.KernelUnsupported, match=r"does not split N = 16 into heads"):
        _call(decl, args)


def test_a_mask_that_does_not_broadcast_is_declined(decl):
    args = list(EXAMPLES[1])  # B 2, S 7
    args[16] = torch.ones(2, 1, 7, 3, dtype=torch.bool)
    with pytest.raises(pdlkit.KernelUnsupported, match=r"attn_mask dim 3 is 3, not 1 or 7"):
        _call(decl, args)


def test_the_openmp_build_gives_the_same_codes_on_two_threads(decl):
    args = EXAMPLES[-1]
    big = list(args)  # bert-mini's shape: GEMMs and heads large enough to go parallel
    g = torch.Generator().manual_seed(3)
    big[0] = torch.randint(0, 256, (2, 64, 256), generator=g, dtype=torch.uint8)
    for i in (3, 7, 11):
        big[i] = torch.randint(-127, 128, (256, 256), generator=g, dtype=torch.int8)
        big[i + 1] = torch.rand(256, generator=g) * 0.001 + 1e-4
        big[i + 2] = torch.zeros(256, dtype=torch.int64)
        big[i + 3] = torch.randn(256, generator=g)
    big[15] = [2, 64, -1, 64]
    big[16] = None
    before = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            outs.append(_call(decl, big))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(outs[0], outs[1])


class SelfAttention(torch.nn.Module):
    """HF BERT's self-attention and output projection: Q, K, V linears split into heads by a
    view, SDPA with a bool mask and an explicit scale, the heads merged, the output linear."""

    def __init__(self, d: int, heads: int):
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(d, d) for _ in range(3))
        self.out, self.heads = torch.nn.Linear(d, d), heads

    def forward(self, x, mask):
        b, s, d = x.shape
        q, k, v = (
            p(x).view(b, s, -1, d // self.heads).transpose(1, 2) for p in (self.q, self.k, self.v)
        )
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=(d // self.heads) ** -0.5)
        return self.out(y.transpose(1, 2).reshape(b, s, d))


def test_pt2e_self_attention_becomes_one_kernel_call():
    from pdlkit.quantization import quantize

    torch.manual_seed(0)
    x = torch.randn(2, 12, 32)
    mask = (torch.rand(2, 1, 1, 12) > 0.2).expand(2, 1, 12, 12)
    q = quantize(SelfAttention(32, 4).eval(), (x, mask), scheme="int8-static")
    report = pdlkit.explain(q, x, mask)
    assert report.counts() == {"qkv_attention_q_merged_direct": 1, "qlinear": 1}
    lines = report.graphs[0].graph_after.splitlines()
    after = "\n".join(line for line in lines if not line.lstrip().startswith("#"))  # code only
    assert after.count("torch.ops.pdlkit.qkv_attention_q_merged_vnni.default(") == 1
    # three projections, their head views, SDPA and the merge are one call: one linear is left
    # (the output projection's, in the qlinear kernel), no SDPA, no transpose
    for gone in ("aten.linear", "scaled_dot_product_attention", "aten.transpose"):
        assert gone not in after, gone
    assert '"u8[2, 12, 32]" = torch.ops.pdlkit.qkv_attention_q_merged_vnni.default(' in after
    pdlkit.stats(reset=True)
    with torch.no_grad():
        ref = q(x, mask)
        out = pdlkit.optimize(q)(x, mask)
    st = pdlkit.stats()
    assert st["by_kernel"]["qkv_attention_q_merged_vnni"]["kernel_calls"] == 1
    assert st["fallbacks"] == 0
    # one code of the attention output moves the output projection by about its scale
    torch.testing.assert_close(out, ref, rtol=0, atol=0.05)

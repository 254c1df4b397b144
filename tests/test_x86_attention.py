"""The x86 attention kernel (kernels/x86/attention.c) and its PT2E pattern (attention.pdl.mlir)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import AVX512_BF16

import pdlkit

if not AVX512_BF16:
    pytest.skip(
        "the attention kernel needs an x86-64 CPU with AVX512_BF16", allow_module_level=True
    )
if shutil.which(os.environ.get("CC", "cc")) is None:
    pytest.skip("no C compiler to build kernels/x86/attention.c", allow_module_level=True)
pytest.importorskip("torchao.quantization.pt2e", reason="needs torchao (pip install -e '.[quant]')")

from pdlkit.kernels.ops import logical_ops as ref  # noqa: E402
from pdlkit.kernels.x86 import attention  # noqa: E402
from pdlkit.runtime_abi.kernel import KernelUnsupported  # noqa: E402

KERNEL = attention.x86_attention_q_bf16.fn
MERGED = attention.x86_attention_q_merged_bf16.fn
ROOT = Path(__file__).resolve().parents[1]


def _codes_close(out: torch.Tensor, want: torch.Tensor, share: float = 0.15) -> None:
    """Within one code everywhere, and few codes off by one (BF16 P V, see attention.c):
    up to 10% on these random N(0, 1) inputs with the output range calibrated to 255 codes
    (1.3-1.6% on bert-mini's real activations: benchmarks/x86_attention.py --bert-mini-model)."""
    assert out.shape == want.shape and out.dtype == want.dtype
    diff = (out.int() - want.int()).abs()
    assert diff.max().item() <= 1, diff.max().item()
    assert (diff > 0).float().mean().item() <= share, (diff > 0).float().mean().item()


@pytest.mark.parametrize("i", range(len(ref._attention_examples(torch.float32))))
def test_edge_shapes_masks_causal_strides(i):
    args = ref._attention_examples(torch.float32)[i]
    _codes_close(KERNEL(*args), ref.attention_q(*args))
    _codes_close(MERGED(*args), ref.attention_q_merged(*args))


def _calibrated(y: torch.Tensor, qmin: int = 0) -> tuple[float, int]:
    """out_scale / out_zp that map y's range (with 0) onto 256 codes from qmin, as PT2E's."""
    lo, hi = min(y.min().item(), 0.0), max(y.max().item(), 0.0)
    scale = (hi - lo) / 255
    return scale, qmin + round(-lo / scale)


@pytest.mark.parametrize("std", [3.0, 10.0, 30.0])
def test_large_activations_stay_within_one_code(std):
    """q, k of standard deviation 3 to 30 give logits in the tens to thousands, where BF16
    products (2^-9 relative each) would move the softmax's weights by far more than a code
    (3, 20, 55 codes before): such heads compute Q K^T in float32."""
    g = torch.Generator().manual_seed(int(std))
    b, h, s, d = 2, 4, 64, 64
    q, k = (torch.randn(b, h, s, d, generator=g) * std for _ in "qk")
    v = torch.randn(b, h, s, d, generator=g) * std
    scale, zp = _calibrated(F.scaled_dot_product_attention(q, k, v))
    args = (q, k, v, None, 0, 0.0, scale, zp, 0, 255)
    _codes_close(KERNEL(*args), ref.attention_q(*args))


def test_bert_mask_layout_and_fully_masked_rows():
    # bert-mini's PT2E graph: q, k, v head views of [B, S, H * D]; bool mask [B, 1, S, S] with
    # strides (0, S, 1, 0); here row 3 is masked out entirely (-> zeros -> the zero point)
    g = torch.Generator().manual_seed(1)
    b, h, s, d = 2, 4, 24, 64
    q, k, v = (
        torch.randn(b, s, h * d, generator=g).view(b, s, h, d).transpose(1, 2) for _ in "qkv"
    )
    row = torch.ones(s, dtype=torch.bool)
    row[3] = False
    mask = row[None, None, :, None].expand(b, 1, s, s)
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.125)
    assert y[:, :, 3].abs().max() == 0  # what torch gives for a fully masked row
    scale, zp = _calibrated(y)
    args = (q, k, v, mask, 0, 0.125, scale, zp, 0, 255)
    out = KERNEL(*args)
    _codes_close(out, ref.attention_q(*args))
    assert (out[:, :, 3] == zp).all()
    fmask = torch.where(mask, 0.0, float("-inf"))  # the same as a float mask
    assert torch.equal(KERNEL(q, k, v, fmask, 0, 0.125, scale, zp, 0, 255), out)


def test_declines_a_non_contiguous_last_dim():
    q = torch.randn(1, 2, 16, 8).transpose(-1, -2)  # [1, 2, 8, 16], last-dim stride 8
    k = v = torch.randn(1, 2, 8, 16)
    with pytest.raises(KernelUnsupported, match="last dim"):
        KERNEL(q, k, v, None, 0, 0.0, 0.01, 0, 0, 255)
    assert KERNEL(q.contiguous(), k, v, None, 0, 0.0, 0.01, 0, 0, 255).shape == (1, 2, 8, 16)


class AttentionThenQuantize(torch.nn.Module):
    """sdpa -> quantize_per_tensor, as the pattern's first form (heads not merged)."""

    def __init__(self, scale: float | None):
        super().__init__()
        self.scale = scale

    def forward(self, q, k, v, mask):
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)
        return torch.ops.quantized_decomposed.quantize_per_tensor(y, 0.01, 128, 0, 255, torch.uint8)


@pytest.mark.parametrize(
    ("scale", "pattern"), [(0.2, "attention_q"), (None, "attention_q_default_scale")]
)
def test_sdpa_then_quantize_becomes_one_kernel_call(scale, pattern):
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 3, 9, 20, generator=g) for _ in "qkv")
    mask = torch.randn(2, 1, 9, 9, generator=g)
    model = AttentionThenQuantize(scale)
    assert pdlkit.explain(model, q, k, v, mask).counts() == {pattern: 1}
    pdlkit.stats(reset=True)
    with torch.no_grad():
        out = pdlkit.optimize(model)(q, k, v, mask)
    _codes_close(out, model(q, k, v, mask))
    st = pdlkit.stats()["by_kernel"]["x86_attention_q_bf16"]
    assert (st["kernel_calls"], st["fallbacks"]) == (1, 0)


def _tiny_bert():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(
        vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=128, max_position_embeddings=32,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.BertModel(cfg).eval(), torch.randint(0, 100, (2, 12))


@pytest.mark.parametrize(
    ("patterns", "pattern", "kernel"),
    [  # the shipped set takes the Q, K, V projections along; attention.pdl.mlir alone does not
        (None, "qkv_attention_q_merged", "qkv_attention_q_merged_vnni"),
        ("attention.pdl.mlir", "attention_q_merged", "x86_attention_q_merged_bf16"),
    ],
)
def test_pt2e_bert_attention_is_substituted_and_matches_pt2e(patterns, pattern, kernel):
    from pdlkit.quantization import quantize

    model, ids = _tiny_bert()
    q = quantize(model, (ids,), scheme="int8-static")
    where = ROOT / "patterns" / "x86" / patterns if patterns else None
    counts = pdlkit.explain(q, ids, patterns=where).counts()
    attn = {k: n for k, n in counts.items() if "attention" in k}
    assert attn == {pattern: 2}  # one per layer
    pdlkit.stats(reset=True)
    with torch.no_grad():
        want = q(ids)[0]
        got = pdlkit.optimize(q, patterns=where)(ids)[0]
    # one attention output code (~1/255 of its range) moves a hidden state by far less
    torch.testing.assert_close(got, want, rtol=0.02, atol=0.02)
    st = pdlkit.stats()["by_kernel"][kernel]
    assert (st["kernel_calls"], st["fallbacks"]) == (2, 0)


def test_attention_without_quantize_is_left_alone():
    model, ids = _tiny_bert()  # FP32: attention feeds a float linear, no quantize_per_tensor
    counts = pdlkit.explain(model, ids).counts()
    assert not any(k.startswith("attention_q") for k in counts), counts


@pytest.mark.parametrize(
    ("sq", "sk", "d", "causal"),
    [(5, 9, 24, 1), (9, 5, 24, 1), (3, 300, 256, 0)],  # causal Sq != Sk; scratch past workspace
)
def test_causal_rectangular_and_large_scratch(sq, sk, d, causal):
    g = torch.Generator().manual_seed(3)
    q, k, v = torch.randn(1, 2, sq, d, generator=g), *torch.randn(2, 1, 2, sk, d, generator=g)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))
    scale, zp = _calibrated(y, -128)
    args = (q, k, v, None, causal, 0.0, scale, zp, -128, 127)  # s8 output, scale None
    _codes_close(KERNEL(*args), ref.attention_q(*args))


@pytest.mark.parametrize(
    "shape, threads",
    [((2, 4, 64, 64), 2), ((1, 2, 128, 64), 5)],  # both 2^21 MACs (B * H * S * S * D)
    ids=["heads-over-2-threads", "2-heads-over-5-threads"],
)
def test_heads_shared_over_torch_threads_give_identical_codes(shape, threads):
    """Large calls split their heads over all of torch's OpenMP threads (an -fopenmp build),
    more threads than heads too (one team size with the GEMMs around it: attention_core.h's
    attention_threads): each head is computed alone, so 1 and more threads give the same
    bytes, and threads without a head change nothing."""
    g = torch.Generator().manual_seed(4)
    q, k, v = torch.randn(3, *shape, generator=g)
    y = F.scaled_dot_product_attention(q, k, v)
    scale, zp = _calibrated(y)
    args = (q, k, v, None, 0, 0.0, scale, zp, 0, 255)
    before = torch.get_num_threads()
    try:
        outs = []
        for n in (1, threads):
            torch.set_num_threads(n)
            outs.append((KERNEL(*args), MERGED(*args)))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    _codes_close(outs[1][0], ref.attention_q(*args))

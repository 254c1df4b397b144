"""The attention of a decode step on CUDA (kernels/cuda/attention.py, patterns/cuda/attention.pdl.mlir).

On the CPU: which SDPA calls the pattern takes (one query token, not causal; GQA or not; a
mask or none), what the kernel declines, and the kernel in Triton's interpreter (a subprocess
with TRITON_INTERPRET=1) against torch's SDPA, alone and inside a compiled module. float32,
float16 and bfloat16 there (bfloat16 computed in float32: the interpreter's bf16 dot is wrong,
and it casts to bfloat16 by truncation); the GPU tests check bfloat16 at Llama-3's shapes.
"""

from __future__ import annotations

import textwrap

import pytest
import torch
import torch.nn.functional as F
from conftest import needs_gpu, run_interpreted

import pdlkit

pytest.importorskip("triton", reason="Triton is not installed (pip install triton)")


class Attention(torch.nn.Module):
    """What transformers' "sdpa" attention does with its projections' outputs, heads merged."""

    def __init__(self, gqa: bool, causal: bool = False, scale: float | None = 0.25) -> None:
        super().__init__()
        self.gqa, self.causal, self.scale = gqa, causal, scale

    def forward(self, q, k, v, mask=None):
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=self.causal, scale=self.scale, enable_gqa=self.gqa
        )
        return y.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)


class RepeatKV(torch.nn.Module):
    """transformers' "sdpa" attention where a mask keeps SDPA's own GQA off: ``repeat_kv``
    copies each cache head for its query heads first."""

    def __init__(self, scale: float | None = 0.25) -> None:
        super().__init__()
        self.scale = scale

    @staticmethod
    def repeat_kv(h: torch.Tensor, n: int) -> torch.Tensor:
        b, kv, s, d = h.shape
        return h[:, :, None, :, :].expand(b, kv, n, s, d).reshape(b, kv * n, s, d)

    def forward(self, q, k, v, mask=None):
        n = q.shape[1] // k.shape[1]
        k2, v2 = self.repeat_kv(k, n), self.repeat_kv(v, n)
        y = F.scaled_dot_product_attention(q, k2, v2, attn_mask=mask, scale=self.scale)
        return y.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)


def _qkv(b: int, hq: int, hkv: int, sq: int, length: int, d: int, device: str = "cpu", dtype=torch.float32):  # fmt: skip
    g = torch.Generator(device=device).manual_seed(b * 100 + length)
    q = torch.randn(b, hq, sq, d, generator=g, device=device).to(dtype)
    k = torch.randn(b, hkv, length, d, generator=g, device=device).to(dtype)
    v = torch.randn(b, hkv, length, d, generator=g, device=device).to(dtype)
    return q, k, v


def _kernels(model: torch.nn.Module, *args: torch.Tensor) -> list[str]:
    with torch.no_grad():
        report = pdlkit.explain(model, *args, target="cuda-sm90", autotune="off")
    return [s.kernel for s in report.substitutions]


@pytest.mark.parametrize("gqa,hkv", [(True, 2), (False, 8)])
def test_decode_attention_is_substituted_with_or_without_gqa(gqa, hkv):
    q, k, v = _qkv(3, 8, hkv, 1, 33, 16)
    assert _kernels(Attention(gqa), q, k, v) == ["decode_attention_triton"]
    assert _kernels(Attention(gqa, scale=None), q, k, v) == ["decode_attention_triton"]


def test_a_padding_mask_is_taken_too():
    q, k, v = _qkv(2, 4, 4, 1, 20, 16)
    mask = torch.ones(2, 1, 1, 20, dtype=torch.bool)
    assert _kernels(Attention(False), q, k, v, mask) == ["decode_attention_triton"]


@pytest.mark.parametrize("scale", [0.25, None])
def test_repeated_kv_heads_are_read_from_the_cache_itself(scale):
    """The repeat_kv copies go with the SDPA: the kernel takes the cache, heads grouped."""
    q, k, v = _qkv(2, 8, 2, 1, 33, 16)
    mask = torch.zeros(2, 1, 1, 33)
    with torch.no_grad():
        report = pdlkit.explain(RepeatKV(scale), q, k, v, mask, target="cuda-sm90", autotune="off")
    (site,) = report.substitutions
    assert site.kernel == "decode_attention_triton"
    assert sorted(site.replaced) == sorted(
        ["scaled_dot_product_attention", "reshape", "expand", "unsqueeze"]
        + ["reshape_1", "expand_1", "unsqueeze_1"]
    )
    assert site.pattern.startswith("decode_attention_repeat_kv")
    assert site.args[1].startswith("arg") and site.args[2].startswith("arg")  # the caches
    assert site.args[-1] == "True"  # their heads grouped


def test_a_repeat_of_the_cache_over_the_batch_is_no_repeat_kv():
    """A reshape that does not merge the copies into the heads is no repeat_kv: the plain
    pattern takes the SDPA, with the copies as its k and v."""

    class Other(torch.nn.Module):
        def forward(self, q, k, v):
            b, kv, s, d = k.shape
            k2 = k[:, :, None].expand(b, kv, 4, s, d).reshape(b * kv, 4, s, d)
            v2 = v[:, :, None].expand(b, kv, 4, s, d).reshape(b * kv, 4, s, d)
            return F.scaled_dot_product_attention(q, k2, v2, scale=0.25)

    q, k, v = _qkv(2, 4, 2, 1, 9, 16)
    q = q.repeat(2, 1, 1, 1)  # [4, 4, 1, 16]: the batch the repeat made
    with torch.no_grad():
        report = pdlkit.explain(Other(), q, k, v, target="cuda-sm90", autotune="off")
    (site,) = report.substitutions
    assert site.pattern == "decode_attention" and site.args[1:3] == ["reshape", "reshape_1"]


def test_prefill_and_causal_attention_keep_sdpa():
    q, k, v = _qkv(2, 8, 2, 5, 5, 16)  # five query tokens, causal: prefill
    assert _kernels(Attention(True, causal=True), q, k, v) == []
    q1 = q[:, :, :1]
    assert _kernels(Attention(True, causal=True), q1, k, v) == []  # one token, causal


def test_the_kernel_declines_what_it_does_not_compute():
    from pdlkit.kernels.cuda.attention import decode_attention_triton as kernel

    q, k, v = _qkv(2, 8, 2, 1, 12, 16)
    cases = {
        "query tokens": (q.expand(2, 8, 3, 16), k, v, None, 0, 0.0, 1),
        "is_causal": (q, k, v, None, 1, 0.0, 1),
        "query heads over": (q, k, v, None, 0, 0.0, 0),  # 8 over 2 heads without enable_gqa
        "mask of shape": (q, k, v, torch.ones(2, 1, 1, 11, dtype=torch.bool), 0, 0.0, 1),
        "head dims": (q, k, v[..., :8], None, 0, 0.0, 1),
        "unit-stride": (q, k.transpose(2, 3).contiguous().transpose(2, 3), v, None, 0, 0.0, 1),
    }
    for why, args in cases.items():
        with pytest.raises(pdlkit.KernelUnsupported, match=why):
            kernel.fn(*args)


_INTERPRETED = textwrap.dedent(
    """
    import json, sys, torch, pdlkit
    sys.path.insert(0, "tests")
    from pdlkit.kernels.cuda import attention as A
    from pdlkit.kernels.ops import attention_ops as O
    from test_cuda_attention import Attention, RepeatKV, _qkv
    out = {"examples": [], "declined": []}
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for ex in O._attention_examples(dtype):
            want = O.attention(*ex)
            try:
                got = A.decode_attention_triton.fn(*ex)
            except pdlkit.KernelUnsupported as e:
                out["declined"].append(str(e))
                continue
            out["examples"].append({"dtype": str(dtype), "shape": list(got.shape),
                                    "want": list(want.shape), "contiguous": got.is_contiguous(),
                                    "err": (got.float() - want.float()).abs().max().item()})
    from pdlkit.kernels.cuda._triton_attention import Tile, decode_attention
    q, k, v, m, _, scale, _ = O._attention_examples(torch.float32)[3]  # float mask per head
    want = O.attention(q, k, v, m, 0, scale, 1)
    for split in (1, 2, 3):  # 19 tokens in tiles of 8: one slice, two (16 + 3), three (8+8+3)
        for first in (True, False):  # a slice's partial tile first or last
            got = decode_attention(q, k, v, m.expand(2, 6, 1, 19), scale, Tile(8, split, tail_first=first))
            out[f"split {split} {first}"] = (got - want).abs().max().item()
    target = {"name": "cpu-triton-interpreter", "devices": ["cpu", "cuda"]}
    q, k, v = _qkv(3, 8, 2, 1, 21, 16)
    mask = torch.rand(3, 1, 1, 21, generator=torch.Generator().manual_seed(0)) > 0.4
    mask[..., 0] = True
    additive = torch.where(mask, 0.0, float("-inf"))  # transformers' float mask
    cases = [("gqa", None, Attention(True)), ("mask", mask, Attention(False)),
             ("repeat_kv", additive, RepeatKV())]
    for name, m, model in cases:
        kk, vv = (k, v) if m is None or name == "repeat_kv" else (k.repeat_interleave(4, 1), v.repeat_interleave(4, 1))
        args = (q, kk, vv) if m is None else (q, kk, vv, m)
        with torch.no_grad():
            want = model(*args)
            pdlkit.stats(reset=True)
            got = pdlkit.optimize(model, target=target, default_codegen="eager", autotune="off")(*args)
        calls = pdlkit.stats()["by_kernel"].get("decode_attention_triton", {}).get("kernel_calls", 0)
        out[name] = {"err": (got - want).abs().max().item(), "calls": calls}
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def interpreted():
    return run_interpreted(_INTERPRETED)


def test_decode_attention_matches_torch_sdpa_in_interpreter(interpreted):
    # the op's examples: GQA groups of 1 to 4, bool and float masks (per head, broadcast, a row
    # masked whole), odd lengths and head dims, a query that is a view of merged heads
    got = interpreted["examples"]
    assert len(got) == 15  # 5 decode examples a dtype; the prefill one declined
    assert interpreted["declined"] == ["5 query tokens: the decode kernel takes one"] * 3
    tolerance = {"torch.float32": 1e-5, "torch.float16": 2e-3, "torch.bfloat16": 2e-2}
    for e in got:
        assert e["shape"] == e["want"] and e["contiguous"]
        assert e["err"] < tolerance[e["dtype"]], e


@pytest.mark.parametrize("tail_first", [True, False])
def test_one_slice_or_several_of_the_cache_give_the_same_attention(interpreted, tail_first):
    for split in (1, 2, 3):
        assert interpreted[f"split {split} {tail_first}"] < 1e-5


def test_one_warp_a_program_where_the_pairs_fill_the_gpu_and_slices_where_they_do_not():
    from pdlkit.kernels.cuda._triton_attention import Rule, Tile

    rule = Rule(block_n=32, full_warps=1, full_block_n_mha=16)  # the default on a GPU
    assert rule.tile(64 * 32, 129, group=1) == Tile(16, 1, 1, 3)  # Llama-2-7B, 64 sequences
    assert rule.tile(64 * 8, 129, group=4) == Tile(32, 1, 1, 3)  # Llama-3, 64 sequences
    assert rule.tile(8, 129, group=4) == Tile(32, 8, 4, 3, tail_first=False)  # one sequence
    assert rule.tile(8, None, group=4).split == 64  # a length known only at run time
    assert Rule(32, 512, 4, 3).tile(64 * 32, 129) == Tile(32, 1, 4, 3)  # RULE_ENV's 4 numbers


def test_head_dims_over_128_keep_four_warps_a_program():
    from pdlkit.kernels.cuda import _triton_attention as T

    if T.INTERPRET:
        pytest.skip("under TRITON_INTERPRET=1 the interpreter's 8-token tiles apply")
    assert T.pick_tile(64 * 32, 129, 128, group=1) == T.Tile(16, 1, 1, 3)
    assert T.pick_tile(64 * 32, 129, 256, group=1) == T.Tile(16, 1, 4, 3)


@pytest.mark.parametrize("case", ["gqa", "mask", "repeat_kv"])
def test_compiled_module_runs_the_kernel_in_interpreter(interpreted, case):
    assert interpreted[case]["calls"] == 1
    assert interpreted[case]["err"] < 1e-5


# -- on the GPU ---------------------------------------------------------------------------------


def _reference(q, k, v, mask, gqa):
    """SDPA in float32 (the math of the bfloat16 inputs, without bfloat16 rounding inside)."""
    m = mask if mask is None or mask.dtype == torch.bool else mask.float()
    return F.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), attn_mask=m, scale=q.shape[-1] ** -0.5, enable_gqa=gqa
    )


@needs_gpu
@pytest.mark.parametrize("b", [1, 64])
@pytest.mark.parametrize("mask", ["none", "bool", "float"])
def test_gpu_decode_attention_at_llama3_shapes_in_bfloat16(b, mask):
    # Llama-3: 32 query heads over 8 key/value heads, head dim 128, 129 cached tokens
    from pdlkit.kernels.cuda.attention import decode_attention_triton as kernel

    q, k, v = _qkv(b, 32, 8, 1, 129, 128, "cuda", torch.bfloat16)
    m, gqa = None, True
    if mask != "none":  # transformers repeats the heads where it passes a mask
        k, v, gqa = k.repeat_interleave(4, 1), v.repeat_interleave(4, 1), False
        m = torch.rand(b, 1, 1, 129, device="cuda") > 0.3
        if mask == "float":
            m = torch.where(m, 0.0, float("-inf")).to(torch.bfloat16)
        m[..., 128] = True if mask == "bool" else 0.0
    got = kernel.fn(q, k, v, m, 0, 0.0, int(gqa))
    want = _reference(q, k, v, m, gqa)
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)
    bf16 = F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=gqa).float()
    assert (got.float() - want).abs().max() <= 2 * (bf16 - want).abs().max() + 1e-2


@needs_gpu
@pytest.mark.parametrize("b,length", [(1, 4096), (4, 1000)])
def test_gpu_long_caches_are_split_over_programs(b, length):
    from pdlkit.kernels.cuda.attention import decode_attention_triton as kernel

    q, k, v = _qkv(b, 32, 8, 1, length, 128, "cuda", torch.bfloat16)
    got = kernel.fn(q, k, v, None, 0, 0.0, 1)
    torch.testing.assert_close(got.float(), _reference(q, k, v, None, True), rtol=2e-2, atol=2e-2)


@needs_gpu
def test_gpu_compiled_decode_attention_in_a_cuda_graph():
    q, k, v = _qkv(64, 32, 8, 1, 129, 128, "cuda", torch.bfloat16)
    model = Attention(True, scale=128**-0.5)
    assert _kernels(model, q, k, v) == ["decode_attention_triton"]
    opt = pdlkit.optimize(model, autotune="off")
    with torch.no_grad():
        for _ in range(2):
            opt(q, k, v)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            got = opt(q, k, v)
        k.copy_(torch.randn_like(k))  # new cache contents, replayed in place
        graph.replay()
        torch.cuda.synchronize()
    want = _reference(q, k, v, None, True).transpose(1, 2).reshape(64, 1, -1)
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)

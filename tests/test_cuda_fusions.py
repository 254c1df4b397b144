"""The Llama fusions on CUDA (kernels/cuda/fused.py, patterns/cuda/llama.pdl.mlir).

On the CPU: the patterns against the graphs transformers' LlamaModel gives after
``quantize(..., "int8-dynamic-per-token")`` (MHA and GQA, prefill and decode), and the
kernels in Triton's interpreter (a subprocess with TRITON_INTERPRET=1) against their torch
references and end to end on a float32 Llama. float32 there: the interpreter rounds bfloat16
casts its own way (NumPy has no bfloat16); the GPU tests at the end check bfloat16.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch
from conftest import needs_gpu, run_interpreted

import pdlkit

pytest.importorskip("triton", reason="Triton is not installed (pip install triton)")
ROOT = Path(__file__).resolve().parent.parent


def _cuda_llama():
    pytest.importorskip("transformers", reason="pip install transformers")
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "cuda_llama", ROOT / "benchmarks" / "cuda_llama.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# the rotary embedding in one form or the other, whichever transformers is installed


def multiply_rope(self, x, position_ids):
    """LlamaRotaryEmbedding.forward as transformers 5.24 computes it: the frequencies as a
    broadcast multiply (the tests pin one form or the other: the GPU machine has 5.17)."""
    freqs = position_ids[..., None].float() * self.inv_freq.float()
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling
    return cos.to(x.dtype), sin.to(x.dtype)


def matmul_rope(self, x, position_ids):
    """LlamaRotaryEmbedding.forward as transformers up to 5.17 computed it (5.24 multiplies):
    the frequencies as a matmul of the expanded inverse frequencies and the positions, in
    float32 inside ``torch.autocast(..., enabled=False)``."""
    inv = self.inv_freq[None, :, None].expand(position_ids.shape[0], -1, 1).float()
    pos = position_ids[:, None, :].float()
    with torch.autocast(device_type=x.device.type, enabled=False):
        freqs = (inv @ pos).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling
    return cos.to(x.dtype), sin.to(x.dtype)


def _rope(monkeypatch, forward) -> None:
    try:
        from transformers.models.llama import modeling_llama
    except ImportError:
        return  # the tests that build a Llama skip without transformers
    monkeypatch.setattr(modeling_llama.LlamaRotaryEmbedding, "forward", forward)


@pytest.fixture(autouse=True)
def newer_rope(monkeypatch):
    _rope(monkeypatch, multiply_rope)


@pytest.fixture
def older_rope(monkeypatch, newer_rope):
    pytest.importorskip("transformers", reason="pip install transformers")
    _rope(monkeypatch, matmul_rope)


def _layer_kernels(
    config: str, row: str, dtype: torch.dtype = torch.bfloat16, patterns: str | None = None
) -> list[str]:
    from pdlkit.quantization import quantize

    L = _cuda_llama()
    model = L.build_model(config, "cpu").to(dtype)
    ids = torch.randint(0, L.VOCAB, (2, 8 if row == "prefill" else 1))
    q = quantize(model, (ids,), scheme="int8-dynamic-per-token")
    if row == "prefill":
        runner = L.Prefill(q)
    else:
        kv = L.make_kv(q, 2, 8, "cpu")
        kv.keys, kv.values = [k.to(dtype) for k in kv.keys], [v.to(dtype) for v in kv.values]
        runner = L.DecodeStep(q, kv)
    with torch.no_grad():
        report = pdlkit.explain(runner, ids, target="cuda-sm90", autotune="off", patterns=patterns)
    return sorted(s.kernel for s in report.substitutions)


# one decoder layer's kernels: q/k/v as one launch, o and down with their residual adds,
# gate + up as one, both RMSNorms with the quantization after them, and the two
# quantizations no norm precedes (attention output, gated product)
PER_LAYER = {
    "int8_linear3_triton": 1,
    "int8_linear_residual_triton": 2,
    "int8_gated_silu_triton": 1,
    "rmsnorm_quantize_triton": 2,
    "quantize_per_token_triton": 2,
}
# at decode also the attention of the one query token (patterns/cuda/attention.pdl.mlir);
# prefill keeps SDPA
DECODE = {**PER_LAYER, "decode_attention_triton": 1}


@pytest.mark.parametrize("row", ["prefill", "decode"])
@pytest.mark.parametrize("config", ["tiny", "tiny-mha"])
def test_llama_graph_gets_every_fusion(config, row):
    kernels = _layer_kernels(config, row)
    want = PER_LAYER if row == "prefill" else DECODE
    assert {k: kernels.count(k) for k in set(kernels)} == {k: 2 * n for k, n in want.items()}


def test_masked_decode_reads_the_cache_without_its_repeat():
    """With an attention mask transformers' "sdpa" attention repeats each K/V head for its
    query heads (repeat_kv) instead of SDPA's own GQA, as a static cache's generate does: the
    decode attention takes the cache itself, heads grouped."""
    L = _cuda_llama()
    model = L.build_model("tiny", "cpu")
    kv = L.make_kv(model, 2, 8, "cpu")

    class MaskedDecode(L.DecodeStep):
        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            m = self.model
            h = m.embed_tokens(ids)
            rope = m.rotary_emb(h, self.pos)
            mask = torch.zeros(ids.shape[0], 1, 1, self.kv.ctx + 1)  # additive: every key
            for layer in m.layers:
                h = layer(
                    h, attention_mask=mask, position_ids=self.pos, past_key_values=self.kv,
                    position_embeddings=rope,
                )  # fmt: skip
            return m.norm(h)

    ids = torch.randint(0, L.VOCAB, (2, 1))
    with torch.no_grad():
        report = pdlkit.explain(MaskedDecode(model, kv), ids, target="cuda-sm90", autotune="off")
    sites = [s for s in report.substitutions if s.kernel == "decode_attention_triton"]
    assert len(sites) == 2  # one a layer
    assert all(s.pattern == "decode_attention_repeat_kv" and s.args[-1] == "True" for s in sites)


def test_float32_llama_gets_the_same_fusions():
    kernels = _layer_kernels("tiny", "decode", torch.float32)
    assert {k: kernels.count(k) for k in set(kernels)} == {k: 2 * n for k, n in DECODE.items()}


def test_quantization_and_residual_gemm_as_one_op_where_a_manifest_enables_it(tmp_path):
    # patterns/cuda/int8.yaml ships quant_residual.pdl.mlir disabled; enabled, the two
    # quantizations no norm precedes join the o- and down-projections
    import pdlkit.patterns

    shipped = Path(pdlkit.patterns.__file__).parent / "cuda"  # installed, or this checkout's
    for f in ("int8_dynamic.pdl.mlir", "llama.pdl.mlir", "quant_residual.pdl.mlir"):
        (tmp_path / f).write_text((shipped / f).read_text())
    entries = "".join(
        f"  - file: {f}\n    targets: [cuda]\n"
        for f in ("int8_dynamic.pdl.mlir", "llama.pdl.mlir", "quant_residual.pdl.mlir")
    )
    (tmp_path / "int8.yaml").write_text(f"version: 1\npatterns:\n{entries}")
    kernels = _layer_kernels("tiny", "decode", patterns=str(tmp_path))
    want = {**PER_LAYER, "quant_int8_linear_residual_triton": 2}
    del want["int8_linear_residual_triton"], want["quantize_per_token_triton"]
    assert {k: kernels.count(k) for k in set(kernels)} == {k: 2 * n for k, n in want.items()}


def test_three_linears_of_one_input_are_three_ops_not_one_twice():
    # two linears over one input: the three-root pattern must not bind one GEMM twice
    from pdlkit.quantization.int8_dynamic import quantize_int8_dynamic

    class Two(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = (
                torch.nn.Linear(64, 32, bias=False),
                torch.nn.Linear(64, 48, bias=False),
            )

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return self.a(x), self.b(x)

    model = quantize_int8_dynamic(Two()).eval()
    with torch.no_grad():
        report = pdlkit.explain(model, torch.randn(4, 64), target="cuda-sm90", autotune="off")
    assert sorted(s.kernel for s in report.substitutions) == [
        "int8_linear_triton",
        "int8_linear_triton",
        "quantize_per_token_triton",
    ]


def test_fused_kernels_decline_an_empty_activation():
    from pdlkit.kernels.cuda import fused as F

    q, w = torch.zeros(0, 64, dtype=torch.int8), torch.zeros(32, 64, dtype=torch.int8)
    xs, ws = torch.zeros(0, 1), torch.ones(32)
    x0, g = torch.zeros(0, 64), torch.ones(64)
    calls = [
        lambda: F.rmsnorm_quantize_triton.fn(x0, g, 1e-6, 6, 1e-8, 127.0),
        lambda: F.int8_linear_residual_triton.fn(q, xs, w, ws, torch.zeros(0, 32), 6, [0, 32]),
        lambda: F.int8_linear3_triton.fn(q, xs, w, ws, w, ws, w, ws, 6),
        lambda: F.quant_int8_linear_residual_triton.fn(
            x0, 1e-8, 127.0, w, ws, torch.zeros(0, 32), 6, [0, 32]
        ),
    ]
    for call in calls:
        with pytest.raises(pdlkit.KernelUnsupported, match="no rows"):
            call()


# -- the rotary embedding's frequencies (kernels/cuda/rope.py) ----------------------------------


@pytest.mark.parametrize("row", ["prefill", "decode"])
def test_rope_frequencies_by_matmul_become_one_multiply(older_rope, row):
    kernels = _layer_kernels("tiny", row)
    want = {k: 2 * n for k, n in (PER_LAYER if row == "prefill" else DECODE).items()}
    assert {k: kernels.count(k) for k in set(kernels)} == {**want, "matmul_outer_pointwise": 1}


class _Outer(torch.nn.Module):
    def forward(self, a, b, c, d):
        top = a @ b  # inner dimension 1, outside any region: matched
        with torch.autocast("cpu", enabled=False):
            off = (a * 2) @ b  # inside a region with autocast off: matched
            inner2 = c @ d  # inner dimension 2
        with torch.autocast("cpu", dtype=torch.bfloat16):
            on = (a * 3) @ b  # autocast on: runs in bfloat16, not matched
        return top, off, inner2, on


def test_matmul_outer_only_where_the_inner_dimension_is_one_and_autocast_is_off():
    a, b = torch.randn(2, 8, 1), torch.randn(2, 1, 5)
    c, d = torch.randn(2, 8, 2), torch.randn(2, 2, 5)
    with torch.no_grad():
        report = pdlkit.explain(_Outer(), a, b, c, d, target="cuda-sm90", autotune="off")
    assert sorted(s.kernel for s in report.substitutions) == ["matmul_outer_pointwise"] * 2
    lines = sorted(s.user_line.rsplit(":", 1)[-1] for s in report.substitutions)
    first = _Outer.forward.__code__.co_firstlineno
    assert lines == [str(first + 1), str(first + 3)]  # top and off


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_multiply_equals_the_matmul_bit_for_bit(dtype):
    from pdlkit.kernels.cuda import rope

    g = torch.Generator().manual_seed(0)
    for (b, m), (b2, n) in [((1, 64), (1, 2048)), ((2, 8), (2, 5)), ((1, 8), (3, 5))]:
        a = torch.randn(b, m, 1, generator=g).to(dtype) * 100
        w = torch.randn(b2, 1, n, generator=g).to(dtype)
        assert torch.equal(rope.matmul_outer_pointwise.fn(a, w), torch.matmul(a, w))
    with pytest.raises(pdlkit.KernelUnsupported, match=r"\[\.\.\., M, 1\]"):
        rope.matmul_outer_pointwise.fn(torch.randn(2, 8, 2), torch.randn(2, 2, 5))


_INTERPRETED = textwrap.dedent(
    """
    import json, sys, torch, pdlkit
    sys.path.insert(0, "benchmarks"); sys.path.insert(0, "tests")
    from pdlkit.kernels.cuda import fused as F
    torch.manual_seed(0)
    out = {}
    for m, k in [(1, 7), (6, 96), (70, 40)]:
        x, w = torch.randn(m, k) * 2, torch.rand(k) + 0.5
        q, s = F.rmsnorm_quantize_triton.fn(x, w, 1e-6, 6, 1e-8, 127.0)
        rq, rs = F.rmsnorm_quantize_ref(x, w, 1e-6, 6, 1e-8, 127.0)
        out[f"norm {m}x{k}"] = [(q.int() - rq.int()).abs().max().item(),
                                ((s - rs).abs() / rs).max().item()]
    for m, k, n in [(1, 7, 3), (5, 40, 24), (70, 96, 33)]:  # 70 rows: the tiled GEMM
        q = torch.randint(-127, 128, (m, k), dtype=torch.int8)
        xs = torch.rand(m, 1) * 0.02
        ws = [torch.randint(-127, 128, (nn, k), dtype=torch.int8) for nn in (n, 16, 9)]
        ss = [torch.rand(nn) * 0.01 for nn in (n, 16, 9)]
        res = torch.randn(1, m, n)
        got = F.int8_linear_residual_triton.fn(q, xs, ws[0], ss[0], res, 6, [1, m, n])
        want = F.int8_linear_residual_ref(q, xs, ws[0], ss[0], res, 6, [1, m, n])
        args = (q, xs, ws[0], ss[0], ws[1], ss[1], ws[2], ss[2], 6)
        three = F.int8_linear3_triton.fn(*args)
        ref3 = F.int8_linear3_ref(*args)
        out[f"gemm {m}x{k}x{n}"] = {
            "residual_err": (got - want).abs().max().item(),
            "residual_shape": list(got.shape),
            "three_err": max((a - b).abs().max().item() for a, b in zip(three, ref3)),
            "three_shapes": [list(t.shape) for t in three],
        }
    for m, k, n in [(1, 40, 24), (1, 96, 33), (5, 64, 16)]:  # 5 rows: two launches
        x = torch.randn(m, k) * 3
        x[0, 5] = 40.0  # one outlier: a row's scale is its own
        w = torch.randint(-127, 128, (n, k), dtype=torch.int8)
        ws, res = torch.rand(n) * 0.01, torch.randn(m, 1, n)
        args = (x, 1e-8, 127.0, w, ws, res, 6, [m, 1, n])
        got = F.quant_int8_linear_residual_triton.fn(*args)
        want = F.quant_int8_linear_residual_ref(*args)
        out[f"quant gemm {m}x{k}x{n}"] = {"err": (got - want).abs().max().item(),
                                          "scale": want.abs().max().item(),
                                          "shape": list(got.shape)}
    import cuda_llama as L
    from pdlkit.quantization import quantize
    target = {"name": "cpu-triton-interpreter", "devices": ["cpu", "cuda"]}
    from transformers.models.llama import modeling_llama
    from test_cuda_fusions import matmul_rope, multiply_rope
    for row in ("prefill", "decode", "decode, matmul rope"):
        rope = matmul_rope if "rope" in row else multiply_rope
        modeling_llama.LlamaRotaryEmbedding.forward = rope
        model = L.build_model("tiny", "cpu").float()
        ids = torch.randint(0, L.VOCAB, (2, 8 if row == "prefill" else 1))
        qm = quantize(model, (ids,), scheme="int8-dynamic-per-token")
        def runner():
            if row == "prefill":
                return L.Prefill(qm)
            kv = L.make_kv(qm, 2, 8, "cpu")
            kv.keys, kv.values = [t.float() for t in kv.keys], [t.float() for t in kv.values]
            return L.DecodeStep(qm, kv)
        with torch.no_grad():
            want = runner()(ids)
            pdlkit.stats(reset=True)
            opt = pdlkit.optimize(runner(), target=target, default_codegen="eager", autotune="off")
            got = opt(ids)
        calls = {k: v.get("kernel_calls", 0) for k, v in pdlkit.stats()["by_kernel"].items()}
        out[row] = {"err": (got - want).abs().max().item(), "scale": want.abs().max().item(),
                    "calls": calls}
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def interpreted():
    pytest.importorskip("transformers", reason="pip install transformers")
    return run_interpreted(_INTERPRETED)


def test_rmsnorm_quantize_matches_the_torch_ops_in_interpreter(interpreted):
    for shape in ("1x7", "6x96", "70x40"):
        codes, scale = interpreted[f"norm {shape}"]
        assert codes == 0, shape  # float32: the same codes
        assert scale < 1e-6, shape  # the sum of squares in another order


def test_residual_epilogue_and_three_gemms_match_references_in_interpreter(interpreted):
    for m, k, n in [(1, 7, 3), (5, 40, 24), (70, 96, 33)]:
        got = interpreted[f"gemm {m}x{k}x{n}"]
        assert got["residual_err"] < 1e-4
        assert got["residual_shape"] == [1, m, n]
        assert got["three_err"] < 1e-4  # int32 sums are exact; float epilogue
        assert got["three_shapes"] == [[m, n], [m, 16], [m, 9]]


def test_quantization_inside_the_residual_gemm_matches_the_two_ops_in_interpreter(interpreted):
    # one row: one launch that quantizes it (K = 96: two K slices); 5 rows: quant_rows, the GEMM
    for m, k, n in [(1, 40, 24), (1, 96, 33), (5, 64, 16)]:
        got = interpreted[f"quant gemm {m}x{k}x{n}"]
        assert got["shape"] == [m, 1, n]
        assert got["err"] <= 1e-5 * got["scale"]  # the same codes and scales: float rounding only


@pytest.mark.parametrize("row", ["prefill", "decode", "decode, matmul rope"])
def test_float32_llama_end_to_end_in_interpreter(interpreted, row):
    got = interpreted[row]
    assert got["err"] < 1e-3 * got["scale"]
    want = {k: 2 * n for k, n in (PER_LAYER if row == "prefill" else DECODE).items()}
    rope = {"matmul_outer_pointwise": 1} if "rope" in row else {}
    assert got["calls"] == {**want, **rope}


# -- on the GPU ---------------------------------------------------------------------------------


@needs_gpu
@pytest.mark.parametrize("m", [1, 16, 64, 200])
def test_gpu_fused_kernels_match_the_torch_ops_in_bfloat16(m):
    from pdlkit.kernels.cuda import fused as F

    torch.manual_seed(m)
    k, n, nkv = 4096, 4096, 1024
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16) * 2
    w = (torch.rand(k, device="cuda") + 0.5).to(torch.bfloat16)
    q, s = F.rmsnorm_quantize_triton.fn(x, w, 1e-5, 15, 1e-8, 127.0)
    rq, rs = F.rmsnorm_quantize_ref(x, w, 1e-5, 15, 1e-8, 127.0)
    assert (q.int() - rq.int()).abs().max() <= 1  # one step where rsqrt rounds differently
    torch.testing.assert_close(s, rs, rtol=1e-5, atol=0)
    ws = [
        torch.randint(-127, 128, (nn, k), dtype=torch.int8, device="cuda") for nn in (n, nkv, nkv)
    ]
    ss = [torch.rand(nn, device="cuda") * 0.01 for nn in (n, nkv, nkv)]
    args = (rq, rs, ws[0], ss[0], ws[1], ss[1], ws[2], ss[2], 15)
    for got, want in zip(F.int8_linear3_triton.fn(*args), F.int8_linear3_ref(*args), strict=True):
        torch.testing.assert_close(got.float(), want.float(), rtol=1e-2, atol=1e-2)
    res = torch.randn(m, 1, n, device="cuda", dtype=torch.bfloat16)
    got = F.int8_linear_residual_triton.fn(rq, rs, ws[0], ss[0], res, 15, [m, 1, n])
    want = F.int8_linear_residual_ref(rq, rs, ws[0], ss[0], res, 15, [m, 1, n])
    torch.testing.assert_close(got.float(), want.float(), rtol=1e-2, atol=2e-2)


@needs_gpu
@pytest.mark.parametrize("m", [1, 3, 8, 16])
@pytest.mark.parametrize("k", [4096, 14336])
def test_gpu_quantization_inside_the_residual_gemm_in_bfloat16(m, k):
    # one row: the GEMM quantizes it itself, with the same codes and scale as quant_rows
    # (compared with the two launches at the same rows; more rows take those two launches)
    from pdlkit.kernels.cuda import fused as F

    torch.manual_seed(k + m)
    n = 4096
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16) * 2
    x[:, 7] = 30.0  # an outlier column, as Llama activations have
    w = torch.randint(-127, 128, (n, k), dtype=torch.int8, device="cuda")
    ws = torch.rand(n, device="cuda") * 0.01
    res = torch.randn(m, 1, n, device="cuda", dtype=torch.bfloat16)
    args = (x, 1e-8, 127.0, w, ws, res, 15, [m, 1, n])
    got = F.quant_int8_linear_residual_triton.fn(*args)
    q, s = F._triton().quant_rows(x, 1e-8, 127.0)
    two = F.int8_linear_residual_triton.fn(q, s, w, ws, res, 15, [m, 1, n])
    want = F.quant_int8_linear_residual_ref(*args)
    assert torch.equal(got, two)  # bit for bit: same codes, scales, sums and epilogue
    torch.testing.assert_close(got.float(), want.float(), rtol=1e-2, atol=2e-2)


@needs_gpu
@pytest.mark.parametrize("row", ["prefill", "decode"])
def test_gpu_rope_frequencies_by_matmul_are_fused_and_equal(older_rope, row):
    # the graph Inductor compiles has no matmul for them (no cuBLAS call): the multiply is
    # in Inductor's own kernels, and the output equals the uncompiled model's
    from pdlkit.quantization import quantize
    from torch._inductor.utils import run_and_get_code

    L = _cuda_llama()
    torch.manual_seed(0)
    model = L.build_model("tiny", "cuda").to(torch.bfloat16)
    ids = torch.randint(0, L.VOCAB, (24, 16 if row == "prefill" else 1), device="cuda")
    q = quantize(model, (ids,), scheme="int8-dynamic-per-token")
    runner = L.Prefill(q) if row == "prefill" else L.DecodeStep(q, L.make_kv(q, 24, 8, "cuda"))
    with torch.no_grad():
        want = runner(ids)
        pdlkit.stats(reset=True)
        got, code = run_and_get_code(pdlkit.optimize(runner, autotune="off"), ids)
    err = (got.float() - want.float()).norm() / want.float().norm()
    assert err < 1e-2  # int8 codes one step apart here and there, as the fused kernels round
    assert pdlkit.stats()["by_kernel"]["matmul_outer_pointwise"]["substitutions"] == 1
    text = "\n".join(code)
    assert "extern_kernels.bmm" not in text and "torch.ops.pdlkit" not in text

"""CUDA kernels (kernels/cuda/) and patterns (patterns/cuda/).

On CPU-only machines (CI) the Triton kernels run in Triton's interpreter, in a subprocess
started with TRITON_INTERPRET=1 (Triton reads it at import); explain for ``cuda-sm90`` runs
here. On a GPU the same kernels are checked against the reference on the device, on a side
stream and under CUDA graph capture.
"""

from __future__ import annotations

import textwrap

import pytest
import torch
import torch.nn.functional as F
from pdlkit.quantization.int8_dynamic import quantize_int8_dynamic, quantize_per_token
from torch import nn

import pdlkit

triton = pytest.importorskip("triton", reason="Triton is not installed (pip install triton)")
CUDA = torch.cuda.is_available()
needs_gpu = pytest.mark.skipif(
    not CUDA, reason="needs an NVIDIA GPU (runs on the lent GPU machine)"
)


class LlamaMLP(nn.Module):
    def __init__(self, hidden: int = 64, inter: int = 96, bias: bool = False):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=bias)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


_INTERPRETED = textwrap.dedent(
    """
    import json, torch, pdlkit
    from tests.test_cuda import LlamaMLP
    from pdlkit.quantization.int8_dynamic import quantize_int8_dynamic
    from pdlkit.kernels.ops import logical_ops as ref
    from pdlkit.kernels.cuda import _triton_gemm as T
    torch.manual_seed(0)
    out = {}
    # kernels against their reference on edge shapes (M = 1, K = 7, odd N)
    for m, k, n in [(1, 7, 3), (5, 40, 9), (33, 70, 47)]:
        x = torch.randn(m, k)
        q, s = T.quant_rows(x, 1e-8, 127.0)
        rq, rs = ref.quantize_per_token(x, 1e-8, 127.0)
        w = torch.randint(-127, 128, (n, k), dtype=torch.int8)
        ws = torch.rand(n) * 0.01
        b = torch.randn(n)
        y = torch.empty(m, n)
        T.gemm(q, w, y, a_scale=s.reshape(-1), b_scale=ws, bias=b)
        out[f"{m}x{k}x{n}"] = {
            "quant_equal": bool((q == rq).all() and (s == rs).all()),
            "gemm_err": (y - ref.int8_linear(q, s, w, ws, b, 6)).abs().max().item(),
        }
    # the decode-shaped split-K kernels, through their declarations (K = 70: two K slices,
    # the second partly masked; 33 rows: three row tiles)
    from pathlib import Path
    import pdlkit.kernels
    from pdlkit.runtime_abi.registry import load_kernel_file
    gemm = Path(pdlkit.kernels.__file__).parent / "cuda" / "gemm.py"
    kernels = {k.name: k for k in load_kernel_file(gemm)}
    for m, k, n in [(1, 7, 3), (5, 40, 9), (33, 70, 47)]:
        q = torch.randint(-127, 128, (m, k), dtype=torch.int8)
        xs = torch.rand(m, 1) * 0.02
        w, wu = (torch.randint(-127, 128, (n, k), dtype=torch.int8) for _ in range(2))
        ws, us, b = torch.rand(n) * 0.01, torch.rand(n) * 0.01, torch.randn(n)
        y = kernels["int8_linear_splitk"].fn(q, xs, w, ws, b, 6)
        h = kernels["int8_gated_silu_splitk"].fn(q, xs, w, ws, wu, us, 6, [m, 1, n])
        want_h = ref.int8_gated_silu(q, xs, w, ws, wu, us, 6, [m, 1, n])
        out[f"splitk {m}x{k}x{n}"] = {
            "linear_err": (y - ref.int8_linear(q, xs, w, ws, b, 6)).abs().max().item(),
            "gated_err": (h - want_h).abs().max().item(),
            "gated_shape": list(h.shape),
        }
    # PT2E int8 kernels (uint8 activations with zero points, requantized outputs)
    try:  # the PT2E references need torchao's quantized_decomposed ops
        import torchao  # noqa: F401
        examples = {
            "qlinear": ref._qlinear_examples(torch.float32, False),
            "qlinear_q": ref._qlinear_examples(torch.float32, True),
            "qlinear_dynamic": ref._qlinear_dynamic_examples(torch.float32),
        }
    except ImportError:
        examples = {}
    for op, exs in examples.items():
        k = kernels[op + "_triton"]
        worst = 0.0
        for ex in exs:
            args = list(ex)
            args[3] = k.prepack(args[3], {})
            got, want = k.fn(*args), getattr(ref, op)(*ex)
            worst = max(worst, (got.float() - want.float()).abs().max().item())
        out[op] = worst
    optin = gemm.parent.parent / "_optin" / "cuda_bf16_linear.py"
    bf16 = {k.name: k for k in load_kernel_file(optin)}["linear_gelu_triton"]
    x, w, b = torch.randn(5, 40), torch.randn(24, 40), torch.randn(24)
    got = bf16.fn(x.bfloat16(), w.bfloat16(), b.bfloat16(), "tanh").float()
    want = torch.nn.functional.gelu(torch.nn.functional.linear(x, w, b), approximate="tanh")
    out["bf16_gelu_rel_err"] = ((got - want).norm() / want.norm()).item()
    torch.manual_seed(0)
    model = quantize_int8_dynamic(LlamaMLP(bias=True)).eval()
    x = torch.randn(2, 32, 64)
    target = {"name": "cpu-triton-interpreter", "devices": ["cpu", "cuda"]}
    with torch.no_grad():
        want = model(x)
        report = pdlkit.explain(model, x, target=target)
        got = pdlkit.optimize(model, target=target, default_codegen="eager")(x)
    out["subs"] = sorted(f"{s.pattern} -> {s.kernel}" for s in report.substitutions)
    out["mlp_err"] = (got - want).abs().max().item()
    out["calls"] = pdlkit.stats()["kernel_calls"]
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def interpreted():
    from conftest import run_interpreted  # here: the script imports this module as tests.test_cuda

    return run_interpreted(_INTERPRETED)


def test_triton_kernels_match_reference_in_interpreter(interpreted):
    for shape in ("1x7x3", "5x40x9", "33x70x47"):
        assert interpreted[shape]["quant_equal"], shape  # bit-exact per-token quantization
        assert interpreted[shape]["gemm_err"] < 1e-4, shape


def test_split_k_kernels_match_reference_in_interpreter(interpreted):
    for shape in ("1x7x3", "5x40x9", "33x70x47"):
        got = interpreted[f"splitk {shape}"]
        assert got["linear_err"] < 1e-4, shape  # int32 sums are exact; float epilogue
        assert got["gated_err"] < 1e-4, shape
    assert interpreted["splitk 33x70x47"]["gated_shape"] == [33, 1, 47]


def test_pt2e_int8_kernels_match_reference_in_interpreter(interpreted):
    if "qlinear" not in interpreted:
        pytest.skip("torchao is not installed (pip install -e '.[quant]')")
    assert interpreted["qlinear"] < 1e-4  # float32 outputs of dq -> linear -> act
    assert interpreted["qlinear_dynamic"] < 1e-4
    assert interpreted["qlinear_q"] == 0  # requantized: the same uint8 codes as PyTorch


def test_optin_bf16_linear_gelu_in_interpreter(interpreted):
    assert interpreted["bf16_gelu_rel_err"] < 1e-2  # bf16 operands, fp32 accumulation


def test_bf16_triton_kernels_are_opt_in():
    from pdlkit.backend import Options, load_plan

    shipped = load_plan(Options()).registry
    assert "linear_triton" not in shipped.names()  # slower than cuBLAS: not loaded by default
    assert "int8_linear_triton" in shipped.names()


def test_llama_mlp_int8_substitutes_three_kernels(interpreted):
    # gate+up fused into one kernel, down with its bias, two per-token quantizations
    assert interpreted["subs"] == [
        "int8_gated_silu_3d -> int8_gated_silu_triton",
        "int8_linear_bias -> int8_linear_triton",
        "quantize_per_token -> quantize_per_token_triton",
        "quantize_per_token -> quantize_per_token_triton",
    ]
    assert interpreted["calls"] == 4


def test_llama_mlp_int8_numerics_in_interpreter(interpreted):
    assert interpreted["mlp_err"] < 1e-4  # same int32 sums and scales as the torch ops


def test_explain_for_cuda_target_from_cpu():
    model = quantize_int8_dynamic(LlamaMLP()).eval()
    x = torch.randn(2, 16, 64)
    with torch.no_grad():
        report = pdlkit.explain(model, x, target="cuda-sm90")
    kernels = sorted(s.kernel for s in report.substitutions)
    assert kernels == [
        "int8_gated_silu_triton",
        "int8_linear_triton",
        "quantize_per_token_triton",
        "quantize_per_token_triton",
    ]
    # on this CPU host, the same model gets no CUDA pattern at all
    with torch.no_grad():
        here = pdlkit.explain(model, x)
    assert here.substitutions == []


def test_cuda_target_refuses_to_compile_on_a_cpu_host():
    if CUDA:
        pytest.skip("this host has CUDA")
    model = quantize_int8_dynamic(LlamaMLP()).eval()
    with pytest.raises(Exception, match="target cuda-sm90 plans for tensors on cuda"):
        with torch.no_grad():
            pdlkit.optimize(model, target="cuda-sm90")(torch.randn(4, 64))


def test_pt2e_gemm_sees_weight_zero_points_written_in_place():
    """The CUDA PT2E GEMM reads the weight zero points once per tensor and version: a write in
    place is seen (nonzero zero points: the kernel declines, the reference runs)."""
    from pathlib import Path

    import pdlkit.kernels
    from pdlkit.runtime_abi.registry import load_kernel_file

    gemm = Path(pdlkit.kernels.__file__).parent / "cuda" / "gemm.py"
    zero = next(iter(load_kernel_file(gemm))).fn.__globals__["_zero_points_zero"]
    w_zp = torch.zeros(8, dtype=torch.int64)
    assert zero(w_zp) and zero(w_zp)
    w_zp[3] = 5
    assert not zero(w_zp)
    assert zero(torch.zeros(4, dtype=torch.int64))


def test_unquantized_model_keeps_per_token_ops_exact():
    x = torch.randn(7, 33)
    q, s = quantize_per_token(x)
    assert q.dtype == torch.int8 and s.shape == (7, 1)
    assert ((q.float() * s - x).abs() <= s / 2 + 1e-7).all()  # within half a step


# -- on the GPU ------------------------------------------------------------------------------


@needs_gpu
@pytest.mark.parametrize("m,k,n", [(1, 64, 8), (17, 4096, 4096), (300, 1000, 520)])
def test_gpu_int8_linear_matches_reference(m, k, n):
    from pdlkit.kernels.cuda import _triton_gemm as T
    from pdlkit.kernels.ops import logical_ops as ref

    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    q, s = T.quant_rows(x, 1e-8, 127.0)
    rq, rs = ref.quantize_per_token(x, 1e-8, 127.0)
    # PyTorch's CUDA division by a Python scalar multiplies by its reciprocal, so its scale
    # can differ from the kernel's correctly rounded one by an ulp, and a code by one step
    torch.testing.assert_close(s, rs, rtol=2e-7, atol=0)
    assert (q.int() - rq.int()).abs().max() <= 1
    w = torch.randint(-127, 128, (n, k), dtype=torch.int8, device="cuda")
    ws = torch.rand(n, device="cuda") * 0.01
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    T.gemm(q, w, out, a_scale=s.reshape(-1), b_scale=ws)
    want = ref.int8_linear(q.cpu(), s.cpu(), w.cpu(), ws.cpu(), None, 15)
    torch.testing.assert_close(out.cpu().float(), want.float(), rtol=1e-2, atol=1e-2)


@needs_gpu
def test_gpu_mlp_runs_on_callers_stream_and_under_graph_capture():
    torch.manual_seed(0)
    model = quantize_int8_dynamic(LlamaMLP(256, 512).cuda().to(torch.bfloat16)).eval()
    x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
    compiled = pdlkit.optimize(model)
    with torch.no_grad():
        want = model(x)
        compiled(x)  # compile and warm up on the default stream
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            got = compiled(x)
        torch.cuda.current_stream().wait_stream(side)
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = compiled(x)
        graph.replay()
        torch.cuda.synchronize()
    torch.testing.assert_close(captured, want, rtol=2e-2, atol=2e-2)
    # launched by Inductor's code: substituted, and no call goes through pdlkit's runner
    assert pdlkit.stats()["by_kernel"]["int8_gated_silu_triton"]["substitutions"] >= 1


@needs_gpu
@pytest.mark.parametrize("rows,kernel", [(64, "splitk_kernel"), (128, "gated_kernel")])
def test_gpu_inductor_launches_the_triton_kernels_itself(rows, kernel):
    from torch._inductor.utils import run_and_get_code

    torch.manual_seed(0)
    model = quantize_int8_dynamic(LlamaMLP(256, 512).cuda().to(torch.bfloat16)).eval()
    x = torch.randn(rows, 256, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        got, code = run_and_get_code(pdlkit.optimize(model, autotune="off"), x)
        want = model(x)
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    text = "\n".join(code)
    assert "torch.ops.pdlkit" not in text
    assert kernel in text and "quant_rows_kernel" in text  # up to 64 rows: split-K


@needs_gpu
@pytest.mark.parametrize(
    "m,n,k", [(1, 4096, 4096), (16, 1000, 4096), (64, 520, 11008), (256, 96, 96)]
)
@pytest.mark.parametrize("gated", [False, True])
def test_gpu_split_k_matches_reference(m, n, k, gated):
    from pdlkit.kernels.cuda import _triton_splitk as S

    q = torch.randint(-127, 128, (m, k), dtype=torch.int8, device="cuda")
    xs = torch.rand(m, device="cuda") * 0.01
    w, u = (torch.randint(-127, 128, (n, k), dtype=torch.int8, device="cuda") for _ in range(2))
    sw, su = torch.rand(n, device="cuda") * 0.01, torch.rand(n, device="cuda") * 0.01
    want = (q.double() @ w.double().T) * xs[:, None].double() * sw.double()
    if gated:
        want = F.silu(want) * ((q.double() @ u.double().T) * xs[:, None].double() * su.double())
    for _ in range(3):  # the workspace and its counters start from zero every call
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        S.splitk(q, xs, w, sw, out, u=u if gated else None, u_scale=su if gated else None)
        err = ((out.double() - want).norm() / want.norm()).item()
        assert err < 1e-2  # bf16 output


def test_quantize_scheme_int8_dynamic_per_token_copies_and_swaps_linears():
    from pdlkit.quantization import quantize
    from pdlkit.quantization.int8_dynamic import Int8DynamicLinear

    model = LlamaMLP()
    x = torch.randn(4, 64)
    q = quantize(model, (x,), scheme="int8-dynamic-per-token")
    assert isinstance(q.down_proj, Int8DynamicLinear) and isinstance(model.down_proj, nn.Linear)
    with torch.no_grad():
        cos = F.cosine_similarity(q(x).flatten(), model(x).flatten(), dim=0)
    assert cos > 0.999


# -- a transformers Llama (tiny sizes), as benchmarks/cuda_llama.py runs it ----------------------


def _cuda_llama():
    pytest.importorskip("transformers", reason="pip install transformers")
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "cuda_llama.py"
    spec = importlib.util.spec_from_file_location("cuda_llama", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("row", ["prefill", "decode"])
def test_llama_layers_get_gated_pairs_and_shared_quantization_for_cuda(row):
    from pdlkit.quantization import quantize

    L = _cuda_llama()
    model = L.build_model("tiny", "cpu")
    ids = torch.randint(0, L.VOCAB, (2, 8 if row == "prefill" else 1))
    q = quantize(model, (ids,), scheme="int8-dynamic-per-token")
    runner = L.Prefill(q) if row == "prefill" else L.DecodeStep(q, L.make_kv(q, 2, 8, "cpu"))
    with torch.no_grad():
        report = pdlkit.explain(runner, ids, target="cuda-sm90")
    kernels = sorted(s.kernel for s in report.substitutions)
    # per layer (patterns/cuda/llama.pdl.mlir): q, k and v as one launch, o and down with the
    # residual add in their epilogues, gate + up as one, both RMSNorms fused with the
    # quantization after them, two more quantizations (attention output, gated product);
    # also where the decode step writes its cache
    assert kernels.count("int8_linear3_triton") == 2
    assert kernels.count("int8_linear_residual_triton") == 4
    assert kernels.count("int8_gated_silu_triton") == 2
    assert kernels.count("rmsnorm_quantize_triton") == 4
    assert kernels.count("quantize_per_token_triton") == 4
    assert "int8_linear_triton" not in kernels


def test_reads_around_an_in_place_write_are_not_merged():
    def f(buf: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        before = buf * 2
        buf[:, :2].copy_(x[:, :2])  # as a static KV cache is written: through a view
        y = torch.relu(F.linear(x, w))  # a substitution, so that pdlkit's graph runs
        return before + buf * 2 + y  # the same op on the same tensor, after the write

    buf, x, w = torch.randn(4, 8), torch.randn(4, 8), torch.randn(8, 8)
    want = f(buf.clone(), x, w)
    got = pdlkit.optimize(f, default_codegen="eager", autotune="off")(buf.clone(), x, w)
    torch.testing.assert_close(got, want)


@needs_gpu
@pytest.mark.parametrize("m,k", [(64, 4096), (64, 14336), (3, 20000)])
def test_gpu_quantized_codes_are_the_correctly_rounded_quotients(m, k):
    # codes = round-half-even(x / s) with x / s correctly rounded (torch divides by a tensor
    # exactly), however the kernel divides; 20000 values a row: the row in several passes
    from pdlkit.kernels.cuda import _triton_gemm as T

    torch.manual_seed(k)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16) * 3
    x[:, 5] = 40.0  # an outlier column
    q, s = T.quant_rows(x, 1e-8, 127.0)
    want = torch.round(x.float() / s).clamp(-127, 127)
    assert torch.equal(q.float(), want)
    amax = x.float().abs().amax(1, keepdim=True).clamp(min=1e-8)
    assert torch.equal(s, amax / torch.full_like(amax, 127.0))  # a tensor: true division

"""torchao's int8 models on CUDA: ``quantize_(m, Int8DynamicActivationInt8WeightConfig())`` then
``pdlkit.optimize`` runs pdlkit's int8 kernels at every linear (matcher/canonical_int8.py);
``Int8WeightOnlyConfig`` linears get the weight-only kernel (kernels/cuda/weight_only.py).

torchao spells its int8 GEMM by the tensors' device. On the CPU the tests take its CUDA
branch (``torchao_cuda_form``: the two calls torchao 0.18 makes there), so the graph is the
one an H200 gives, and check the patterns (explain, target ``cuda-sm90``) and the kernels'
numbers in Triton's interpreter; on a GPU the same model runs as torchao made it.
"""

from __future__ import annotations

import importlib.util
import textwrap

import pytest
import torch
from conftest import needs_gpu, run_interpreted

# newer_rope (autouse): one RoPE spelling whatever transformers' version
from test_cuda_fusions import _cuda_llama, newer_rope  # noqa: F401

import pdlkit

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torchao") is None,
    reason="torchao is not installed (pip install -e '.[quant]')",
)

_CUDA_FORM = """
import torch
import torchao.kernel.intmm as intmm
from torch._higher_order_ops.out_dtype import out_dtype
intmm.safe_int_mm = lambda a, b: out_dtype(torch.ops.aten.mm.default, torch.int32, a, b)
intmm._is_device = lambda device, t: False
"""


@pytest.fixture
def torchao_cuda_form(monkeypatch):
    import torchao.kernel.intmm as intmm
    from torch._higher_order_ops.out_dtype import out_dtype

    def safe_int_mm(a, b):  # what torchao runs under torch.compile on CUDA
        return out_dtype(torch.ops.aten.mm.default, torch.int32, a, b)

    monkeypatch.setattr(intmm, "safe_int_mm", safe_int_mm)
    monkeypatch.setattr(intmm, "_is_device", lambda device, t: False)


class MLP(torch.nn.Module):
    """A Llama MLP: gate and up share their input (one kernel); the residual add is the
    model input itself, which the residual epilogue pattern (Llama's) does not take."""

    def __init__(self, h: int = 64, i: int = 96) -> None:
        super().__init__()
        self.gate, self.up = torch.nn.Linear(h, i, bias=False), torch.nn.Linear(h, i, bias=False)
        self.down = torch.nn.Linear(i, h, bias=False)

    def forward(self, x):
        return self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x)) + x


def _torchao(model: torch.nn.Module, config: str = "Int8DynamicActivationInt8WeightConfig"):
    import torchao.quantization as tq

    tq.quantize_(model, getattr(tq, config)(set_inductor_config=False))
    return model


def on_the_interpreter(model: torch.nn.Module, x: torch.Tensor) -> dict:
    """(For the interpreted scripts below.) ``model(x)`` compiled by pdlkit for Triton's
    interpreter against its eager result: relative and largest error, shape, kernel calls."""
    target = {"name": "cpu-triton-interpreter", "devices": ["cpu", "cuda"]}
    with torch.no_grad():
        want = model(x)
        pdlkit.stats(reset=True)
        got = pdlkit.optimize(model, target=target, default_codegen="eager", autotune="off")(x)
    d = got.float() - want.float()
    return {
        "rel": (d.norm() / want.float().norm()).item(),
        "max": d.abs().max().item(),
        "shape": list(got.shape),
        "calls": {k: v.get("kernel_calls", 0) for k, v in pdlkit.stats()["by_kernel"].items()},
    }


@pytest.mark.parametrize("row", ["prefill", "decode"])
def test_every_linear_of_a_torchao_llama_gets_a_kernel(torchao_cuda_form, row):
    L = _cuda_llama()
    model = _torchao(L.build_model("tiny", "cpu"))
    ids = torch.randint(0, L.VOCAB, (2, 8 if row == "prefill" else 1))
    runner = (
        L.Prefill(model) if row == "prefill" else L.DecodeStep(model, L.make_kv(model, 2, 8, "cpu"))
    )
    with torch.no_grad():
        report = pdlkit.explain(runner, ids, target="cuda-sm90", autotune="off")
    # per layer: q/k/v as one launch, gate + up as one, o and down with their residual adds,
    # and at decode the attention of the one query token (the graph is desugared at the
    # pre-dispatch level, where scaled_dot_product_attention is one op)
    per_layer = ["int8_linear3_triton", "int8_gated_silu_triton"] + 2 * [
        "int8_linear_residual_triton"
    ]
    per_layer += ["decode_attention_triton"] if row == "decode" else []
    assert sorted(s.kernel for s in report.substitutions) == sorted(2 * per_layer)


_INTERPRETED = textwrap.dedent(_CUDA_FORM) + textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, "tests")
    from test_cuda_torchao import MLP, _torchao, on_the_interpreter
    torch.manual_seed(0)
    model = _torchao(MLP().eval().to(torch.bfloat16))
    print(json.dumps(on_the_interpreter(model, torch.randn(2, 5, 64, dtype=torch.bfloat16))))
    """
)


def test_a_torchao_mlp_computes_torchaos_numbers_in_the_interpreter():
    got = run_interpreted(_INTERPRETED)
    assert got["calls"] == {"int8_gated_silu_triton": 1, "int8_linear_triton": 1}
    assert got["shape"] == [2, 5, 64]
    # the roundings to bf16 torchao makes between the two scales, which the kernels skip, move a
    # few of the down projection's int8 codes one step: a quarter of a percent of the output
    assert got["rel"] < 1e-2
    assert got["max"] <= 2 * 2**-7 * 4  # two bf16 steps of values up to 4


@needs_gpu
@pytest.mark.parametrize(
    "config, kernels",
    [
        (
            "Int8DynamicActivationInt8WeightConfig",
            {"int8_gated_silu_triton": 1, "int8_linear_triton": 1},
        ),
        ("Int8WeightOnlyConfig", {"int8_weight_only_triton": 3}),
    ],
)
def test_gpu_torchao_mlp_runs_pdlkits_kernels_with_torchaos_numbers(config, kernels):
    torch.manual_seed(0)
    model = _torchao(MLP(512, 1024).eval().cuda().to(torch.bfloat16), config)
    x = torch.randn(4, 16, 512, device="cuda", dtype=torch.bfloat16)  # 64 rows: _int_mm's M > 16
    with torch.no_grad():
        want = model(x)
        torch._dynamo.reset()
        pdlkit.stats(reset=True)
        got = pdlkit.optimize(model, autotune="off")(x)
    subs = {k: v["substitutions"] for k, v in pdlkit.stats()["by_kernel"].items()}
    assert subs == kernels
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)


_BIAS_INTERPRETED = textwrap.dedent(_CUDA_FORM) + textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, "tests")
    from test_cuda_torchao import _torchao, on_the_interpreter
    torch.manual_seed(0)
    layers = [torch.nn.Linear(64, 96), torch.nn.GELU(), torch.nn.Linear(96, 32)]
    model = _torchao(torch.nn.Sequential(*layers).eval().to(torch.bfloat16))
    x = torch.randn(2, 5, 64, dtype=torch.bfloat16)
    out = on_the_interpreter(model, x)
    with torch.no_grad():
        want = model(x)
        torch._dynamo.reset()
        d = torch.compile(model)(x).float() - want.float()
    out["inductor_rel"] = (d.norm() / want.float().norm()).item()
    print(json.dumps(out))
    """
)


def test_a_torchao_linear_with_a_bias_gets_the_int8_kernel(torchao_cuda_form):
    # torchao adds the bias in place (y += bias) after the rescale: int8_bias_in_place makes
    # it the functional add the int8_linear_bias pattern takes
    torch.manual_seed(0)
    layers = [torch.nn.Linear(64, 96), torch.nn.GELU(), torch.nn.Linear(96, 32)]
    model = _torchao(torch.nn.Sequential(*layers).eval().to(torch.bfloat16))
    with torch.no_grad():
        report = pdlkit.explain(model, torch.randn(2, 5, 64).to(torch.bfloat16), target="cuda-sm90")
    assert [s.pattern for s in report.substitutions] == ["int8_linear_bias"] * 2


def _qwen2_patterns(config: str) -> list[str]:
    """The patterns that fire on the linears of a 2-layer Qwen2 (biased Q/K/V) quantized by
    torchao's ``config``, explained for CUDA (not ``matmul_outer``: transformers 5.17, the GPU
    machine's, spells the rotary frequencies as a matmul, which that pattern takes)."""
    pytest.importorskip("transformers", reason="pip install transformers")
    from transformers import Qwen2Config, Qwen2Model

    sizes = Qwen2Config(
        vocab_size=1000, hidden_size=64, intermediate_size=96, num_attention_heads=4,
        num_key_value_heads=2, num_hidden_layers=2,
    )  # fmt: skip
    torch.manual_seed(0)
    model = _torchao(Qwen2Model(sizes).eval().to(torch.bfloat16), config)
    with torch.no_grad():
        report = pdlkit.explain(model, torch.randint(0, 1000, (2, 8)), target="cuda-sm90")
    return sorted(s.pattern for s in report.substitutions if s.pattern != "matmul_outer")


def test_every_linear_of_a_torchao_qwen2_gets_a_kernel_its_biased_qkv_too(torchao_cuda_form):
    # per layer: q, k, v with their biases, o and down with the residual, gate + up as one
    assert _qwen2_patterns("Int8DynamicActivationInt8WeightConfig") == sorted(
        ["int8_linear_bias"] * 6 + ["int8_linear_residual"] * 4 + ["int8_gated_silu_3d"] * 2
    )


def test_a_torchao_mlp_with_biases_in_the_interpreter_is_as_close_to_torchao_as_inductor():
    got = run_interpreted(_BIAS_INTERPRETED)
    assert got["calls"] == {"int8_linear_triton": 2}
    # int8 codes of the second layer's activations a step apart here and there, as Inductor's
    # own float32 arithmetic moves them (about 1% of the output, both)
    assert got["rel"] < 1.5 * got["inductor_rel"] + 1e-3


# -- weight-only (Int8WeightOnlyConfig: the same graph on every device) ---------------------------

_W8 = "Int8WeightOnlyConfig"


def test_every_linear_of_a_torchao_weight_only_qwen2_gets_the_kernel_biases_too():
    # per layer: q, k, v with their biases (added in place by torchao), o, gate, up, down
    assert _qwen2_patterns(_W8) == sorted(
        ["torchao_int8_weight_only_bias"] * 6 + ["torchao_int8_weight_only"] * 8
    )


def test_every_linear_of_a_torchao_weight_only_llama_gets_the_weight_only_kernel():
    L = _cuda_llama()
    model = _torchao(L.build_model("tiny", "cpu"), _W8)
    ids = torch.randint(0, L.VOCAB, (2, 1))
    with torch.no_grad():
        report = pdlkit.explain(
            L.DecodeStep(model, L.make_kv(model, 2, 8, "cpu")),
            ids,
            target="cuda-sm90",
            autotune="off",
        )
    kernels = [s.kernel for s in report.substitutions]
    assert kernels.count("int8_weight_only_triton") == 14  # 7 linears a layer, 2 layers
    assert kernels.count("decode_attention_triton") == 2


_W8_INTERPRETED = textwrap.dedent(
    """
    import json, sys, torch
    sys.path.insert(0, "tests")
    from pdlkit.kernels.cuda.weight_only import int8_weight_only_triton as k
    from pdlkit.kernels.ops.int8_weight_only import int8_weight_only_linear as ref
    from test_cuda_torchao import MLP, _torchao, on_the_interpreter
    out = {}
    for m, kk, n in [(1, 7, 3), (5, 64, 16), (70, 40, 33), (300, 24, 5)]:  # float16 (NumPy
        # has no bfloat16); 300 rows: prefill-sized calls, the weight widened whole
        g = torch.Generator().manual_seed(m)
        x = torch.randn(m, kk, generator=g).half()
        w = torch.randint(-128, 128, (n, kk), generator=g, dtype=torch.int8)
        ws = torch.rand(n, 1, generator=g) * 0.01 + 1e-4
        b = torch.randn(n, generator=g).half() if n % 2 else None
        want = ref(x, w, ws, b).float()
        out[f"{m}x{kk}x{n}"] = ((k.fn(x, w, ws, b).float() - want).abs().max() / want.abs().max()).item()
    from pdlkit.kernels.cuda.weight_only import int8_weight_only_widened as widened
    try:
        widened.fn(x[:64], w, ws, b)
    except Exception as e:
        out["widened_64_rows"] = f"{type(e).__name__}: {e}"
    # bfloat16: the kernel's dot runs in float32 under the interpreter (its bf16 dot is wrong)
    torch.manual_seed(0)
    x, w = torch.randn(5, 64).bfloat16(), torch.randint(-128, 128, (16, 64), dtype=torch.int8)
    want = ref(x, w, torch.ones(16, 1), None).float()
    out["bf16_rel"] = ((k.fn(x, w, torch.ones(16, 1), None).float() - want).norm() / want.norm()).item()
    torch.manual_seed(0)
    model = _torchao(MLP().eval().half(), "Int8WeightOnlyConfig")
    out["model"] = on_the_interpreter(model, torch.randn(2, 5, 64).half())
    biased = [torch.nn.Linear(64, 96), torch.nn.GELU(), torch.nn.Linear(96, 32)]
    model = _torchao(torch.nn.Sequential(*biased).eval().half(), "Int8WeightOnlyConfig")
    out["biased"] = on_the_interpreter(model, torch.randn(2, 5, 64).half())
    from pdlkit.kernels.cuda import _common
    _common.shared_limit = lambda: (9, 4096)  # a GPU whose shared memory no tile fits
    out["small_gpu"] = on_the_interpreter(model, torch.randn(2, 5, 64).half())
    print(json.dumps(out))
    """
)


def test_the_weight_only_kernel_and_a_torchao_mlp_in_the_interpreter():
    got = run_interpreted(_W8_INTERPRETED)
    for shape in ("1x7x3", "5x64x16", "70x40x33"):
        assert got[shape] == 0.0, shape  # float16 sums of int8 x float16 products: exact here
    # past 256 rows the product is rounded to float16 before the scale, as torchao rounds it:
    # within two float16 roundings (2**-11 of the largest value each) of the op's one
    assert 0.0 < got["300x24x5"] <= 2 * 2.0**-11
    assert got["widened_64_rows"] == (
        "KernelUnsupported: 64 rows: the widened weight-only path takes more than 64"
    )
    # the interpreter casts float32 to bfloat16 by truncation (1 + 3 * 2**-9 -> 1.0, where
    # torch rounds to 1.0078125): up to one bfloat16 step (2**-7 relative) an element; before
    # the float32 dot, 7e8 where 8 was right
    assert got["bf16_rel"] < 8e-3
    assert got["model"]["calls"] == {"int8_weight_only_triton": 3}
    assert got["model"]["rel"] < 2e-3  # one rounding of each GEMM fewer than torchao's
    assert got["biased"]["calls"] == {"int8_weight_only_triton": 2}  # biases in the epilogue
    assert got["biased"]["rel"] < 2e-3
    # where the tiles do not fit the GPU's shared memory the weight is widened whole and
    # multiplied as a float GEMM: still the kernel, rounding as torchao's own graph does
    assert got["small_gpu"]["calls"] == {"int8_weight_only_triton": 2}
    assert got["small_gpu"]["rel"] < 2e-3


@needs_gpu
@pytest.mark.parametrize("m", [1, 16, 64, 200, 1000])
def test_gpu_weight_only_kernel_matches_its_op_in_bfloat16(m):
    from pdlkit.kernels.cuda.weight_only import int8_weight_only_triton as k
    from pdlkit.kernels.ops.int8_weight_only import int8_weight_only_linear as ref

    g = torch.Generator(device="cuda").manual_seed(m)
    x = torch.randn(m, 4096, device="cuda", generator=g).to(torch.bfloat16)
    w = torch.randint(-128, 128, (11008, 4096), device="cuda", generator=g, dtype=torch.int8)
    ws = torch.rand(11008, 1, device="cuda", generator=g) * 0.01 + 1e-4
    torch.testing.assert_close(
        k.fn(x, w, ws, None).float(), ref(x, w, ws, None).float(), rtol=1e-2, atol=1e-2
    )

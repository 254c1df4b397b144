"""Planning for AArch64 on this x86 machine: patterns/aarch64, the plan-only kernel declarations,
``pdlkit explain --target yitian``, and PyTorch's own AArch64 int8 path (torch_int8.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from pdlkit.runtime_abi.binding import bind
from pdlkit.runtime_abi.kernel import KernelUnsupported
from pdlkit.runtime_abi.native_build import host_arch
from pdlkit.runtime_abi.reference import lookup
from pdlkit.runtime_abi.registry import load_kernel_file

import pdlkit
from pdlkit.cli import main
from pdlkit.config import shipped_kernels

ROOT = Path(__file__).resolve().parents[1]
A64 = shipped_kernels() / "aarch64"
not_on_aarch64 = pytest.mark.skipif(
    host_arch() == "aarch64", reason="plan-only declarations exist on non-AArch64 hosts"
)


@not_on_aarch64
def test_plan_only_kernels_decline_on_this_host():
    k = {d.name: d for d in load_kernel_file(A64 / "a64_gemm.py")}["a64_qlinear_i8mm"]
    assert k.requires == {"i8mm"} and k.prepack_arg == "w_q" and k.priority == 20
    assert "plan only on x86_64" in k.source
    with pytest.raises(KernelUnsupported, match="AArch64 kernel .* cannot run it"):
        k(torch.zeros(1, 8, dtype=torch.uint8), 1.0, 0, torch.zeros(2, 8, dtype=torch.int8),
          torch.ones(2), torch.zeros(2, dtype=torch.int64), None, "none", "")  # fmt: skip


def test_explain_target_yitian_for_pt2e_bert_mini(capsys):
    """Every GEMM of a PT2E bert-mini goes to the i8mm kernels; the report says what did not fuse."""
    pytest.importorskip("transformers", reason="needs transformers (pip install -e '.[quant]')")
    pytest.importorskip("torchao", reason="needs torchao (pip install -e '.[quant]')")
    example = str(ROOT / "examples" / "yitian_bert.py") + ":example"
    assert main(["explain", example, "--target", "yitian", "--verbose"]) == 0
    out = capsys.readouterr().out
    assert "target yitian (aarch64; devices cpu; features asimddp, bf16, i8mm, sve, sve2)" in out
    fired = re.findall(r"^  (\S+) -> (\S+) +at ", out, re.M)
    assert {f: fired.count(f) for f in set(fired)} == {
        ("qlinear", "a64_qlinear_i8mm"): 21,  # Q, K, V, attention out, FFN down
        ("qlinear_gelu_q", "a64_qlinear_q_i8mm"): 4,  # FFN up + GELU + requantize
    }
    # what would not be fused, and why: a quantize whose input feeds two users
    assert re.search(r"\bqlinear_q at layer_norm_1: constraint single_use\(layer_norm_1\)", out)
    # the target-neutral patterns (patterns/pt2e) are active here; x86-only ones are not
    assert "qlinear_add_layer_norm_q: not for target yitian" in out


def _mlp() -> tuple[torch.nn.Module, torch.Tensor]:
    """linear -> GELU -> linear (seed 0) and an input; skips the test without torchao."""
    pytest.importorskip("torchao", reason="needs torchao (pip install -e '.[quant]')")
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8)
    ).eval()
    return model, torch.randn(4, 16)


def _quantized_mlp() -> tuple[torch.nn.Module, torch.Tensor]:
    from pdlkit.quantization import quantize

    model, x = _mlp()
    return quantize(model, (x,)), x


def test_aarch64_without_i8mm_plans_the_sdot_kernels():
    """target="aarch64" (asimddp only, e.g. Neoverse N1): the i8mm kernels are passed over."""
    q, x = _quantized_mlp()
    report = pdlkit.explain(q, x, target="aarch64")
    chosen = sorted((s.pattern, s.kernel) for s in report.substitutions)
    assert chosen == [
        ("qlinear", "a64_qlinear_sdot"),
        ("qlinear_gelu_q", "a64_qlinear_q_sdot"),
    ]
    for s in report.substitutions:
        i8mm = s.kernel.replace("_sdot", "_i8mm")
        assert f"{i8mm}: needs i8mm, which target aarch64 lacks" in s.passed_over


def test_bf16_linears_on_yitian_use_bfmmla_and_fp32_ones_stay_on_torch(capsys):
    """BF16 linears (patterns/cpu) choose the BFMMLA kernels; an FP32 model keeps PyTorch's
    path (oneDNN + ACL on AArch64), and the report says why the BF16 kernel was passed over."""
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16), torch.nn.ReLU(),
        torch.nn.Linear(16, 8),
    ).eval()  # fmt: skip
    x = torch.randn(4, 16)
    bf = pdlkit.explain(model.to(torch.bfloat16), x.bfloat16(), target="yitian")
    assert sorted(s.kernel for s in bf.substitutions) == [
        "a64_linear_bf16", "a64_linear_gelu_bf16", "a64_linear_relu_bf16",
    ]  # fmt: skip
    assert (
        main(
            ["explain", str(ROOT / "examples" / "mlp.py") + ":example", "--target", "yitian", "-v"]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "linear_gelu -> linear_gelu_onednn" in out
    assert "passed over a64_linear_gelu_bf16: x is float32, the kernel takes bfloat16" in out


# -- PyTorch's own AArch64 int8 path: the same torch code runs here ----------------------------


@pytest.mark.parametrize(
    ("m", "k", "n", "signed", "post"),
    [(1, 7, 3, False, "none"), (5, 33, 17, True, "relu"), (8, 64, 40, False, "gelu")],
)
def test_torch_int8_path_matches_the_reference(m, k, n, signed, post):
    pytest.importorskip("torchao", reason="needs torchao (pip install -e '.[quant]')")
    load_kernel_file(shipped_kernels() / "ops" / "logical_ops.py")  # the ops, then kernels
    kernels = {d.name: d for d in load_kernel_file(A64 / "torch_int8.py")}
    g = torch.Generator().manual_seed(m * k + n)
    lo, hi, dt = (-128, 128, torch.int8) if signed else (0, 256, torch.uint8)
    x_q = torch.randint(lo, hi, (m, k), generator=g, dtype=dt)
    w_q = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    w_scale, w_zp = torch.rand(n, generator=g) * 0.01 + 1e-3, torch.zeros(n, dtype=torch.int64)
    bias, xzp = torch.randn(n, generator=g), (-5 if signed else 131)
    args = (x_q, 0.02, xzp, w_q, w_scale, w_zp, bias)
    tail = (post, "tanh" if post == "gelu" else "")
    cases = {
        "torch_qlinear_aarch64": (*args, *tail),
        "torch_qlinear_q_aarch64": (*args, 0.05, 3, 0, 255, *tail),
        "torch_qlinear_dynamic_aarch64": (
            x_q,
            torch.tensor([0.02], dtype=torch.float64),
            torch.tensor([xzp]),
            *args[3:],
            *tail,
        ),  # fmt: skip
    }
    pt = (*args[:4], float(w_scale[0]), 0, bias)  # the weight's qparams as numbers
    cases["torch_qlinear_pt_aarch64"] = (*pt, *tail)
    cases["torch_qlinear_q_pt_aarch64"] = (*pt, 0.05, -3, -128, 127, *tail)
    dyn = cases["torch_qlinear_dynamic_aarch64"]
    cases["torch_qlinear_dynamic_pt_aarch64"] = (*dyn[:4], *pt[4:], *tail)
    for name, a in cases.items():
        decl = kernels[name]
        assert decl.requires == {"asimddp"} and decl.priority == 0
        got = bind(decl)(*a, 0)  # through the bound op: pre-pack cache included
        want = lookup(decl.op).fn(*a)  # type: ignore[union-attr]
        if want.dtype in (torch.uint8, torch.int8):
            assert (got.int() - want.int()).abs().max().item() <= 1, name
        else:
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, msg=name)


@not_on_aarch64
def test_aarch64_benchmark_refuses_to_run_here():
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "aarch64_bert.py")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 1
    assert "measures on an AArch64 host" in r.stderr and "--target yitian" in r.stderr


def test_an_x86_plan_does_not_list_the_aarch64_kernels():
    """Kernels for another CPU architecture are left out of "passed over" when a kernel was found."""
    q, x = _quantized_mlp()
    report = pdlkit.explain(q, x, target="x86-avx512-vnni")
    # the fused VNNI GEMM kernels where this x86 host declared them, else oneDNN's
    from pdlkit.runtime_abi.native_build import host_arch

    suffix = "vnni" if host_arch() == "x86_64" else "onednn"
    assert sorted(s.kernel for s in report.substitutions) == sorted(
        [f"qlinear_{suffix}", f"qlinear_q_{suffix}"]
    )
    passed_over = [str(p) for s in report.substitutions for p in s.passed_over]
    assert not any("a64_" in p for p in passed_over), passed_over
    assert "passed over a64_" not in str(report)


@pytest.mark.parametrize("dynamic", [False, True])
def test_arm_inductor_quantizer_graphs_use_the_per_tensor_kernels(dynamic):
    """torchao's ArmInductorQuantizer (s8 activations, per-tensor weights) on target yitian."""
    model, x = _mlp()
    import torchao.quantization.pt2e.quantizer.arm_inductor_quantizer as aiq
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    config = aiq.get_default_arm_inductor_quantization_config(is_dynamic=dynamic)
    quantizer = aiq.ArmInductorQuantizer().set_global(config)
    prepared = prepare_pt2e(torch.export.export(model, (x,)).module(), quantizer)
    prepared(x)  # one calibration batch
    q = convert_pt2e(prepared)
    chosen = sorted(
        (s.pattern, s.kernel) for s in pdlkit.explain(q, x, target="yitian").substitutions
    )
    if dynamic:
        assert chosen == [
            ("pt_qlinear_dyn", "a64_qlinear_dynamic_pt_i8mm"),
            ("pt_qlinear_dyn_gelu", "a64_qlinear_dynamic_pt_i8mm"),
        ]
    else:
        assert chosen == [
            ("pt_qlinear", "a64_qlinear_pt_i8mm"),
            ("pt_qlinear_gelu_q", "a64_qlinear_q_pt_i8mm"),
        ]

"""PT2E int8 graphs on x86: the shipped qlinear patterns route GEMMs to oneDNN kernels."""

from __future__ import annotations

import shutil

import pytest
import torch
from conftest import AMX_INT8, VNNI
from conftest import pt2e as quantized

import pdlkit

pt2e = pytest.importorskip(
    "torchao.quantization.pt2e.quantize_pt2e", reason="needs torchao (pip install -e '.[quant]')"
)
if not VNNI:
    pytest.skip(
        "the oneDNN int8 kernels are declared for avx512_vnni hosts", allow_module_level=True
    )


def quantize_static(model: torch.nn.Module, x: torch.Tensor) -> torch.nn.Module:
    import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as xiq

    quantizer = xiq.X86InductorQuantizer().set_global(
        xiq.get_default_x86_inductor_quantization_config()
    )
    return quantized(model, x, quantizer)


class Net(torch.nn.Module):
    def __init__(self, d: int, h: int, act: str):
        super().__init__()
        self.fc1, self.fc2, self.act = torch.nn.Linear(d, h), torch.nn.Linear(h, d), act

    def forward(self, x):
        y = self.fc1(x)
        y = torch.relu(y) if self.act == "relu" else torch.nn.functional.gelu(y)
        return self.fc2(y)


@pytest.mark.parametrize(
    ("act", "d", "h", "m", "fused"),
    [
        ("relu", 16, 32, 4, "qlinear_relu_q"),
        ("gelu", 16, 32, 4, "qlinear_gelu_q"),
        ("relu", 7, 5, 1, "qlinear_relu_q"),  # K not a multiple of 4, M = 1
    ],
)
def test_int8_gemms_become_onednn_calls_matching_pt2e(act, d, h, m, fused):
    torch.manual_seed(0)
    x = torch.randn(m, d)
    q = quantize_static(Net(d, h, act).eval(), x)
    report = pdlkit.explain(q, x)
    assert report.counts() == {fused: 1, "qlinear": 1}
    pdlkit.stats(reset=True)
    with torch.no_grad():
        f = pdlkit.optimize(q)
        ref = q(x)
        for _ in range(2):
            torch.testing.assert_close(f(x), ref, rtol=1e-4, atol=1e-4)
    st = pdlkit.stats()
    assert st["kernel_calls"] == 4 and st["fallbacks"] == 0
    assert (st["prepack_misses"], st["prepack_hits"]) == (2, 2)  # weights packed once


def test_onednn_kernels_decline_weight_zero_points_which_onednn_ignores():
    """oneDNN's qlinear_pointwise computes as if every weight zero point were 0: a nonzero one
    is declined (the reference runs), a zero one still computes."""
    from pathlib import Path

    from pdlkit.kernels.ops.logical_ops import qlinear
    from pdlkit.runtime_abi.registry import load_kernel_file

    path = Path(__file__).resolve().parents[1] / "kernels" / "x86" / "qlinear_onednn.py"
    decl = {k.name: k for k in load_kernel_file(path)}["qlinear_onednn"]
    g = torch.Generator().manual_seed(0)
    x_q = torch.randint(0, 256, (2, 16), generator=g, dtype=torch.uint8)
    w_q = torch.randint(-127, 128, (4, 16), generator=g, dtype=torch.int8)
    ws, packed = torch.full((4,), 0.01), decl.prepack(w_q, {})
    zero = torch.zeros(4, dtype=torch.int64)
    got = decl.fn(x_q, 0.02, 10, packed, ws, zero, None, "none", "")
    torch.testing.assert_close(got, qlinear(x_q, 0.02, 10, w_q, ws, zero, None, "none", ""))
    with pytest.raises(pdlkit.KernelUnsupported, match="weight zero points"):
        decl.fn(x_q, 0.02, 10, packed, ws, torch.tensor([0, 3, -5, 127]), None, "none", "")


def test_quantized_3d_activations(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(2, 8, 16)
    q = quantize_static(Net(16, 32, "relu").eval(), x)
    with torch.no_grad():
        torch.testing.assert_close(pdlkit.optimize(q)(x), q(x), rtol=1e-4, atol=1e-4)


def test_dynamic_int8_runs_the_vnni_gemm_with_each_calls_scale():
    """int8-dynamic (choose_qparams per call): both linears run qgemm_vnni.c's GEMM (on AMX
    tiles where granted), the activation's scale and zero point read from that call's
    tensors; a second input with other qparams still matches."""
    from pdlkit.quantization import quantize

    torch.manual_seed(0)
    x = torch.randn(4, 16)
    q = quantize(Net(16, 32, "gelu").eval(), (x,), scheme="int8-dynamic")
    assert pdlkit.explain(q, x).counts() == {"qlinear_dyn_gelu": 1, "qlinear_dyn": 1}
    pdlkit.stats(reset=True)
    with torch.no_grad():
        f = pdlkit.optimize(q)
        torch.testing.assert_close(f(x), q(x), rtol=1e-4, atol=1e-4)
        x2 = 5 * torch.randn(4, 16) + 2  # another range: another scale and zero point
        torch.testing.assert_close(f(x2), q(x2), rtol=1e-4, atol=1e-4)
    by = pdlkit.stats()["by_kernel"]
    engine = "amx" if AMX_INT8 else "vnni"
    assert by[f"qlinear_dynamic_{engine}"]["kernel_calls"] == 4


def test_dynamic_sites_add_nothing_to_the_saving_that_skips_inductors_graph(monkeypatch, tmp_path):
    """Each site of an int8-dynamic model is accounted as dynamic (its activation's qparams
    come from choose_qparams, outside the matched slice), so the sites' saving that lets the
    whole-graph check skip Inductor's graph stays 0 (GPT-2's "saved" 20% of a graph that ran
    10% slower than Inductor's on the AVX-512 EPYC)."""
    from pdlkit.matcher import choose
    from pdlkit.quantization import quantize

    monkeypatch.setenv("PDLKIT_CACHE_DIR", str(tmp_path))
    seen = []
    real = choose.Tuner._account

    def spy(self, decision, dynamic=False):
        real(self, decision, dynamic)
        seen.append((dynamic, self.saved_us))

    monkeypatch.setattr(choose.Tuner, "_account", spy)
    torch.manual_seed(0)
    x = torch.randn(4, 16)
    q = quantize(Net(16, 32, "gelu").eval(), (x,), scheme="int8-dynamic")
    with torch.no_grad():
        pdlkit.optimize(q, autotune="full")(x)
    assert seen and all(dynamic and saved in (0.0, None) for dynamic, saved in seen), seen


def _dynamic_operands(x_dtype, seed=0, m=7, k=37, n=70):
    g = torch.Generator().manual_seed(seed)
    lo, hi = (0, 256) if x_dtype is torch.uint8 else (-128, 128)
    x_q = torch.randint(lo, hi, (m, k), generator=g).to(x_dtype)
    w_q = torch.randint(-127, 128, (n, k), generator=g).to(torch.int8)
    ws = torch.rand(n, generator=g) * 0.01 + 1e-3
    return x_q, w_q, ws, torch.zeros(n, dtype=torch.int64), torch.randn(n, generator=g)


@pytest.mark.parametrize(
    ("x_dtype", "zp"),
    [(torch.uint8, 0), (torch.uint8, 128), (torch.uint8, 255), (torch.int8, -128), (torch.int8, 3)],
)
def test_dynamic_vnni_kernel_scales_its_column_terms_by_each_calls_zero_point(x_dtype, zp):
    """One pre-pack (made without a zero point), calls with any zero point of the dtype: the
    op's reference (dequantize with the call's tensors, linear, GELU), K not a multiple of 4."""
    from pdlkit.kernels.ops.logical_ops import qlinear_dynamic
    from pdlkit.kernels.x86 import qlinear_vnni

    decl = qlinear_vnni.qlinear_dynamic_vnni
    x_q, w_q, ws, wz, b = _dynamic_operands(x_dtype)
    packed = decl.prepack(w_q, {"post_op": "gelu", "algorithm": "none"})
    xs, xz = torch.tensor([0.02], dtype=torch.float64), torch.tensor([zp])
    got = decl.fn(x_q, xs, xz, packed, ws, wz, b, "gelu", "none")
    want = qlinear_dynamic(x_q, xs, xz, w_q, ws, wz, b, "gelu", "none")
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_dynamic_vnni_kernel_declines_a_zero_point_outside_the_activations_dtype():
    from pdlkit.kernels.x86 import qlinear_vnni

    decl = qlinear_vnni.qlinear_dynamic_vnni
    x_q, w_q, ws, wz, b = _dynamic_operands(torch.uint8)
    packed = decl.prepack(w_q, {"post_op": "none", "algorithm": ""})
    xs = torch.tensor([0.02], dtype=torch.float64)
    with pytest.raises(pdlkit.KernelUnsupported, match="x_zp 300 outside"):
        decl.fn(x_q, xs, torch.tensor([300]), packed, ws, wz, b, "none", "")


def test_arm_style_dynamic_graph_with_per_tensor_weights_runs_the_vnni_gemm():
    """torchao's ArmInductorQuantizer, dynamic (s8 activations quantized per call, per-tensor
    weights), on this x86 host: both linears become qlinear_dynamic_pt kernels (before, no x86
    kernel took that op and they stayed with Inductor); outputs as the PT2E model's."""
    import torchao.quantization.pt2e.quantizer.arm_inductor_quantizer as aiq

    torch.manual_seed(0)
    x = torch.randn(4, 16)
    config = aiq.get_default_arm_inductor_quantization_config(is_dynamic=True)
    q = quantized(Net(16, 32, "gelu").eval(), x, aiq.ArmInductorQuantizer().set_global(config))
    engine = "amx" if AMX_INT8 else "vnni"
    chosen = sorted((s.pattern, s.kernel) for s in pdlkit.explain(q, x).substitutions)
    assert chosen == [
        ("pt_qlinear_dyn", f"qlinear_dynamic_pt_{engine}"),
        ("pt_qlinear_dyn_gelu", f"qlinear_dynamic_pt_{engine}"),
    ]
    with torch.no_grad():
        torch.testing.assert_close(pdlkit.optimize(q)(x), q(x), rtol=1e-4, atol=1e-4)


def test_onednn_dynamic_kernel_matches_the_op():
    """The oneDNN kernel of qlinear_dynamic (the VNNI one now wins static priority)."""
    from pathlib import Path

    from pdlkit.kernels.ops.logical_ops import qlinear_dynamic
    from pdlkit.runtime_abi.registry import load_kernel_file

    path = Path(__file__).resolve().parents[1] / "kernels" / "x86" / "qlinear_onednn.py"
    decl = {k.name: k for k in load_kernel_file(path)}["qlinear_dynamic_onednn"]
    x_q, w_q, ws, wz, b = _dynamic_operands(torch.uint8, m=4, k=16, n=8)
    xs, xz = torch.tensor([0.02], dtype=torch.float64), torch.tensor([37])
    got = decl.fn(x_q, xs, xz, decl.prepack(w_q, {}), ws, wz, b, "relu", "")
    torch.testing.assert_close(got, qlinear_dynamic(x_q, xs, xz, w_q, ws, wz, b, "relu", ""))


class Block(torch.nn.Module):
    """A transformer output projection: linear -> dropout (eval) -> add(residual)."""

    def __init__(self):
        super().__init__()
        self.fc, self.drop = torch.nn.Linear(16, 16), torch.nn.Dropout(0.1)

    def forward(self, x):
        return torch.nn.functional.layer_norm(self.drop(self.fc(x)) + x, (16,))


def test_residual_add_through_eval_dropout_is_a_binary_post_op(tmp_path):
    from pdlkit.config import shipped_patterns

    torch.manual_seed(0)
    x = torch.randn(4, 16)
    q = quantize_static(Block().eval(), x)
    # the shipped manifest fuses the add with the LayerNorm after it (qlinear_add_layer_norm)
    # and ships qlinear_add disabled
    shipped = pdlkit.explain(q, x)
    assert (
        shipped.counts() == {"qlinear_dropout_add_layer_norm": 1}
        and shipped.silent_patterns()["qlinear_add_dropout"] == "disabled"
    )
    # a manifest lists files in its folder only: a copy of the shipped pattern file, enabled
    shutil.copy(shipped_patterns() / "x86" / "qlinear_add.pdl.mlir", tmp_path)
    (tmp_path / "on.yaml").write_text("version: 1\npatterns:\n  - file: qlinear_add.pdl.mlir\n")
    assert pdlkit.explain(q, x, patterns=tmp_path).counts() == {"qlinear_add_dropout": 1}
    with torch.no_grad():
        torch.testing.assert_close(
            pdlkit.optimize(q, patterns=tmp_path)(x), q(x), rtol=1e-4, atol=1e-4
        )


class PerGroup(torch.nn.Module):
    """A linear whose int4-range weights are quantized per group of 32 input channels."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.register_buffer("wq", torch.randint(-8, 8, (16, 64), generator=g, dtype=torch.int8))
        self.register_buffer("ws", torch.rand(16, 2, generator=g) * 0.1)
        self.register_buffer("wz", torch.zeros(16, 2, dtype=torch.int64))
        self.b = torch.nn.Parameter(torch.randn(16, generator=g))

    def forward(self, x):
        qd = torch.ops.quantized_decomposed
        w = qd.dequantize_per_channel_group(
            self.wq, self.ws, self.wz, -8, 7, torch.int8, 32, torch.float32
        )
        xq = qd.quantize_per_tensor(x, 0.05, 128, 0, 255, torch.uint8)
        xd = qd.dequantize_per_tensor(xq, 0.05, 128, 0, 255, torch.uint8)
        return torch.nn.functional.linear(xd, w, self.b)


def test_per_group_weights_are_a_near_miss_left_to_inductor():
    x = torch.randn(4, 64)
    model = PerGroup().eval()
    report = pdlkit.explain(model, x)
    assert report.substitutions == []  # neither an int8 kernel nor a float one on the dequantized w
    reasons = {m.pattern: str(m.reason) for m in report.near_misses}
    assert reasons["qlinear_per_group"] == (
        "no eligible kernel for 'qlinear_per_group': no kernel implements logical op "
        "'qlinear_per_group'"
    )
    assert reasons["linear"].startswith("constraint not_dequantized(")
    with torch.no_grad():
        torch.testing.assert_close(pdlkit.optimize(model)(x), model(x), rtol=1e-5, atol=1e-5)


def test_float_model_is_left_to_inductor_by_the_int8_patterns():
    from pdlkit.config import shipped_patterns

    torch.manual_seed(0)
    x = torch.randn(4, 16)
    model = Net(16, 32, "gelu").eval()
    x86 = shipped_patterns() / "x86"
    assert pdlkit.explain(model, x, patterns=x86).substitutions == []
    with torch.no_grad():
        torch._dynamo.reset()
        inductor = torch.compile(model)(x)
        torch._dynamo.reset()
        assert torch.equal(pdlkit.optimize(model, patterns=x86)(x), inductor)

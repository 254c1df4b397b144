"""Patterns from Python: gen-pattern traces a reference function into a readable PDL pattern."""

from __future__ import annotations

import pytest
import torch
from conftest import KERNEL_HEADER, lin_kernel, write
from pdlkit.matcher import load_patterns, pattern_from_function
from pdlkit.matcher.gen_pattern import GenPatternError
from pdlkit.matcher.substitute import substitute
from pdlkit.runtime_abi.capability import host
from pdlkit.runtime_abi.reference import lookup
from pdlkit.runtime_abi.registry import KernelRegistry
from test_substitute import body, trace

import pdlkit
from pdlkit.cli import main

F = torch.nn.functional
XWB = (torch.randn(4, 8), torch.randn(6, 8), torch.randn(6))


def linear_relu(x, w, b):
    return torch.relu(F.linear(x, w, b))


def linear_gelu_tanh(x, weight, bias):
    return F.gelu(F.linear(x, weight, bias), approximate="tanh")


KERNELS = (
    lin_kernel("gen_linear_relu", "gen_lr", "return torch.relu(x @ w.t() + b)")
    + """
@pdlkit.kernel(op="gen_linear_gelu_tanh", meta=meta)
def gen_lg(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    return torch.nn.functional.gelu(x @ weight.t() + bias, approximate="tanh")
"""
)


def _substitute(tmp_path, patterns: dict[str, str], fn, args):
    for name, text in patterns.items():
        write(tmp_path / "p", name, text)
    write(tmp_path / "k", "k.py", KERNEL_HEADER + KERNELS)
    gm = trace(fn, *args)
    reg = KernelRegistry.from_folders([tmp_path / "k"])
    return substitute(gm, load_patterns([tmp_path / "p"]), reg, host())


def test_generated_text_is_readable_and_stable():
    text = pattern_from_function(linear_relu, XWB, op="gen_linear_relu")
    for golden in [
        "// linear -> relu   ->   pdlkit_call('gen_linear_relu', x, w, b)",
        "pdl.pattern @linear_relu : benefit(1) {",
        '%linear = pdl.operation "torch.aten.linear"(%x, %w, %b : !pdl.value, !pdl.value, !pdl.value) -> (%linear_t : !pdl.type)',
        "%linear_out = pdl.result 0 of %linear",
        '%relu = pdl.operation "torch.aten.relu"(%linear_out : !pdl.value) -> (%relu_t : !pdl.type)',
        '%x_dtype = pdl.attribute = "float32"',
        'pdl.apply_native_constraint "has_dtype"(%x, %x_dtype : !pdl.value, !pdl.attribute)',
        'pdl.apply_native_constraint "single_use"(%linear_out : !pdl.value)',
        'pdl.apply_native_rewrite "pdlkit_call"(%op, %x, %w, %b, %relu : !pdl.attribute, !pdl.value, !pdl.value, !pdl.value, !pdl.operation)',
    ]:
        assert golden in text
    assert pattern_from_function(linear_relu, XWB, op="gen_linear_relu") == text


def test_generated_pattern_substitutes_exactly_its_subgraph(tmp_path):
    text = pattern_from_function(linear_relu, XWB, op="gen_linear_relu")

    def model(x, w, b, w2, b2):  # one linear+relu site; the second linear has no relu
        return F.linear(torch.relu(F.linear(x, w, b)), w2, b2)

    args = (*XWB, torch.randn(3, 6), torch.randn(3))
    out = _substitute(tmp_path, {"lr.pdl.mlir": text}, model, args)
    assert body(out.graph) == [
        "gen_lr_default = torch.ops.pdlkit.gen_lr.default(x_1, w_1, b_1, SITE)",
        "linear_1 = torch.ops.aten.linear.default(gen_lr_default, w2_1, b2_1)",
        "return linear_1",
    ]
    (sub,) = out.report.substitutions
    assert (sub.pattern, sub.kernel, sub.replaced) == ("linear_relu", "gen_lr", ["relu", "linear"])
    torch.testing.assert_close(out.graph(*args), model(*args))


def test_constant_in_the_function_becomes_a_constraint(tmp_path):
    text = pattern_from_function(linear_gelu_tanh, XWB, op="gen_linear_gelu_tanh", benefit=2)
    assert '%approximate_value = pdl.attribute = "tanh"' in text
    assert (
        'pdl.apply_native_constraint "constant_equals"(%approximate, %approximate_value : '
        "!pdl.value, !pdl.attribute)"
    ) in text

    def model(x, w, b):  # tanh GELU is substituted, the exact one is a near miss
        return F.gelu(F.linear(x, w, b), approximate="tanh") + F.gelu(F.linear(x, w, b))

    out = _substitute(tmp_path, {"lg.pdl.mlir": text}, model, XWB)
    assert [s.kernel for s in out.report.substitutions] == ["gen_lg"]
    assert (
        body(out.graph)[0]
        == "gen_lg_default = torch.ops.pdlkit.gen_lg.default(x_1, w_1, b_1, SITE)"
    )
    assert any(
        "constraint constant_equals(" in m.reason and "'none'" in m.reason
        for m in out.report.near_misses
    )
    torch.testing.assert_close(out.graph(*XWB), model(*XWB))


def test_dtype_constraint_follows_the_examples(tmp_path):
    bf16 = tuple(t.to(torch.bfloat16) for t in XWB)
    text = pattern_from_function(linear_relu, bf16, op="gen_linear_relu")
    assert '%x_dtype = pdl.attribute = "bfloat16"' in text
    out = _substitute(tmp_path, {"lr.pdl.mlir": text}, linear_relu, XWB)  # f32 model
    assert out.report.substitutions == []


def test_compiled_model_uses_the_generated_pattern(tmp_path, mlp):
    model, x = mlp
    fc1 = model.fc1
    text = pattern_from_function(
        linear_relu, (x, fc1.weight.detach(), fc1.bias.detach()), op="gen_linear_relu"
    )
    write(tmp_path / "p", "lr.pdl.mlir", text)
    write(tmp_path / "k", "k.py", KERNEL_HEADER + KERNELS)
    kw = {"patterns": [tmp_path / "p"], "kernels": [tmp_path / "k"]}
    assert pdlkit.explain(model, x, **kw).counts() == {"linear_relu": 1}
    pdlkit.stats(reset=True)
    with torch.no_grad():
        torch.testing.assert_close(pdlkit.optimize(model, **kw)(x), model(x))
    assert pdlkit.stats()["by_kernel"]["gen_lr"]["kernel_calls"] == 1


def test_cli_writes_pattern_and_reference_beside_it(tmp_path):
    src = write(
        tmp_path,
        "refs.py",
        """
        import torch
        import torch.nn.functional as F


        def linear_relu(x, w, b):
            return torch.relu(F.linear(x, w, b))
        """,
    )
    out = tmp_path / "gen_lr.pdl.mlir"
    rc = main(
        ["gen-pattern", f"{src}:linear_relu", "--example-shapes", "4x8,6x8,6",
         "--op", "gen_lr_cli", "-o", str(out)]
    )  # fmt: skip
    assert rc == 0
    assert "// Reference semantics: gen_lr.reference.py" in out.read_text()
    (p,) = load_patterns([out]).patterns
    assert (p.name, p.root, p.calls) == ("linear_relu", "torch.aten.relu", ("gen_lr_cli",))
    ref_file = tmp_path / "gen_lr.reference.py"
    ns: dict = {}
    exec(compile(ref_file.read_text(), str(ref_file), "exec"), ns)
    ref = lookup("gen_lr_cli")
    assert ref is not None
    (example,) = ref.examples(torch.float32)
    assert [tuple(t.shape) for t in example] == [(4, 8), (6, 8), (6,)]
    torch.testing.assert_close(ref.fn(*example), linear_relu(*example))


@pytest.mark.parametrize(
    ("fn", "args", "message"),
    [
        (linear_relu, XWB[:2], r"takes 3 parameter\(s\) \(x, w, b\), 2 example input\(s\) given"),
        (lambda x, w, b: x, XWB, "returns its input unchanged"),
        (
            lambda x, w, b: F.linear(x, w),
            XWB,
            r"parameter\(s\) b of <lambda> do not reach its result",
        ),
        (linear_relu, (*XWB[:2], [1.0]), "parameter 'b': example inputs are tensors or Python"),
        (
            lambda x, w, b: F.linear(x, w, b) * torch.tensor([2.0]),
            XWB,
            r"reads a tensor constant made inside <lambda> \(_tensor_constant0\)",
        ),
        (linear_relu, (*XWB[:2], 1.0), "tracing linear_relu failed: TypeError: linear()"),
    ],
)
def test_functions_that_cannot_be_patterns_say_why(fn, args, message):
    with pytest.raises(GenPatternError, match=message):
        pattern_from_function(fn, args, op="x")


def qlinear_ref(x_q, x_scale, x_zp, w_q, w_scale, w_zp, bias):
    qd = torch.ops.quantized_decomposed
    x = qd.dequantize_per_tensor(x_q, x_scale, x_zp, 0, 255, torch.uint8)
    w = qd.dequantize_per_channel(w_q, w_scale, w_zp, 0, -128, 127, torch.int8)
    return F.linear(x, w, bias)


QLINEAR_KERNEL = """
@pdlkit.kernel(op="gen_qlinear", meta=lambda xq, xs, xzp, wq, ws, wzp, b: torch.empty(
    (*xq.shape[:-1], wq.shape[0]), dtype=torch.float32, device=xq.device))
def gen_qlinear_ref(x_q: Tensor, x_scale: float, x_zp: int, w_q: Tensor, w_scale: Tensor,
                    w_zp: Tensor, bias: Tensor) -> Tensor:
    x = (x_q.float() - x_zp) * x_scale
    w = (w_q.float() - w_zp[:, None].float()) * w_scale[:, None]
    return torch.nn.functional.linear(x, w, bias)
"""


def test_scalar_parameters_become_constant_operands_of_a_pt2e_pattern(tmp_path):
    pytest.importorskip(
        "torchao.quantization.pt2e", reason="needs torchao (pip install -e '.[quant]')"
    )
    from pdlkit.quantization.pt2e import quantize

    examples = (
        torch.zeros(4, 16, dtype=torch.uint8), 0.05, 128,
        torch.zeros(32, 16, dtype=torch.int8), torch.rand(32), torch.zeros(32, dtype=torch.int64),
        torch.rand(32),
    )  # fmt: skip
    text = pattern_from_function(qlinear_ref, examples, op="gen_qlinear", benefit=9)
    assert (
        "// Generated by pdlkit gen-pattern from qlinear_ref(x_q: uint8[4, 16], x_scale: float, x_zp: int,"
        in text
    )
    assert 'pdl.apply_native_constraint "is_constant"(%x_scale : !pdl.value)' in text
    assert '%x_q_dtype = pdl.attribute = "uint8"' in text
    assert "x_scale_dtype" not in text
    write(tmp_path / "p", "q.pdl.mlir", text)
    write(tmp_path / "k", "k.py", KERNEL_HEADER + QLINEAR_KERNEL)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    x = torch.randn(4, 16)
    q = quantize(model.eval(), (x,))
    kw = {"patterns": [tmp_path / "p"], "kernels": [tmp_path / "k"]}
    report = pdlkit.explain(q, x, **kw)
    assert report.counts() == {"qlinear_ref": 2}
    assert [s.kernel for s in report.substitutions] == ["gen_qlinear_ref"] * 2
    with torch.no_grad():
        torch.testing.assert_close(pdlkit.optimize(q, **kw)(x), q(x), rtol=1e-4, atol=1e-4)


def test_value_read_twice_inside_the_function_is_not_single_use(tmp_path):
    def linear_silu(x, w, b):
        y = F.linear(x, w, b)
        return y * torch.sigmoid(y)

    text = pattern_from_function(linear_silu, XWB, op="gen_linear_silu")
    assert '"single_use"(%linear_out' not in text
    assert 'pdl.apply_native_constraint "single_use"(%sigmoid_out : !pdl.value)' in text
    kernel = """
@pdlkit.kernel(op="gen_linear_silu", meta=meta)
def gen_ls(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    return torch.nn.functional.silu(x @ w.t() + b)
"""
    write(tmp_path / "p", "ls.pdl.mlir", text)
    write(tmp_path / "k", "k.py", KERNEL_HEADER + kernel)
    out = substitute(
        trace(linear_silu, *XWB),
        load_patterns([tmp_path / "p"]),
        KernelRegistry.from_folders([tmp_path / "k"]),
        host(),
    )
    assert [s.replaced for s in out.report.substitutions] == [["mul", "sigmoid", "linear"]]
    torch.testing.assert_close(out.graph(*XWB), linear_silu(*XWB))

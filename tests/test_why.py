"""explain --why: for each candidate root, the first failing op, operand or constraint."""

from __future__ import annotations

import pytest
import torch
from conftest import KERNEL_HEADER, LINEAR_GELU, LinRelu, linear_act_pattern, pdl_pattern, write

import pdlkit
from pdlkit.cli import main

LIN_RELU = """
@pdlkit.kernel(op="lin_relu", meta=meta)
def k_lin_relu(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    return torch.relu(x @ w.t() + b)
"""


def why(tmp_path, pattern: str, model, *inputs, kernel: str = LIN_RELU, **kw) -> list[str]:
    p, k = tmp_path / "p", tmp_path / "k"
    write(p, "a.pdl.mlir", pattern)
    write(k, "k.py", KERNEL_HEADER + kernel)
    report = pdlkit.explain(model, *inputs, patterns=p, kernels=k, why="lr", **kw)
    assert not report.substitutions
    text = str(report)
    assert "why lr did not match" in text
    return [line for g in report.graphs for line in g.why["lr"]]


def test_op_mismatch_names_the_op_found_and_the_op_wanted(tmp_path):
    class MatmulRelu(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(8, 8))

        def forward(self, x):
            return torch.relu(x @ torch.tanh(self.w))  # a computed operand: stays a matmul

    lines = why(
        tmp_path, linear_act_pattern("lr", "relu", "lin_relu"), MatmulRelu(), torch.randn(2, 8)
    )
    assert lines == [
        "root relu (ops 1/2, constraints 0/0): operand 0 of relu (torch.aten.relu) is "
        "matmul (torch.aten.matmul); the pattern wants %lin = torch.aten.linear (line 6)"
    ]


def test_dtype_constraint_says_which_dtype_it_found(tmp_path):
    extra = """%i8 = pdl.attribute = "int8"
      pdl.apply_native_constraint "has_dtype"(%w, %i8 : !pdl.value, !pdl.attribute)"""
    model = LinRelu().to(torch.bfloat16).eval()
    lines = why(
        tmp_path,
        linear_act_pattern("lr", "relu", "lin_relu", extra=extra),
        model,
        torch.randn(2, 8, dtype=torch.bfloat16),
    )
    assert len(lines) == 1
    assert lines[0].startswith(
        "root relu (ops 2/2, constraints 0/1): constraint has_dtype(%w, %i8)"
    )
    assert lines[0].endswith("dtype is bfloat16, the constraint wants int8")


def test_constant_value_constraint_says_which_value_it_found(tmp_path):
    match = f"""
{LINEAR_GELU}
  pdl.apply_native_constraint "single_use"(%y : !pdl.value)
  pdl.apply_native_constraint "constant_equals"(%approx, %tanh : !pdl.value, !pdl.attribute)
"""
    pattern = pdl_pattern("lr", match, "%gelu", "lin_relu", "%x, %w, %b")

    class LinGelu(LinRelu):
        def forward(self, x):
            return torch.nn.functional.gelu(self.fc(x))

    lines = why(tmp_path, pattern, LinGelu().eval(), torch.randn(2, 8))
    assert lines == [
        "root gelu (ops 2/2, constraints 1/2): constraint constant_equals(%approx, %tanh) "
        "(line 12): %approx = 'none' is 'none', the constraint wants 'tanh'"
    ]


def test_kernel_isa_requirement_names_the_feature_and_target(tmp_path):
    kernel = """
@pdlkit.kernel(op="lin_relu", meta=meta, requires=["avx512_vnni"])
def k_vnni(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    return torch.relu(x @ w.t() + b)
"""
    lines = why(
        tmp_path,
        linear_act_pattern("lr", "relu", "lin_relu"),
        LinRelu().eval(),
        torch.randn(2, 8),
        kernel=kernel,
        target="yitian",
    )
    assert lines == [
        "root relu (ops 2/2, constraints 0/0): no eligible kernel for 'lin_relu': "
        "k_vnni: needs avx512_vnni, which target yitian lacks"
    ]


def test_shape_divisibility_names_the_dim_and_its_size(tmp_path):
    extra = """%last = pdl.attribute = -1 : i64
      %four = pdl.attribute = 4 : i64
      pdl.apply_native_constraint "dim_divisible_by"(%x, %last, %four : !pdl.value, !pdl.attribute, !pdl.attribute)"""
    lines = why(
        tmp_path,
        linear_act_pattern("lr", "relu", "lin_relu", extra=extra),
        LinRelu(k=30).eval(),
        torch.randn(2, 30),
    )
    assert len(lines) == 1
    assert "constraint dim_divisible_by(%x, %last, %four) (line 11): dim -1 of %x = " in lines[0]
    assert lines[0].endswith("is 30, not a multiple of 4")


def test_variadic_operands_are_unexplained_not_guessed(tmp_path):
    pattern = """
    pdl.pattern @lr : benefit(1) {
      %ins = pdl.operands
      %ts = pdl.types
      %relu = pdl.operation "torch.aten.relu"(%ins : !pdl.range<value>) -> (%ts : !pdl.range<type>)
      pdl.rewrite %relu {
        %op = pdl.attribute = "no_such_op"
        pdl.apply_native_rewrite "pdlkit_call"(%op, %relu : !pdl.attribute, !pdl.operation)
      }
    }
    """
    lines = why(tmp_path, pattern, LinRelu().eval(), torch.randn(2, 8))
    assert lines == [
        "root relu (ops 0/1, constraints 0/0): unexplained: the pattern matches a variadic "
        "operand list"
    ]


def test_claimed_roots_and_matches_are_named(mlp):
    model, x = mlp
    report = pdlkit.explain(model, x, why=("linear", "linear_relu"))
    lines = report.graphs[0].why
    assert lines["linear_relu"] == [
        "root relu: matched -> kernel " + report.substitutions[0].kernel
    ]
    assert (
        "root linear: claimed first by pattern linear_relu (benefit 2) -> kernel "
        f"{report.substitutions[0].kernel}" in lines["linear"]
    )


def test_a_model_where_nothing_fires_is_called_out():
    model = torch.nn.Sequential(torch.nn.ReLU())
    text = str(pdlkit.explain(model, torch.randn(2, 8)))
    assert "NO SUBSTITUTION: none of the" in text and "active pattern(s) fired" in text


def test_explain_why_command(tmp_path, capsys):
    write(
        tmp_path,
        "m.py",
        """
        import torch

        def example():
            model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh()).eval()
            return model, (torch.randn(2, 8),)
        """,
    )
    assert main(["explain", f"{tmp_path / 'm.py'}:example", "--why", "linear_relu"]) == 0
    out = capsys.readouterr().out
    assert "why linear_relu did not match" in out
    assert "no candidate root: op torch.aten.relu does not occur in the graph" in out


def test_pdl_compiled_from_pdll_is_explained_with_the_pdll_names(tmp_path):
    import shutil
    import subprocess
    from pathlib import Path

    pdll = shutil.which("mlir-pdll") or "/usr/lib/llvm-16/bin/mlir-pdll"
    if not Path(pdll).exists():
        pytest.skip("needs mlir-pdll (apt-get install mlir-16-tools)")
    src = write(
        tmp_path,
        "lr.pdll",
        """
        Constraint is_float_tensor(x: Value);
        Rewrite pdlkit_call(op: Attr, x: Value, w: Value, b: Value, root: Op);
        Pattern lr with benefit(1) {
          let lin = op<torch.aten.linear>(x: Value, w: Value, b: Value);
          let r = op<torch.aten.relu>(lin);
          is_float_tensor(w);
          rewrite r with { pdlkit_call(attr<"\\"lin_relu\\"">, x, w, b, r); };
        }
        """,
    )
    pdl = subprocess.run([pdll, str(src), "-x", "mlir"], capture_output=True, text=True, check=True)
    write(tmp_path / "p", "lr.pdl.mlir", pdl.stdout)
    write(tmp_path / "k", "k.py", KERNEL_HEADER + LIN_RELU)

    class MatmulRelu(torch.nn.Module):
        def forward(self, x, y):
            return torch.relu(x @ torch.tanh(y))

    report = pdlkit.explain(
        MatmulRelu(),
        torch.randn(2, 8),
        torch.randn(8, 8),
        patterns=tmp_path / "p",
        kernels=tmp_path / "k",
        why="lr",
    )
    assert report.graphs[0].why["lr"] == [
        "root relu (ops 1/2, constraints 0/1): operand 0 of relu (torch.aten.relu) is matmul "
        f"(torch.aten.matmul); the pattern wants lin = torch.aten.linear (line {src}:4)"
    ]

"""pdlkit lint: static checks over a pattern set, each finding at file:line."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import KERNEL_HEADER, linear_act_pattern, op_pattern, write
from pdlkit.matcher.lint import lint_paths
from pdlkit.matcher.pdll import find_mlir_pdll

from pdlkit.cli import main

ROOT = Path(__file__).resolve().parents[1]

KERNEL = """
@pdlkit.kernel(op="lr", meta=meta)
def k_lr(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    return torch.relu(x @ w.t() + b)
"""

RELU_ONLY = op_pattern("relu_any", "lr", benefit=3)


def lint(tmp_path, files: dict[str, str]) -> list[str]:
    for name, text in files.items():
        write(tmp_path / "p", name, text)
    write(tmp_path / "k", "k.py", KERNEL_HEADER + KERNEL)
    return [str(f) for f in lint_paths([tmp_path / "p"], kernels=[str(tmp_path / "k")])]


def test_equal_benefit_on_the_same_root_is_an_error(tmp_path):
    got = lint(
        tmp_path,
        {
            "a.pdl.mlir": linear_act_pattern("a", "relu", "lr", benefit=2),
            "b.pdl.mlir": linear_act_pattern("b", "relu", "lr", benefit=2),
        },
    )
    b = tmp_path / "p" / "b.pdl.mlir"
    assert got == [
        f"{b}:1: error: b and a ({tmp_path / 'p' / 'a.pdl.mlir'}:1) can claim the same "
        "torch.aten.relu with equal benefit 2; load order decides [equal-benefit]"
    ]


def test_equal_benefit_is_fine_when_constraints_exclude_each_other(tmp_path):
    dt = '%d = pdl.attribute = "{}"\n      pdl.apply_native_constraint "has_dtype"(%x, %d : !pdl.value, !pdl.attribute)'
    got = lint(
        tmp_path,
        {
            "a.pdl.mlir": linear_act_pattern("a", "relu", "lr", 2, dt.format("float32")),
            "b.pdl.mlir": linear_act_pattern("b", "relu", "lr", 2, dt.format("bfloat16")),
        },
    )
    assert got == []


def test_lower_benefit_pattern_shadowed_by_a_more_general_one(tmp_path):
    got = lint(
        tmp_path,
        {"a.pdl.mlir": RELU_ONLY, "b.pdl.mlir": linear_act_pattern("fused", "relu", "lr", 1)},
    )
    assert got == [
        f"{tmp_path / 'p' / 'b.pdl.mlir'}:1: error: fused is shadowed by relu_any "
        f"({tmp_path / 'p' / 'a.pdl.mlir'}:1, benefit 3): every match of fused is a match of "
        "relu_any [shadowed]"
    ]


def test_more_specific_pattern_with_higher_benefit_is_not_shadowing(tmp_path):
    fused = linear_act_pattern("fused", "relu", "lr", 5)
    assert lint(tmp_path, {"a.pdl.mlir": RELU_ONLY, "b.pdl.mlir": fused}) == []


def test_call_to_an_op_no_kernel_implements(tmp_path):
    got = lint(tmp_path, {"a.pdl.mlir": linear_act_pattern("a", "relu", "no_such_op")})
    assert got == [
        f"{tmp_path / 'p' / 'a.pdl.mlir'}:1: error: a calls logical op 'no_such_op', which no "
        "kernel implements (known: lr) [unknown-op]"
    ]


def test_unused_attribute_in_a_pdl_file_is_a_warning(tmp_path):
    extra = '%unused = pdl.attribute = "int8"'
    got = lint(tmp_path, {"a.pdl.mlir": linear_act_pattern("a", "relu", "lr", 1, extra)})
    assert got == [
        f'{tmp_path / "p" / "a.pdl.mlir"}:9: warning: pdl.attribute "int8" is declared but no '
        "constraint or rewrite uses it [unused-native]"
    ]


@pytest.mark.skipif(
    find_mlir_pdll() is None, reason="needs mlir-pdll (apt-get install mlir-16-tools)"
)
def test_unused_native_declared_in_a_pdll_file(tmp_path):
    text = """
    Constraint never_called(x: Value);
    Pattern p with benefit(1) {
      let root = op<torch.aten.relu>(x: Value);
      rewrite root with { pdlkit_call(attr<"\\"lr\\"">, (x), root); };
    }
    """
    got = lint(tmp_path, {"a.pdll": text})
    assert got == [
        f"{tmp_path / 'p' / 'a.pdll'}:1: warning: native constraint never_called is declared "
        "but never used [unused-native]"
    ]


def test_manifest_listing_a_missing_file(tmp_path):
    got = lint(
        tmp_path,
        {
            "a.pdl.mlir": linear_act_pattern("a", "relu", "lr"),
            "m.yaml": "version: 1\npatterns:\n  - file: a.pdl.mlir\n  - file: gone.pdl.mlir\n",
        },
    )
    assert got == [
        f"{tmp_path / 'p' / 'm.yaml'}:4: error: manifest lists 'gone.pdl.mlir', which does not "
        f"exist ({tmp_path / 'p' / 'gone.pdl.mlir'}) [missing-file]"
    ]


def test_exit_code_is_nonzero_on_errors_only(tmp_path, capsys):
    write(tmp_path / "k", "k.py", KERNEL_HEADER + KERNEL)
    warn = write(
        tmp_path / "w",
        "a.pdl.mlir",
        linear_act_pattern("a", "relu", "lr", 1, '%unused = pdl.attribute = "x"'),
    )
    err = write(tmp_path / "e", "a.pdl.mlir", linear_act_pattern("a", "relu", "nope"))
    assert main(["lint", str(warn), "--kernels", str(tmp_path / "k")]) == 0
    assert main(["lint", str(err), "--kernels", str(tmp_path / "k")]) == 1
    assert "[unknown-op]" in capsys.readouterr().out


def test_shipped_pattern_set_lints_clean(capsys):
    assert main(["lint", str(ROOT / "patterns"), str(ROOT / "kernels")]) == 0
    assert capsys.readouterr().out == ""


def test_patterns_for_different_targets_do_not_overlap(tmp_path):
    manifest = (
        "version: 1\npatterns:\n"
        "  - file: a.pdl.mlir\n    targets: [x86_64]\n"
        "  - file: b.pdl.mlir\n    targets: [aarch64]\n"
    )
    got = lint(
        tmp_path,
        {
            "a.pdl.mlir": linear_act_pattern("a", "relu", "lr", benefit=2),
            "b.pdl.mlir": linear_act_pattern("b", "relu", "lr", benefit=2),
            "m.yaml": manifest,
        },
    )
    assert got == []

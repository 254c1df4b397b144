"""Logical ops declared once (@pdlkit.op), kernels that implement them, and the checks that
hold them together: kernel signatures at load, pdlkit_call arguments in check / lint /
gen-pattern, one op per name; the dtype table; target-neutral PT2E patterns."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import linear_act, pdl_pattern, write
from pdlkit.matcher.lint import lint_paths
from pdlkit.matcher.patterns import PatternError, load_patterns
from pdlkit.runtime_abi.dtypes import dtype_from_code, mlir_name, torch_name
from pdlkit.runtime_abi.registry import KernelLoadError, KernelRegistry

from pdlkit.check import check_paths
from pdlkit.config import shipped_patterns

OPS = """
import torch
from torch import Tensor

import pdlkit


def _meta(x, w, b):
    return x.new_empty((*x.shape[:-1], w.shape[0]))


@pdlkit.op(meta=_meta, examples=lambda dtype: [(torch.randn(3, 4), torch.randn(5, 4), torch.randn(5))])
def lr(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    return torch.relu(torch.nn.functional.linear(x, w, b))
"""

KERNEL = """
import torch
import pdlkit


@pdlkit.kernel(implements="lr", dtypes={{"x": [torch.float32]}})
def {name}({params}){returns}:
    return torch.relu(torch.nn.functional.linear(x, w, b))
"""


def kernel_file(folder: Path, params: str = "x, w, b", returns: str = "") -> Path:
    return write(
        folder, "lr_mine.py", KERNEL.format(name="lr_mine", params=params, returns=returns)
    )


def test_a_kernel_takes_schema_meta_and_reference_from_its_op(tmp_path):
    ops = write(tmp_path / "k", "ops.py", OPS)
    kernel_file(tmp_path / "k")
    k = KernelRegistry.from_folders([tmp_path / "k"]).get("lr_mine")
    assert k is not None
    assert k.schema == "(Tensor x, Tensor w, Tensor? b) -> Tensor" and k.params == ("x", "w", "b")
    x, w = torch.randn(2, 4), torch.randn(3, 4)
    assert k.meta(x, w, None).shape == (2, 3)
    assert k.reference is not None and torch.equal(k.reference(x, w, None), torch.relu(x @ w.T))
    assert k.logical is not None and k.logical.source == f"{ops}:11"


def test_a_prefix_of_the_op_parameters_then_rest_is_a_signature(tmp_path):
    write(tmp_path / "k", "ops.py", OPS)
    kernel_file(tmp_path / "k", params="x, *rest")
    assert KernelRegistry.from_folders([tmp_path / "k"]).get("lr_mine").params == ("x", "w", "b")


def test_a_kernel_whose_parameters_are_not_its_ops_fails_at_load_naming_both(tmp_path):
    ops = write(tmp_path / "k", "ops.py", OPS)
    k = kernel_file(tmp_path / "k", params="x, weight, b")
    with pytest.raises(KernelLoadError) as e:
        KernelRegistry.from_folders([tmp_path / "k"])
    assert str(e.value) == (
        f"{k}:5: kernel 'lr_mine': its parameters (x, weight, b) are not those of op 'lr' (x, w, "
        f"b) declared at {ops}:11; name them as the op does (a prefix then *rest is fine)"
    )


def test_annotations_that_disagree_with_the_op_fail_at_load(tmp_path):
    write(tmp_path / "k", "ops.py", OPS)
    kernel_file(tmp_path / "k", "x: torch.Tensor, w: torch.Tensor, b: float", " -> torch.Tensor")
    with pytest.raises(KernelLoadError, match=r"annotations disagree with op 'lr' .*b: float"):
        KernelRegistry.from_folders([tmp_path / "k"])


def test_a_kernel_of_an_op_no_file_declares_fails_at_load(tmp_path):
    k = kernel_file(tmp_path / "k")
    with pytest.raises(KernelLoadError) as e:
        KernelRegistry.from_folders([tmp_path / "k"])
    assert str(e.value).startswith(
        f"{k}:5: kernel 'lr_mine' implements op 'lr', which no op file declares"
    )


def test_two_ops_of_one_name_are_one_error_naming_both(tmp_path):
    a = write(tmp_path / "k", "a_ops.py", OPS)
    b = write(tmp_path / "k", "b_ops.py", OPS)
    with pytest.raises(KernelLoadError) as e:
        KernelRegistry.from_folders([tmp_path / "k"])
    assert str(e.value) == (
        f"{b}:11: op 'lr' is declared twice: here and at {a}:11; an op is declared once "
        "(rename one, or implement the existing one)"
    )


def test_an_older_kernel_declared_with_op_and_meta_still_loads(tmp_path):
    write(tmp_path / "k", "ops.py", OPS)
    write(
        tmp_path / "k",
        "old.py",
        """
        import torch
        from torch import Tensor
        import pdlkit

        @pdlkit.kernel(op="lr", meta=lambda x, w, b: x.new_empty((x.shape[0], w.shape[0])))
        def lr_old(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
            return torch.relu(x @ weight.T)
        """,
    )
    k = KernelRegistry.from_folders([tmp_path / "k"]).get("lr_old")
    assert k is not None and k.params == ("x", "weight", "bias") and not k.from_op


def pattern_file(folder: Path, args: str, extra: str = "") -> Path:
    """linear -> relu calling op 'lr' with ``args``; its pdlkit_call at line 12, column 5."""
    pattern = pdl_pattern("p", linear_act("relu"), "%act", "lr", args, rewrite=extra)
    return write(folder, "p.pdl.mlir", pattern)


def test_check_and_lint_name_a_call_with_the_wrong_number_of_arguments(tmp_path):
    ops = write(tmp_path / "k", "ops.py", OPS)
    kernel_file(tmp_path / "k")
    p = pattern_file(tmp_path / "p", "%x, %w")
    want = f"pattern 'p' passes 2 arguments to op 'lr' ({ops}:11), which takes 3: x, w, b"
    problems, _ = check_paths([tmp_path / "p", tmp_path / "k"], kernels=[str(tmp_path / "k")])
    assert f"{p}:12:5: {want}" in problems
    found = [str(f) for f in lint_paths([tmp_path / "p"], kernels=[str(tmp_path / "k")])]
    assert f"{p}:12: error: {want} [op-call]" in found


def test_compiling_with_a_call_of_the_wrong_arity_fails_at_load_naming_the_line(tmp_path):
    """optimize (and the backend) check every pdlkit_call against its op when they load the
    patterns: one error naming file:line:col, before any graph is matched."""
    import torch

    import pdlkit

    write(tmp_path / "k", "ops.py", OPS)
    kernel_file(tmp_path / "k")
    p = pattern_file(tmp_path / "p", "%x, %w")
    torch._dynamo.reset()
    with pytest.raises(pdlkit.PdlkitError, match=rf"{p}:12:5: pattern 'p' passes 2 arguments"):
        pdlkit.optimize(
            torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()),
            patterns=tmp_path / "p",
            kernels=tmp_path / "k",
        )(torch.randn(2, 4))


def test_a_string_constant_where_the_op_takes_a_tensor_is_named(tmp_path):
    write(tmp_path / "k", "ops.py", OPS)
    kernel_file(tmp_path / "k")
    p = pattern_file(
        tmp_path / "p",
        "%x, %w, %s:attribute",
        extra='%s = pdl.attribute = "relu"',
    )
    problems, _ = check_paths([tmp_path / "p"], kernels=[str(tmp_path / "k")])
    assert any(
        m.startswith(f"{p}:12:5: pattern 'p' calls op 'lr' (")
        and m.endswith("wrongly: b is a Tensor?, the pattern passes a constant str")
        for m in problems
    ), problems


def test_unit_for_an_optional_tensor_is_a_valid_call(tmp_path):
    write(tmp_path / "k", "ops.py", OPS)
    kernel_file(tmp_path / "k")
    pattern_file(
        tmp_path / "p",
        "%x, %w, %none:attribute",
        extra="%none = pdl.attribute = unit",
    )
    assert check_paths([tmp_path / "p"], kernels=[str(tmp_path / "k")])[0] == []


def test_gen_pattern_refuses_a_call_that_does_not_fit_the_declared_op(tmp_path, monkeypatch):
    from pdlkit.matcher.gen_pattern import GenPatternError
    from pdlkit.matcher.gen_pattern_io import write_pattern

    write(tmp_path / "k", "ops.py", OPS)
    kernel_file(tmp_path / "k")
    fn = write(
        tmp_path,
        "ref.py",
        """
        import torch

        def two(x, w):
            return torch.relu(torch.nn.functional.linear(x, w))
        """,
    )
    monkeypatch.setenv("PDLKIT_KERNEL_PATH", str(tmp_path / "k"))
    with pytest.raises(GenPatternError, match=r"passes 2 arguments to op 'lr' \(.*ops.py:11\)"):
        write_pattern(f"{fn}:two", "3x4,5x4", op="lr", out=tmp_path / "o" / "two.pdl.mlir")
    assert not (tmp_path / "o").exists()


def test_dtype_codes_are_the_torch_dialects():
    from torch_mlir.extras.fx_importer import TORCH_DTYPE_TO_INT

    for dtype, code in TORCH_DTYPE_TO_INT.items():
        if dtype in (torch.float8_e8m0fnu, torch.float4_e2m1fn_x2):
            continue  # not in pdlkit's table: no kernel or pattern names them
        assert dtype_from_code(code) is dtype
    assert (mlir_name("int8"), mlir_name("torch.bfloat16"), torch_name("ui8")) == (
        "si8",
        "bf16",
        "uint8",
    )
    with pytest.raises(ValueError, match="99 is not a dtype code"):
        dtype_from_code(99)


def test_x86_and_aarch64_manifests_select_one_set_of_pt2e_patterns():
    patterns = {p.name: p for p in load_patterns([shipped_patterns()])}
    qlinear = patterns["qlinear_relu_q"]
    assert qlinear.file == shipped_patterns() / "pt2e" / "qlinear.pdl.mlir"
    assert set(qlinear.targets) == {"x86_64", "aarch64"}
    assert set(patterns["pt_qlinear_dyn"].targets) == {"x86_64", "aarch64"}
    assert not any(n.startswith(("a64_", "x86_pt_")) for n in patterns)


def test_a_user_manifest_selects_shipped_patterns_by_name(tmp_path):
    write(
        tmp_path / "p",
        "m.yaml",
        "version: 1\npatterns:\n  - file: '@shipped/pt2e/qlinear.pdl.mlir'\n    targets: [cpu]\n",
    )
    names = {p.name for p in load_patterns([tmp_path / "p"])}
    assert {"qlinear", "qlinear_relu_q"} <= names


def test_one_pattern_selected_with_different_settings_is_an_error(tmp_path):
    line = "  - file: '@shipped/pt2e/qlinear.pdl.mlir'\n"
    write(tmp_path / "p" / "a", "m.yaml", f"version: 1\npatterns:\n{line}    benefit: 9\n")
    write(tmp_path / "p" / "b", "m.yaml", f"version: 1\npatterns:\n{line}")
    with pytest.raises(PatternError, match="is selected by two manifests with different settings"):
        load_patterns([tmp_path / "p"])


def test_every_native_constraint_is_a_record_that_explains_itself():
    from pdlkit.matcher import natives

    assert all(
        isinstance(c, natives.Constraint) and c.name == name
        for name, c in natives.CONSTRAINTS.items()
    )
    unexplained = {n for n, c in natives.CONSTRAINTS.items() if c.explain is None}
    assert unexplained == {"not_dequantized"}  # the generic message says all there is
    why = natives.explain("is_none", [3], describe=str, names=["%b"])
    assert why == "%b = 3 is not None"


def test_a_kernels_own_reference_survives_binding_to_its_op(tmp_path):
    from pdlkit.runtime_abi.registry import load_kernel_file

    load_kernel_file(write(tmp_path / "k", "ops.py", OPS))  # the op is loaded: bound when declared
    write(
        tmp_path / "k",
        "own.py",
        """
        import torch
        import pdlkit

        def mine(x, w, b):
            return x

        @pdlkit.kernel(implements="lr", reference=mine)
        def lr_own(x, w, b):
            return x
        """,
    )
    k = KernelRegistry.from_folders([tmp_path / "k"]).get("lr_own")
    assert k is not None and k.reference is not None and k.reference.__name__ == "mine"


def test_a_function_whose_source_cannot_be_read_back_is_named_by_file_and_line(tmp_path):
    """inspect cannot read back code compiled from a file that is gone or changed (seen with
    corrupted kernel files in benchmarks/fuzz.py: the error named only the kernel); messages
    still name the file and line the code was compiled from."""
    from pdlkit.runtime_abi.ops import source_of

    ns: dict = {}
    exec(compile("\n\ndef k(x):\n    return x\n", str(tmp_path / "gone.py"), "exec"), ns)
    assert source_of(ns["k"]) == f"{tmp_path / 'gone.py'}:3"

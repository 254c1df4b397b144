"""Pattern files and manifests that are hostile or wrong: refused with one file:line error.

Manifests that reach outside their folder, nesting that would crash MLIR's parser, YAML alias
bombs, pattern names defined twice, and op names the Torch dialect does not register.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from conftest import linear_act_pattern, refused, write
from pdlkit.matcher import PatternError, load_patterns
from pdlkit.matcher.lint import lint_paths
from pdlkit.matcher.pdll import find_mlir_pdll

from pdlkit.backend import Options, load_plan
from pdlkit.check import check_paths
from pdlkit.errors import PdlkitError

needs_pdll = pytest.mark.skipif(
    find_mlir_pdll() is None, reason="needs mlir-pdll (apt-get install mlir-16-tools)"
)


def relu_pattern(op_name: str = '"torch.aten.relu"', call: str = '"lr"', name: str = "p") -> str:
    """One pattern on a single op; line 4 names the op, line 6 the logical op pdlkit_call gets."""
    return f"""
    pdl.pattern @{name} : benefit(1) {{
      %x = pdl.operand
      %t = pdl.type
      %act = pdl.operation {op_name}(%x : !pdl.value) -> (%t : !pdl.type)
      pdl.rewrite %act {{
        %op = pdl.attribute = {call}
        pdl.apply_native_rewrite "pdlkit_call"(%op, %x, %act : !pdl.attribute, !pdl.value, !pdl.operation)
      }}
    }}
    """


# -- manifests stay inside their folder ---------------------------------------------------------


@pytest.mark.parametrize("spelling", ["../outside/secret.pdl.mlir", "{outside}/secret.pdl.mlir"])
def test_manifest_entry_outside_its_folder_is_refused_unread(tmp_path, spelling):
    write(tmp_path / "outside", "secret.pdl.mlir", "TOPSECRET token\n")
    name = spelling.format(outside=tmp_path / "outside")
    m = write(tmp_path / "p", "m.yaml", f"version: 1\npatterns:\n  - file: {name}\n")
    with pytest.raises(PatternError) as e:
        load_patterns([tmp_path / "p"])
    assert str(e.value) == (
        f"{m}:3:1: pattern file {name!r} is outside the manifest's folder {tmp_path / 'p'}; "
        "a manifest lists only files in its folder or below, or in the pattern folder it is "
        "loaded from"
    )


def test_manifest_entry_symlinked_out_of_its_folder_is_refused(tmp_path):
    target = write(tmp_path / "outside", "a.pdl.mlir", linear_act_pattern("a", "relu", "x"))
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "a.pdl.mlir").symlink_to(target)
    m = write(tmp_path / "p", "m.yaml", "version: 1\npatterns:\n  - file: a.pdl.mlir\n")
    refused(
        tmp_path / "p",
        rf"^{m}:3:1: pattern file 'a.pdl.mlir' is outside the manifest's folder "
        rf"{tmp_path / 'p'} \(a symbolic link to {target}\)",
    )


def test_manifest_entry_in_a_subfolder_loads(tmp_path):
    write(tmp_path / "p" / "sub", "a.pdl.mlir", linear_act_pattern("a", "relu", "x"))
    write(tmp_path / "p", "m.yaml", "version: 1\npatterns:\n  - file: sub/a.pdl.mlir\n")
    assert [p.name for p in load_patterns([tmp_path / "p"])] == ["a"]


def test_manifest_entry_beside_its_folder_in_the_loaded_folder_loads(tmp_path):
    """A per-target manifest selecting target-neutral files beside its folder
    (``../neutral/...``) within the pattern folder given, as the shipped ones do."""
    write(tmp_path / "p" / "neutral", "a.pdl.mlir", linear_act_pattern("a", "relu", "x"))
    write(
        tmp_path / "p" / "x86", "m.yaml", "version: 1\npatterns:\n  - file: ../neutral/a.pdl.mlir\n"
    )
    assert [p.name for p in load_patterns([tmp_path / "p"])] == ["a"]
    refused(tmp_path / "p" / "x86", "is outside the manifest's folder")  # given alone


def test_a_copy_of_the_shipped_pattern_folder_loads_lints_and_checks_as_the_original(tmp_path):
    """An operator starting from the shipped patterns copies the folder: its manifests' entries
    (``../pt2e/...``) resolve inside the copy, and nothing of the installed folder is read."""
    from pdlkit.config import shipped_patterns

    copy = tmp_path / "patterns"
    shutil.copytree(shipped_patterns(), copy, ignore=shutil.ignore_patterns("__pycache__"))
    original, copied = load_patterns([shipped_patterns()]), load_patterns([copy])
    assert [p.name for p in copied] == [p.name for p in original]
    assert all(p.file.is_relative_to(copy) for p in copied)
    assert [f for f in lint_paths([copy]) if f.severity == "error"] == []
    problems, _ = check_paths([copy])
    assert problems == []


# -- nesting that would crash MLIR's parser -----------------------------------------------------

DEEP = 10_000


@pytest.mark.parametrize(
    "value",
    [
        "[" * DEEP + "]" * DEEP,
        "{a = " * DEEP + "1" + "}" * DEEP,
        "tuple<" * DEEP + "i32" + ">" * DEEP,
    ],
    ids=["array", "dictionary", "type"],
)
def test_deeply_nested_attribute_is_refused_naming_its_line(tmp_path, value):
    f = write(tmp_path, "deep.pdl.mlir", relu_pattern(call=value))
    refused(f, rf"^{f}:6:\d+: brackets nest deeper than 128 levels")


def test_deeply_nested_attribute_fails_compile_setup_with_the_error(tmp_path):
    f = write(tmp_path, "deep.pdl.mlir", relu_pattern(call="[" * DEEP + "]" * DEEP))
    with pytest.raises(PdlkitError, match=rf"^{f}:6:\d+: brackets nest deeper than 128 levels"):
        load_plan(Options(patterns=tmp_path))


def test_check_reports_deep_nesting_instead_of_crashing(tmp_path):
    f = write(tmp_path, "deep.pdl.mlir", relu_pattern(call="[" * DEEP + "]" * DEEP))
    r = subprocess.run(
        [sys.executable, "-m", "pdlkit.cli", "check", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 1, r.stderr
    assert f"{f}:6:" in r.stdout and "brackets nest deeper than 128 levels" in r.stdout


def test_chain_of_aliases_is_refused_before_mlir_parses_it(tmp_path):
    aliases = "#a0 = [1]\n" + "".join(f"#a{i} = [#a{i - 1}]\n" for i in range(1, 100_000))
    f = write(tmp_path, "deep.pdl.mlir", aliases + relu_pattern(call="#a99999").lstrip("\n"))
    refused(f, rf"^{f}:129:10: alias #a127 nests deeper than 128 levels once expanded")


def test_attribute_that_aliases_make_huge_is_refused_naming_its_line(tmp_path):
    # nine levels of nine-fold aliases: 387 million values when printed
    aliases = "".join(
        f"#a{i} = [{', '.join([f'#a{i - 1}' if i else '1'] * 9)}]\n" for i in range(9)
    )
    f = write(tmp_path, "big.pdl.mlir", aliases + relu_pattern(call="#a8").lstrip("\n"))
    refused(f, rf"^{f}:15:15: attribute 'value' holds more than 100,000 values once its aliases")


@needs_pdll
def test_deeply_nested_pdll_attribute_is_refused_naming_its_line(tmp_path):
    f = write(
        tmp_path,
        "deep.pdll",
        f"""
        Pattern p with benefit(1) {{
          let root = op<torch.aten.relu>(x: Value);
          has_rank(x, attr<"{"[" * DEEP + "]" * DEEP}">);
          rewrite root with {{ pdlkit_call(attr<"\\"lr\\"">, (x), root); }};
        }}
        """,
    )
    refused(f, rf"^{f}:3:\d+: brackets nest deeper than 128 levels")


# -- YAML that costs more than its size ---------------------------------------------------------


@pytest.mark.timeout(60)
def test_yaml_alias_bomb_is_refused(tmp_path):
    levels = "".join(
        f"l{i}: &l{i} [{', '.join([f'*l{i - 1}' if i else 'lol'] * 9)}]\n" for i in range(9)
    )
    m = write(tmp_path, "m.yaml", f"version: 1\n{levels}patterns: *l8\n")
    refused(m, rf"^{m}:\d+:\d+: aliases expand this manifest to more than 100,000")


def test_recursive_yaml_anchor_names_its_line(tmp_path):
    m = write(tmp_path, "m.yaml", "version: 1\npatterns:\n  - &e {file: a.pdl.mlir, x: *e}\n")
    refused(m, rf"^{m}:3:5: recursive alias: this value contains itself")


def test_deeply_nested_yaml_names_its_line(tmp_path):
    m = write(tmp_path, "m.yaml", "version: 1\npatterns: " + "[" * 50_000 + "]" * 50_000 + "\n")
    refused(m, rf"^{m}:2:\d+: invalid YAML: nested deeper than 32")


def test_yaml_merge_key_is_refused_naming_its_line(tmp_path):
    write(tmp_path, "a.pdl.mlir", linear_act_pattern("a", "relu", "x"))
    m = write(
        tmp_path,
        "m.yaml",
        "version: 1\nx: &x {targets: [x86_64]}\npatterns:\n  - {<<: *x, file: a.pdl.mlir}\n",
    )
    refused(m, rf"^{m}:4:6: merge keys \(<<\) are not supported")


# -- op names that are not strings --------------------------------------------------------------


@pytest.mark.parametrize("value", ["5", "[1]", "unit"])
def test_pdlkit_call_op_that_is_not_a_string_names_its_line(tmp_path, value):
    f = write(tmp_path, "a.pdl.mlir", relu_pattern(call=value))
    refused(
        f, rf"^{f}:6:11: pdlkit_call's first argument names the logical op and must be a string"
    )


def test_unquoted_op_name_names_its_line(tmp_path):
    f = write(tmp_path, "a.pdl.mlir", relu_pattern(op_name="5"))
    refused(f, rf"^{f}:4:23: expected operation name in quotes")


# -- one pattern name, one definition -----------------------------------------------------------


def test_same_name_in_two_files_of_a_folder_names_both(tmp_path):
    a = write(tmp_path, "a.pdl.mlir", linear_act_pattern("lr", "relu", "x"))
    b = write(tmp_path, "b.pdl.mlir", linear_act_pattern("lr", "relu", "x"))
    with pytest.raises(PatternError) as e:
        load_patterns([tmp_path])
    assert str(e.value).startswith(
        f"{b}:1:1: pattern name 'lr' is defined twice: here and at {a}:1:1;"
    )


def test_same_name_in_two_folders_names_both(tmp_path):
    a = write(tmp_path / "one", "a.pdl.mlir", linear_act_pattern("lr", "relu", "x"))
    b = write(tmp_path / "two", "b.pdl.mlir", linear_act_pattern("lr", "gelu", "y"))
    with pytest.raises(
        PatternError, match=rf"^{b}:1:1: pattern name 'lr' is defined twice: here and at {a}:1:1"
    ):
        load_patterns([tmp_path / "one", tmp_path / "two"])


def test_check_reports_a_name_defined_in_two_files(tmp_path):
    a = write(tmp_path, "a.pdl.mlir", linear_act_pattern("lr", "relu", "linear_relu"))
    b = write(tmp_path, "b.pdl.mlir", linear_act_pattern("lr", "gelu", "linear_gelu"))
    problems, _ = check_paths([tmp_path])
    assert [p for p in problems if "defined twice" in p] == [
        f"{b}:1:1: pattern name 'lr' is defined twice: here and at {a}:1:1; names must be "
        "unique across all loaded pattern files and folders: rename one"
    ]


def test_lint_reports_a_name_defined_in_two_files(tmp_path):
    a = write(tmp_path, "a.pdl.mlir", linear_act_pattern("lr", "relu", "linear_relu"))
    b = write(tmp_path, "b.pdl.mlir", linear_act_pattern("lr", "gelu", "linear_gelu"))
    got = [str(f) for f in lint_paths([tmp_path]) if f.check == "duplicate-name"]
    assert got == [
        f"{b}:1: error: pattern name 'lr' is defined twice: here and at {a}:1:1; names must be "
        "unique across all loaded pattern files and folders: rename one [duplicate-name]"
    ]


# -- op names the Torch dialect registers -------------------------------------------------------


@pytest.mark.parametrize(
    ("written", "suggested"),
    [
        ("torch.aten.sigmod", "'torch.aten.sigmoid'"),
        ("aten.relu", "'torch.aten.relu'"),
        ("torch.aten.gelu.Tensor", "'torch.aten.gelu'"),
    ],
)
def test_misspelled_op_name_suggests_the_closest(tmp_path, written, suggested):
    f = write(tmp_path, "a.pdl.mlir", relu_pattern(op_name=f'"{written}"'))
    refused(
        f,
        rf"^{f}:4:10: unknown op '{written}': the Torch dialect registers no such "
        rf"operation; did you mean {suggested}",
    )


def test_unknown_op_name_with_no_close_name_says_so(tmp_path):
    f = write(tmp_path, "a.pdl.mlir", relu_pattern(op_name='"torch.aten.frobnicate"'))
    refused(
        f,
        rf"^{f}:4:10: unknown op 'torch.aten.frobnicate': the Torch dialect registers no "
        r"such operation \(and none is close\)",
    )


def test_scalar_op_where_a_tensor_overload_exists_suggests_it(tmp_path):
    f = write(tmp_path, "a.pdl.mlir", relu_pattern(op_name='"torch.aten.mul"'))
    with pytest.raises(PatternError) as e:
        load_patterns([f])
    assert str(e.value) == (
        f"{f}:4:10: op 'torch.aten.mul' is aten::mul(Scalar a, Scalar b) -> Scalar, which works "
        "on Python numbers, not tensors; did you mean 'torch.aten.mul.Tensor'?"
    )


def test_pytorch_op_the_dialect_lacks_points_to_torch_operator(tmp_path):
    f = write(tmp_path, "a.pdl.mlir", relu_pattern(op_name='"torch.aten._weight_int8pack_mm"'))
    refused(
        f,
        rf"^{f}:4:10: unknown op 'torch.aten._weight_int8pack_mm': .*; PyTorch's "
        r'aten._weight_int8pack_mm imports as the generic op: pdl.operation "torch.operator"',
    )


@needs_pdll
def test_misspelled_op_in_pdll_names_the_pdll_line(tmp_path):
    f = write(
        tmp_path,
        "a.pdll",
        """
        Pattern p with benefit(1) {
          let root = op<torch.aten.sigmod>(x: Value);
          rewrite root with { pdlkit_call(attr<"\\"lr\\"">, (x), root); };
        }
        """,
    )
    refused(f, rf"^{f}:2:14: unknown op 'torch.aten.sigmod'")


def test_check_reports_a_misspelled_op(tmp_path):
    f = write(tmp_path, "a.pdl.mlir", relu_pattern(op_name='"torch.aten.sigmod"'))
    problems, _ = check_paths([tmp_path])
    assert [p for p in problems if "unknown op" in p] == [
        f"{f}:4:10: unknown op 'torch.aten.sigmod': the Torch dialect registers no such "
        "operation; did you mean 'torch.aten.sigmoid' or 'torch.aten.sigmoid_' or "
        "'torch.aten.log_sigmoid'?"
    ]


def test_lint_reports_a_misspelled_op(tmp_path):
    f = write(tmp_path, "a.pdl.mlir", relu_pattern(op_name='"torch.aten.sigmod"'))
    assert [str(x) for x in lint_paths([tmp_path]) if "unknown op" in x.message] == [
        f"{f}:4: error: unknown op 'torch.aten.sigmod': the Torch dialect registers no such "
        "operation; did you mean 'torch.aten.sigmoid' or 'torch.aten.sigmoid_' or "
        "'torch.aten.log_sigmoid'? [load]"
    ]

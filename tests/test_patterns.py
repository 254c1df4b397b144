"""Pattern files and manifests: loading, settings, and errors that name file:line:col."""

from __future__ import annotations

import pytest
from conftest import linear_act_pattern, refused, write
from pdlkit.matcher import load_patterns

import pdlkit
from pdlkit.backend import Options, load_plan


def test_malformed_pdl_names_file_line_col(tmp_path):
    f = write(tmp_path, "x.pdl.mlir", "pdl.pattern @p : benefit(1) {\n  %a = pdl.operandd\n}\n")
    refused(tmp_path, rf"^{f}:2:8: .*pdl.operandd")


def test_non_pattern_top_level_op_is_refused(tmp_path):
    f = write(tmp_path, "x.pdl.mlir", "func.func @f() {\n  return\n}\n")
    refused(f, rf"^{f}:1:1: expected pdl.pattern at top level, found func.func")


def test_manifest_settings_apply(tmp_path):
    write(
        tmp_path,
        "a.pdl.mlir",
        linear_act_pattern("a", "relu", "x") + linear_act_pattern("b", "gelu", "y"),
    )
    write(
        tmp_path,
        "m.yaml",
        """
    version: 1
    patterns:
      - file: a.pdl.mlir
        targets: [aarch64]
      - file: a.pdl.mlir
        pattern: b
        benefit: 7
        enabled: false
    """,
    )
    ps = load_patterns([tmp_path])
    a, b = ps.patterns
    assert (a.name, a.benefit, a.targets, a.enabled) == ("a", 1, ("aarch64",), True)
    assert (b.name, b.benefit, b.targets, b.enabled) == ("b", 7, ("aarch64",), False)
    assert [p.name for p in ps.ordered()] == ["b", "a"]


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        (
            "version: 2\npatterns: [{file: a.pdl.mlir}]\n",
            r":1:1: manifest version 2 is not supported",
        ),
        (
            "version: 1\npatterns:\n  - file: missing.pdl.mlir\n",
            r":3:1: pattern file 'missing.pdl.mlir' does not exist",
        ),
        (
            "version: 1\npatterns:\n  - file: a.pdl.mlir\n    benfit: 3\n",
            r":3:1: unknown key\(s\) \['benfit'\]",
        ),
        (
            "version: 1\npatterns:\n  - file: a.pdl.mlir\n    pattern: zz\n",
            r":3:1: a.pdl.mlir has no pattern named 'zz'",
        ),
        (
            "version: 1\npatterns:\n  - file: a.pdl.mlir\n    benefit: high\n",
            r":3:1: 'benefit' must be int",
        ),
        ("version: 1\npatterns: [\n", r":\d+:\d+: invalid YAML"),
    ],
)
def test_bad_manifest_names_manifest_line(tmp_path, manifest, message):
    write(tmp_path, "a.pdl.mlir", linear_act_pattern("a", "relu", "x"))
    m = write(tmp_path, "m.yaml", manifest)
    refused(tmp_path, f"^{m}{message}")


def test_manifest_pinning_an_unknown_kernel_is_refused(tmp_path):
    write(tmp_path, "a.pdl.mlir", linear_act_pattern("a", "relu", "linear_relu"))
    m = write(tmp_path, "m.yaml", "version: 1\npatterns:\n  - file: a.pdl.mlir\n    kernel: nope\n")
    with pytest.raises(
        pdlkit.PdlkitError,
        match=rf"^{m}:3: pattern 'a' pins kernel 'nope', which no kernel folder declares",
    ):
        load_plan(Options(patterns=tmp_path))


def test_pdll_without_compiler_gives_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PDLKIT_MLIR_PDLL", "")  # no mlir-pdll
    f = write(tmp_path, "x.pdll", "Pattern { }\n")
    refused(
        f, rf"{f}:1:1: loading a .pdll pattern needs mlir-pdll: .*apt-get install mlir-16-tools"
    )


def test_unknown_native_is_refused_at_load_naming_its_line(tmp_path):
    text = linear_act_pattern(
        "a", "relu", "x", extra='pdl.apply_native_constraint "has_dtpye"(%x : !pdl.value)'
    )
    f = write(tmp_path, "a.pdl.mlir", text)
    refused(f, rf"^{f}:9:3: unknown native constraint 'has_dtpye'; known: ")

"""PDLL pattern files: compiled with mlir-pdll at load time, natives declared for them."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch
from conftest import write
from pdlkit.matcher import PatternError, load_patterns
from pdlkit.matcher.pdll import ENV, find_mlir_pdll

import pdlkit

ROOT = Path(__file__).resolve().parents[1]
needs_pdll = pytest.mark.skipif(
    find_mlir_pdll() is None, reason="needs mlir-pdll (apt-get install mlir-16-tools)"
)

LINEAR_RELU = """
// linear -> relu, in PDLL
Pattern linear_relu with benefit(2) {
  let lin = op<torch.aten.linear>(x: Value, w: Value, b: Value);
  let root = op<torch.aten.relu>(lin);
  is_float_tensor(x);
  single_use(lin);
  rewrite root with {
    pdlkit_call(attr<"\\"linear_relu\\"">, (x, w, b), root);
  };
}
"""


@needs_pdll
def test_pdll_pattern_loads_with_its_own_file_and_line(tmp_path):
    f = write(tmp_path, "lr.pdll", LINEAR_RELU)
    (p,) = load_patterns([tmp_path]).patterns
    assert (p.name, p.file, p.line, p.benefit, p.root, p.calls) == (
        "linear_relu",
        f,
        2,
        2,
        "torch.aten.relu",
        ("linear_relu",),
    )


@needs_pdll
def test_pdll_pattern_substitutes_in_a_compiled_model(tmp_path, mlp):
    model, x = mlp
    f = write(tmp_path, "lr.pdll", LINEAR_RELU)
    report = pdlkit.explain(model, x, patterns=[f])
    assert report.counts() == {"linear_relu": 1}
    (sub,) = report.substitutions
    assert (sub.op, sub.replaced) == ("linear_relu", ["relu", "linear"])
    with torch.no_grad():
        got = pdlkit.optimize(model, patterns=[f], default_codegen="eager")(x)
        torch.testing.assert_close(got, model(x))


@needs_pdll
def test_pdll_error_names_the_pdll_file_and_line(tmp_path):
    f = write(tmp_path, "bad.pdll", LINEAR_RELU.replace("single_use(lin)", "single_uze(lin)"))
    with pytest.raises(
        PatternError, match=rf"^{f}:6:3: error: undefined reference to `single_uze`"
    ):
        load_patterns([f])


@needs_pdll
def test_pdll_constants_must_be_an_array(tmp_path):
    text = LINEAR_RELU.replace(
        'pdlkit_call(attr<"\\"linear_relu\\"">, (x, w, b), root)',
        'pdlkit_call_attrs(attr<"\\"linear_relu\\"">, (x, w, b), attr<"\\"none\\"">, root)',
    )
    f = write(tmp_path, "c.pdll", text)
    with pytest.raises(PatternError, match=rf"^{f}:8:5: pdlkit_call_attrs takes its constants"):
        load_patterns([f])


def test_without_mlir_pdll_one_error_names_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, "")
    f = write(tmp_path, "lr.pdll", LINEAR_RELU)
    with pytest.raises(PatternError) as e:
        load_patterns([tmp_path])
    msg = str(e.value)
    assert msg.startswith(f"{f}:1:1: loading a .pdll pattern needs mlir-pdll")
    assert "apt-get install mlir-16-tools" in msg and ENV in msg
    assert len(msg.splitlines()) == 1


def _without_sites(code: str) -> str:
    return re.sub(r"(torch\.ops\.pdlkit\.\w+\.default\(.*?), \d+\)", r"\1, SITE)", code)


# -- the shipped int8 linear pattern in both forms ----------------------------------------------

_OTHERS = ["qlinear_relu_q", "qlinear_relu", "qlinear_gelu_q", "qlinear_gelu", "qlinear_q"]


@needs_pdll
def test_shipped_qlinear_pdll_and_pdl_substitute_the_same_nodes(tmp_path):
    pytest.importorskip(
        "torchao.quantization.pt2e", reason="needs torchao (pip install -e '.[quant]')"
    )
    from test_x86_int8 import Net, quantize_static  # skips without avx512_vnni

    # the .pdl.mlir file's @qlinear alone (a manifest lists files of its own folder), next to
    # the .pdll form of it
    (tmp_path / "pdl").mkdir()
    shutil.copy(ROOT / "patterns" / "pt2e" / "qlinear.pdl.mlir", tmp_path / "pdl")
    entries = "".join(
        f"  - file: qlinear.pdl.mlir\n    pattern: {n}\n    enabled: false\n" for n in _OTHERS
    )
    manifest = write(tmp_path / "pdl", "only_qlinear.yaml", "version: 1\npatterns:\n" + entries)
    pdll = ROOT / "patterns" / "x86" / "qlinear.pdll"

    torch.manual_seed(0)
    x = torch.randn(4, 16)
    q = quantize_static(Net(16, 32, "relu").eval(), x)
    reports = {}
    for form, path in (("pdl", manifest), ("pdll", pdll)):
        reports[form] = pdlkit.explain(q, x, patterns=[path])
    a, b = reports["pdl"], reports["pdll"]
    assert a.counts() == b.counts() == {"qlinear": 2}
    key = [(s.pattern, s.kernel, s.root, s.replaced, s.args) for s in a.substitutions]
    assert key == [(s.pattern, s.kernel, s.root, s.replaced, s.args) for s in b.substitutions]
    after = [_without_sites(r.graphs[0].graph_after) for r in (a, b)]
    assert after[0] == after[1]
    kernel = b.substitutions[0].kernel  # qlinear_vnni on an x86 host with VNNI, else oneDNN's
    assert after[1].count(f"torch.ops.pdlkit.{kernel}.default(") == 2
    with torch.no_grad():
        ref = q(x)
        for path in (manifest, pdll):
            torch.testing.assert_close(
                pdlkit.optimize(q, patterns=[path])(x), ref, rtol=1e-4, atol=1e-4
            )


@needs_pdll
def test_every_native_constraint_is_declared_for_pdll(tmp_path):
    import inspect

    from pdlkit.matcher.natives import CONSTRAINTS

    calls = []
    for name, fn in CONSTRAINTS.items():
        args = [
            "x" if "Value" in str(p.annotation) else 'attr<"1 : i64">'
            for p in inspect.signature(fn).parameters.values()
        ]
        calls.append(f"  {name}({', '.join(args)});")
    body = "\n".join(calls)
    text = (
        "Pattern every_native with benefit(1) {\n"
        "  let root = op<torch.aten.relu>(x: Value);\n"
        f"{body}\n"
        '  rewrite root with { pdlkit_call(attr<"\\"lr\\"">, (x), root); };\n'
        "}\n"
    )
    f = tmp_path / "all.pdll"
    f.write_text(text)
    (p,) = load_patterns([f]).patterns
    assert p.name == "every_native" and p.calls == ("lr",)


def test_check_without_mlir_pdll_notes_the_pdll_it_could_not_compile(monkeypatch, capsys):
    from pdlkit.cli import main

    monkeypatch.setenv(ENV, "")
    assert main(["check", str(ROOT / "patterns")]) == 0
    out = capsys.readouterr().out
    assert f"{ROOT / 'patterns' / 'x86' / 'qlinear.pdll'}: not checked: install mlir-pdll" in out

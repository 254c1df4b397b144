"""A new user's first hour (issue 25): authoring that matches, and what a person reads.

Each test is one thing a user does, asserting what the user sees."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import KERNEL_HEADER, MLP, linear_act_pattern, make_folders, sigmoid_kernel, write
from pdlkit.matcher import pattern_from_function

import pdlkit
from pdlkit.cli import main, parser

ROOT = Path(__file__).resolve().parents[1]
F = torch.nn.functional


# -- item 1: a generated pattern substitutes on its own function, as a model writes it ----------


def mm_relu(a, b):
    return torch.relu(torch.mm(a, b))


def conv1d_gpt2(x, w, b):  # GPT-2's Conv1D: the weight is [in, out]
    return torch.addmm(b, x, w)


def matmul_3d_gelu(x, w):
    return F.gelu(torch.matmul(x, w))


def silu(x):
    return x * torch.sigmoid(x)


class Wrap(torch.nn.Module):
    """The reference function inside a model: its tensor parameters after the first are
    the model's parameters (weights), as in a real network."""

    def __init__(self, fn, *weights):
        super().__init__()
        self.fn = fn
        self.w = torch.nn.ParameterList([torch.nn.Parameter(w) for w in weights])

    def forward(self, x):
        return torch.tanh(self.fn(torch.tanh(x), *self.w))


KERNEL = """
@pdlkit.kernel(op="gen_op", meta=lambda {params}: {meta})
def gen_kernel({typed}) -> Tensor:
    raise pdlkit.KernelUnsupported("explain only")
"""

CASES = {
    "mm_relu": (mm_relu, (torch.randn(4, 8), torch.randn(8, 6)), "a.new_empty(a.shape[0], b.shape[1])"),
    "conv1d_gpt2": (
        conv1d_gpt2,
        (torch.randn(4, 8), torch.randn(8, 6), torch.randn(6)),
        "x.new_empty(x.shape[0], w.shape[1])",
    ),
    "matmul_3d_gelu": (
        matmul_3d_gelu,
        (torch.randn(2, 4, 8), torch.randn(8, 6)),
        "x.new_empty(*x.shape[:-1], w.shape[1])",
    ),
    "silu": (silu, (torch.randn(4, 8),), "x.new_empty(x.shape)"),
}  # fmt: skip


def _folders(tmp_path, text: str, fn) -> dict:
    import inspect

    params = list(inspect.signature(fn).parameters)
    meta = CASES[fn.__name__][2]
    typed = ", ".join(f"{p}: Tensor" for p in params)
    write(tmp_path / "p", "gen.pdl.mlir", text)
    write(
        tmp_path / "k",
        "k.py",
        KERNEL_HEADER + KERNEL.format(params=", ".join(params), meta=meta, typed=typed),
    )
    return {"patterns": tmp_path / "p", "kernels": tmp_path / "k", "autotune": "off"}


@pytest.mark.parametrize("name", list(CASES))
def test_generated_pattern_substitutes_in_a_model_written_like_its_function(tmp_path, name):
    fn, examples, _ = CASES[name]
    text = pattern_from_function(fn, examples, op="gen_op")
    model = Wrap(fn, *examples[1:]).eval()
    report = pdlkit.explain(model, examples[0], **_folders(tmp_path, text, fn))
    assert report.counts() == {name: 1}


def test_mm_with_a_weight_is_generated_as_the_linear_the_pass_matches():
    text = pattern_from_function(mm_relu, CASES["mm_relu"][1], op="gen_op")
    assert '"torch.aten.linear"' in text and '"torch.aten.mm"' not in text
    assert "// Written in the canonical form the pass matches (mm x1" in text


def test_commutative_option_matches_the_other_operand_order(tmp_path):
    def silu_other_way(x):
        return torch.sigmoid(x) * x

    text = pattern_from_function(silu, CASES["silu"][1], op="gen_op", commutative=True)
    assert "pdl.pattern @silu_swapped_1" in text
    kw = _folders(tmp_path, text, silu)
    report = pdlkit.explain(Wrap(silu_other_way).eval(), torch.randn(4, 8), **kw)
    assert report.counts() == {"silu_swapped_1": 1}


def test_without_commutative_the_other_operand_order_is_not_matched(tmp_path):
    def silu_other_way(x):
        return torch.sigmoid(x) * x

    text = pattern_from_function(silu, CASES["silu"][1], op="gen_op")
    report = pdlkit.explain(
        Wrap(silu_other_way).eval(), torch.randn(4, 8), **_folders(tmp_path, text, silu)
    )
    assert report.counts() == {}


# -- item 2: an op name without its overload is refused, naming the valid one -------------------


def test_op_name_without_overload_is_refused_with_the_closest_name(tmp_path):
    text = linear_act_pattern("lr", "relu", "lin_relu").replace(
        '"torch.aten.relu"', '"torch.aten.mul"'
    )
    path = write(tmp_path / "p", "lr.pdl.mlir", text)
    with pytest.raises(pdlkit.PdlkitError, match=rf"{path}:\d+:\d+: .*'torch\.aten\.mul\.Tensor'"):
        pdlkit.optimize(MLP().eval(), patterns=tmp_path / "p")


# -- item 3: explain and bisect report on what optimize built ----------------------------------


@pytest.fixture
def mine(tmp_path):
    p, k = make_folders(tmp_path, sigmoid_kernel("k_mine"))
    return {"patterns": p, "kernels": k, "verify": "first_call", "default_codegen": "inductor"}


def test_explain_of_the_optimized_model_uses_its_options(mine, mlp):
    model, x = mlp
    fast = pdlkit.optimize(model, **mine)
    assert [s.kernel for s in pdlkit.explain(fast, x).substitutions] == ["k_mine"]


def test_explain_takes_the_same_keywords_as_optimize(mine, mlp):
    model, x = mlp
    assert [s.kernel for s in pdlkit.explain(model, x, **mine).substitutions] == ["k_mine"]


def test_bisect_of_the_optimized_model_uses_its_options(mine, mlp):
    model, x = mlp
    result = pdlkit.bisect(pdlkit.optimize(model, **mine), x)
    assert [s.split(" at ")[0] for s in result.sites] == ["k_mine"]


# -- item 4: folders as one PATH-style string -------------------------------------------------


def test_patterns_as_a_path_string_with_shipped(mine, mlp):
    model, x = mlp
    joined = f"{mine['patterns']}{os.pathsep}@shipped"
    report = pdlkit.explain(
        model, x, patterns=joined, kernels=f"{mine['kernels']}{os.pathsep}@shipped"
    )
    assert report.counts() == {"linear_relu": 1, "lin_sigmoid": 1}


def test_cli_help_says_patterns_repeat(capsys):
    with pytest.raises(SystemExit):
        main(["explain", "--help"])
    out = " ".join(capsys.readouterr().out.split())  # help text is wrapped to the terminal
    assert "--patterns FOLDER pattern folder or file; repeat it, or join several with ':'" in out


# -- items 10, 12, 13, 15: what the command line shows -------------------------------------------


def _example_file(folder: Path, name: str = "mymodels.py") -> Path:
    return write(
        folder,
        name,
        """
        import torch

        def example():
            torch.manual_seed(0)
            model = torch.nn.Sequential(
                torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16), torch.nn.ReLU()
            ).eval()
            return model, (torch.randn(4, 16),)
        """,
    )


def test_explain_is_short_by_default_and_long_with_verbose(tmp_path, monkeypatch, capsys):
    _example_file(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert main(["explain", "mymodels:example", "--autotune", "off"]) == 0
    short = capsys.readouterr().out.splitlines()
    assert main(["explain", "mymodels:example", "--autotune", "off", "--verbose"]) == 0
    long = capsys.readouterr().out.splitlines()
    assert len(short) <= 10, short
    subs = [line for line in short if " -> " in line]
    assert [line.split()[0] for line in subs] == ["linear_gelu", "linear_relu"]
    assert any(line.startswith("patterns loaded (") for line in long)
    assert not any(line.startswith("patterns loaded (") for line in short)


def test_why_of_a_pattern_that_matched_says_it_matched(mlp):
    model, x = mlp
    text = str(pdlkit.explain(model, x, why="linear_relu"))
    assert "--why linear_relu: matched at 1 root(s)" in text
    assert "why linear_relu did not match" not in text


def test_verbose_report_names_no_bare_torch_operator(mlp):
    model, x = mlp
    text = pdlkit.explain(model, x).format(verbose=True)
    assert "qlinear_dyn_relu: an op outside the Torch dialect that it matches" in text
    assert "op torch.operator does not occur" not in text


def test_no_substitution_without_near_misses_does_not_point_at_them():
    text = str(pdlkit.explain(torch.nn.Sequential(torch.nn.Tanh()), torch.randn(2, 8)))
    assert "NO SUBSTITUTION" in text and "near misses above" not in text


def test_help_lists_every_command_with_help_for_every_option(capsys):
    top = parser()
    commands = top._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    readme = (ROOT / "README.md").read_text()
    for name, sub in commands.items():
        assert f"pdlkit {name}" in readme, name
        for action in sub._actions:
            assert action.help, f"pdlkit {name} {action.dest} has no help text"
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "``" not in out and all(name in out for name in commands)


def test_module_target_is_found_in_the_current_directory(tmp_path, monkeypatch, capsys):
    _example_file(tmp_path, "mymodels_cwd.py")
    monkeypatch.chdir(tmp_path)
    assert main(["explain", "mymodels_cwd:example", "--autotune", "off"]) == 0
    assert "linear_relu -> " in capsys.readouterr().out


def test_missing_module_target_is_one_clear_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        SystemExit,
        match=r"^pdlkit: cannot import 'nosuchmod': no module 'nosuchmod' in the current directory",
    ):
        main(["explain", "nosuchmod:example"])


def test_gen_pattern_creates_the_output_folder(tmp_path):
    src = write(
        tmp_path, "refs.py", "import torch\n\ndef relu_mm(a, b):\n    return torch.relu(a @ b)\n"
    )
    out = tmp_path / "new" / "dir" / "x.pdl.mlir"
    args = [
        "gen-pattern",
        f"{src}:relu_mm",
        "--example-shapes",
        "4x8,8x6",
        "--op",
        "x",
        "-o",
        str(out),
    ]
    assert main(args) == 0
    assert out.is_file() and (out.parent / "x.reference.py").is_file()


# -- items 11, 14: a fresh process --------------------------------------------------------------


def _run(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_LOGS")}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, timeout=300, cwd=cwd, env=env,
    )  # fmt: skip


def test_torch_compile_finds_the_backend_without_importing_pdlkit(tmp_path):
    r = _run(
        """
        import sys, torch
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
        with torch.no_grad():
            torch.compile(model, backend="pdlkit")(torch.randn(2, 8))
        from pdlkit import stats
        print(sorted(stats()["by_kernel"]))
        """,
        tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert "linear_relu" in r.stdout


def test_cli_does_not_print_torchao_import_messages(tmp_path):
    pytest.importorskip("torchao", reason="the messages come from torchao")
    write(
        tmp_path,
        "withao.py",
        """
        import torch
        import torchao  # its load-time messages must not reach the command's output

        def example():
            return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval(), (torch.randn(2, 8),)
        """,
    )
    r = _run(
        "from pdlkit.cli import main; main(['explain', 'withao:example', '--autotune', 'off'])",
        tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert "linear_relu -> " in r.stdout
    for noise in ("Failed to load", "_C_cutlass", "_C_mxfp8", "register_constant"):
        assert noise not in r.stdout + r.stderr

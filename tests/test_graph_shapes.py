"""Graphs of shapes users write that the matcher must survive: matches with several roots in
any order, and functions with torch.no_grad() / torch.autocast(...) regions."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import KERNEL_HEADER, RELU_ADD, make_folders, op_pattern, pdl_pattern, write

import pdlkit

# -- matches with several roots -----------------------------------------------------------------
# Each runs in a fresh interpreter: a regression that crashes the process fails the test.

HARNESS = """
import textwrap
from pathlib import Path

import torch
from pdlkit.matcher import load_patterns
from pdlkit.matcher.substitute import substitute
from pdlkit.runtime_abi.capability import host
from pdlkit.runtime_abi.registry import KernelRegistry
from torch.fx.experimental.proxy_tensor import make_fx

HEADER = "import torch\\nfrom torch import Tensor\\nimport pdlkit\\n"


def substitute_with(name, pattern, kernel, fn, args):
    folder = Path(name)
    (folder / "p").mkdir(parents=True)
    (folder / "k").mkdir()
    (folder / "p" / "a.pdl.mlir").write_text(textwrap.dedent(pattern))
    (folder / "k" / "k.py").write_text(HEADER + textwrap.dedent(kernel))
    gm = make_fx(fn, pre_dispatch=True, tracing_mode="fake")(*args)
    registry = KernelRegistry.from_folders([folder / "k"])
    out = substitute(gm, load_patterns([folder / "p"]), registry, host())
    out.graph.graph.lint()
    for got, want in zip(out.graph(*args), fn(*args), strict=True):
        torch.testing.assert_close(got, want)
    return out
"""


def run_isolated(tmp_path, *parts: str) -> str:
    """Run ``parts`` after :data:`HARNESS` in a new Python process; its stdout."""
    script = tmp_path / "case.py"
    script.write_text(HARNESS + "".join(textwrap.dedent(part) for part in parts))
    env = {**os.environ, "PDLKIT_AUTOTUNE": "off"}
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"exit status {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


TWO_ROOTS = '''
def pattern(root, listed):
    ops = {"tanh": "%t", "exp": "%e"}
    names = ", ".join(ops[n] for n in listed)
    return f"""
    pdl.pattern @tanh_exp : benefit(1) {{
      %x = pdl.operand
      %ty = pdl.type
      %t = pdl.operation "torch.aten.tanh"(%x : !pdl.value) -> (%ty : !pdl.type)
      %e = pdl.operation "torch.aten.exp"(%x : !pdl.value) -> (%ty : !pdl.type)
      pdl.rewrite {ops[root]} {{
        %op = pdl.attribute = "tanh_exp"
        pdl.apply_native_rewrite "pdlkit_call"(%op, %x, {names} : !pdl.attribute, !pdl.value, !pdl.operation, !pdl.operation)
      }}
    }}
    """


def kernel(listed):
    outs = ", ".join(f"torch.{n}(x)" for n in listed)
    return f"""
    @pdlkit.kernel(op="tanh_exp", meta=lambda x: (torch.empty_like(x), torch.empty_like(x)))
    def k_tanh_exp(x: Tensor) -> tuple[Tensor, Tensor]:
        return {outs}
    """


def tanh_first(x):
    t = torch.tanh(x)
    u = t * 2  # reads the first root before the second one is computed
    e = torch.exp(x)
    return (t * e + u,)


def exp_first(x):
    e = torch.exp(x)
    u = e * 2
    t = torch.tanh(x)
    return (t * e + u,)
'''


def test_two_root_kernel_replaces_both_roots_whichever_is_root_and_first(tmp_path):
    out = run_isolated(
        tmp_path,
        TWO_ROOTS,
        """
        x = torch.randn(4, 4)
        for root in ("tanh", "exp"):
            for fn in (tanh_first, exp_first):
                for listed in (("tanh", "exp"), ("exp", "tanh")):
                    name = f"{root}_{fn.__name__}_{listed[0]}"
                    o = substitute_with(name, pattern(root, listed), kernel(listed), fn, (x,))
                    code = o.graph.code
                    assert "pdlkit.k_tanh_exp" in code and "aten.tanh" not in code, code
                    assert "aten.exp" not in code, code
                    print("replaced", name)
        """,
    )
    assert out.count("replaced") == 8


RELU_ADD_CASE = f'''
PATTERN = """{pdl_pattern("relu_add", RELU_ADD, "%a", "relu_add", "%x, %y, %r:operation", at="%r")}"""
KERNEL = """
@pdlkit.kernel(op="relu_add", meta=lambda x, y: (torch.empty_like(x), torch.empty_like(x)))
def k_relu_add(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    r = torch.relu(x)
    return r, r + y
"""
args = (torch.randn(4, 4), torch.randn(4, 4))


def late(x, z):
    r = torch.relu(x)
    y = torch.sin(z)  # the kernel's second argument, computed after the first root
    return r + y, r * 3


def tangled(x, z):
    r = torch.relu(x)
    u = r * 3  # reads the first root before the kernel's argument y exists
    y = torch.sin(z)
    return r + y, u
'''


def test_kernel_call_follows_an_argument_computed_between_its_roots(tmp_path):
    script = 'print(substitute_with("late", PATTERN, KERNEL, late, args).graph.code)\n'
    out = run_isolated(tmp_path, RELU_ADD_CASE, script)
    lines = [ln.strip() for ln in out.splitlines()]
    sin = next(i for i, ln in enumerate(lines) if "aten.sin" in ln)
    call = next(i for i, ln in enumerate(lines) if "pdlkit.k_relu_add" in ln)
    assert sin < call
    assert not any("aten.relu" in ln or "aten.add" in ln for ln in lines)


def test_kernel_call_that_would_need_ops_reordered_is_a_near_miss(tmp_path):
    out = run_isolated(
        tmp_path,
        RELU_ADD_CASE,
        """
        o = substitute_with("tangled", PATTERN, KERNEL, tangled, args)
        print(len(o.report.substitutions))
        print(o.report.near_misses[0].reason)
        """,
    )
    count, reason = out.strip().splitlines()
    assert count == "0"
    assert reason == (
        "mul reads relu before argument sin is computed: "
        "the kernel call has no place without reordering ops"
    )


def test_sibling_roots_pair_up_with_those_not_yet_replaced(tmp_path):
    # two tanh(x) and two exp(x): the second tanh must pair with the exp still there
    out = run_isolated(
        tmp_path,
        TWO_ROOTS,
        """
        def twice(x):
            return torch.tanh(x), torch.exp(x), torch.tanh(x) * 2, torch.exp(x) * 3

        x = torch.randn(4, 4)
        listed = ("tanh", "exp")
        o = substitute_with("twice", pattern("tanh", listed), kernel(listed), twice, (x,))
        print(o.graph.code.count("pdlkit.k_tanh_exp"), o.graph.code.count("aten.exp"))
        """,
    )
    assert out.split() == ["2", "0"]


# -- torch.no_grad() and torch.autocast(...) regions ---------------------------------------------

LIN_RELU_KERNEL = """
@pdlkit.kernel(op="lin_relu", meta=meta)
def k_lin_relu(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    return torch.relu(x @ w.t() + b)
"""


class Regions(torch.nn.Module):
    """linear -> relu, then linear -> relu inside a torch.no_grad() or torch.autocast region
    (``enabled=False``: one with autocast off)."""

    def __init__(self, autocast: bool, enabled: bool = True):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 16)
        self.autocast, self.enabled = autocast, enabled

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(x))
        if self.autocast:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.enabled):
                g = torch.relu(self.fc2(h))
        else:
            with torch.no_grad():
                g = torch.relu(self.fc2(h))
        return torch.cat([h, g.float()], dim=-1)


@pytest.fixture
def lin_relu_folders(tmp_path):
    return make_folders(tmp_path, LIN_RELU_KERNEL, op="lin_relu", act="relu")


def _regions(autocast: bool, enabled: bool = True) -> tuple[Regions, torch.Tensor]:
    """A Regions model (seed 0) and an input [4, 16]; the kernel counters reset."""
    torch.manual_seed(0)
    model, x = Regions(autocast, enabled), torch.randn(4, 16)
    pdlkit.stats(reset=True)
    return model, x


def _calls() -> int:
    return pdlkit.stats()["by_kernel"].get("k_lin_relu", {}).get("kernel_calls", 0)


def test_no_grad_region_compiles_to_eager_numbers_with_both_sites_substituted(
    lin_relu_folders,
):
    model, x = _regions(autocast=False)
    model.eval().requires_grad_(False)
    p, k = lin_relu_folders
    y = pdlkit.optimize(model, patterns=p, kernels=k)(x)  # grad mode on: the region is one
    torch.testing.assert_close(y, model(x))
    assert _calls() == 2  # outside the region and inside it


def test_autocast_region_compiles_to_eager_numbers_with_the_outside_substituted(
    lin_relu_folders,
):
    model, x = _regions(autocast=True)
    model.eval()
    p, k = lin_relu_folders
    with torch.no_grad():
        y = pdlkit.optimize(model, patterns=p, kernels=k)(x)
        want = model(x)
    torch.testing.assert_close(y, want, rtol=1e-2, atol=1e-2)  # bfloat16 inside the region
    assert _calls() == 1
    subs = pdlkit.explain(model, x, patterns=p, kernels=k).graphs[0].substitutions
    assert [s.root for s in subs] == ["relu"]  # relu_1, in the region, is left to Inductor


def test_autocast_off_region_compiles_to_eager_numbers_with_both_sites_substituted(
    lin_relu_folders,
):
    # inside torch.autocast(..., enabled=False) ops run in their own dtypes, as outside it
    model, x = _regions(autocast=True, enabled=False)
    model.eval()
    p, k = lin_relu_folders
    with torch.no_grad():
        y = pdlkit.optimize(model, patterns=p, kernels=k)(x)
        want = model(x)
    torch.testing.assert_close(y, want)
    assert _calls() == 2  # outside the region and inside it


def test_kernel_without_backward_serves_the_no_grad_region_of_a_training_graph(
    lin_relu_folders,
):
    model, x = _regions(autocast=False)
    model.train()
    p, k = lin_relu_folders
    y = pdlkit.optimize(model, patterns=p, kernels=k)(x)
    (got,) = torch.autograd.grad(y.sum(), model.fc1.weight)
    want = model(x)
    (want_grad,) = torch.autograd.grad(want.sum(), model.fc1.weight)
    torch.testing.assert_close(y, want)
    torch.testing.assert_close(got, want_grad)
    assert _calls() == 1  # only inside the region: outside, fc1's weight needs a gradient


def test_values_read_after_an_autocast_region_have_its_dtype(tmp_path):
    pattern = op_pattern("relu_f32", "relu_f32")
    kernel = """
    @pdlkit.kernel(op="relu_f32", meta=lambda x: torch.empty_like(x), dtypes={"x": [torch.float32]})
    def k_relu_f32(x: Tensor) -> Tensor:
        return torch.relu(x)
    """

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 8)

        def forward(self, x):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                h = self.fc(x)
            return torch.relu(h)  # bfloat16 at run time

    write(tmp_path / "p", "relu.pdl.mlir", pattern)
    write(tmp_path / "k", "k.py", KERNEL_HEADER + textwrap.dedent(kernel))
    report = pdlkit.explain(M(), torch.randn(2, 8), patterns=tmp_path / "p", kernels=tmp_path / "k")
    graph = report.graphs[0]
    assert graph.substitutions == []
    assert "x is bfloat16, the kernel takes float32" in graph.near_misses[0].reason


def test_graph_compiled_under_autocast_is_left_to_inductor(lin_relu_folders):
    model, x = _regions(autocast=False)
    model.eval().requires_grad_(False)
    p, k = lin_relu_folders
    compiled = pdlkit.optimize(model, patterns=p, kernels=k)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with pytest.warns(UserWarning, match=r"left to Inductor: compiled under torch\.autocast"):
            y = compiled(x)
        want = model(x)
    torch.testing.assert_close(y, want, rtol=1e-2, atol=1e-2)
    assert _calls() == 0

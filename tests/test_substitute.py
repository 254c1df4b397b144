"""Pattern-level tests: input graph, pattern, expected rewritten graph as text, numerics, lint."""

from __future__ import annotations

import re

import pytest
import torch
from conftest import (
    KERNEL_HEADER,
    LINEAR,
    LINEAR_GELU,
    RELU_ADD,
    linear_act,
    linear_act_pattern,
    pdl_pattern,
    write,
)
from pdlkit.matcher import load_patterns
from pdlkit.matcher.substitute import substitute
from pdlkit.runtime_abi.capability import host
from pdlkit.runtime_abi.registry import KernelRegistry
from torch.fx.experimental.proxy_tensor import make_fx

F = torch.nn.functional


def trace(fn, *args):
    return make_fx(fn, pre_dispatch=True, tracing_mode="fake")(*args)


def xwb() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A linear's x [4, 8], weight [6, 8] and bias [6]."""
    return torch.randn(4, 8), torch.randn(6, 8), torch.randn(6)


def run(tmp_path, fn, args, patterns: dict[str, str] | None = None, kernels: str | None = None):
    """Substitute ``fn``'s graph with ``patterns`` (the linear -> relu "lr", calling lin_relu)
    and ``kernels`` (RELU_KERNEL)."""
    patterns = patterns or {"a.pdl.mlir": linear_act_pattern("lr", "relu", "lin_relu")}
    kernels = kernels or RELU_KERNEL
    pdir, kdir = tmp_path / "p", tmp_path / "k"
    for name, text in patterns.items():
        write(pdir, name, text)
    write(kdir, "k.py", KERNEL_HEADER + kernels)
    gm = trace(fn, *args)
    out = substitute(gm, load_patterns([pdir]), KernelRegistry.from_folders([kdir]), host())
    gm.graph.lint()
    return out


def body(gm) -> list[str]:
    """The graph's code, one statement a line, without the `arg = None` bookkeeping."""
    lines = []
    for line in gm.code.strip().splitlines()[1:]:
        line = re.sub(r";\s+[\w\s=]+= None\s*$", "", line.strip())
        line = re.sub(r"(torch\.ops\.pdlkit\.\w+\.default\(.*), \d+\)$", r"\1, SITE)", line)
        if line:
            lines.append(line)
    return lines


RELU_KERNEL = """
@pdlkit.kernel(op="lin_relu", meta=meta)
def k_lin_relu(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    return torch.relu(x @ w.t() + b)
"""


def test_linear_relu_becomes_one_kernel_call(tmp_path):
    def f(x, w, b):
        return torch.relu(F.linear(x, w, b))

    args = xwb()
    out = run(tmp_path, f, args)
    assert body(out.graph) == [
        "k_lin_relu_default = torch.ops.pdlkit.k_lin_relu.default(x_1, w_1, b_1, SITE)",
        "return k_lin_relu_default",
    ]
    assert len(out.report.substitutions) == 1
    sub = out.report.substitutions[0]
    assert (sub.pattern, sub.kernel, sub.replaced) == ("lr", "k_lin_relu", ["relu", "linear"])
    torch.testing.assert_close(out.graph(*args), f(*args))


def test_no_match_leaves_graph_unchanged(tmp_path):
    out = run(tmp_path, lambda x, w, b: torch.tanh(F.linear(x, w, b)), xwb())
    assert body(out.graph) == [
        "linear = torch.ops.aten.linear.default(x_1, w_1, b_1)",
        "tanh = torch.ops.aten.tanh.default(linear)",
        "return tanh",
    ]
    assert out.report.silent["lr"] == "root op torch.aten.relu does not occur in the graph"


def test_constant_and_string_operands_reach_the_kernel(tmp_path):
    match = f"""
{LINEAR_GELU}
  pdl.apply_native_constraint "constant_equals"(%approx, %tanh : !pdl.value, !pdl.attribute)
"""
    scale = "%scale = pdl.attribute = 2.0 : f64"
    args = "%x, %w, %b, %approx, %scale:attribute"
    pattern = pdl_pattern("lg", match, "%gelu", "lin_gelu", args, rewrite=scale)
    kernel = """
@pdlkit.kernel(op="lin_gelu", meta=lambda x, w, b, a, s: meta(x, w, b))
def k_lin_gelu(x: Tensor, w: Tensor, b: Tensor, approximate: str, scale: float) -> Tensor:
    assert approximate == "tanh" and scale == 2.0
    return torch.nn.functional.gelu(x @ w.t() + b, approximate=approximate)
"""

    def f(x, w, b):
        return F.gelu(F.linear(x, w, b), approximate="tanh") + F.gelu(F.linear(x, w, b))

    args = xwb()
    out = run(tmp_path, f, args, {"a.pdl.mlir": pattern}, kernel)
    text = "\n".join(body(out.graph))
    assert "torch.ops.pdlkit.k_lin_gelu.default(x_1, w_1, b_1, 'tanh', 2.0, SITE)" in text
    assert text.count("torch.ops.aten.gelu.default") == 1  # the erf gelu does not match
    misses = out.report.near_misses
    assert any("constant_equals" in m.reason and "'none'" in m.reason for m in misses)
    torch.testing.assert_close(out.graph(*args), f(*args))


def test_list_constant_operand(tmp_path):
    match = """
  %x = pdl.operand
  %dims = pdl.operand
  %keep = pdl.operand
  %dt = pdl.operand
  %t = pdl.type
  %sum = pdl.operation "torch.aten.sum.dim_IntList"(%x, %dims, %keep, %dt : !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%t : !pdl.type)
  pdl.apply_native_constraint "is_none"(%dt : !pdl.value)
"""
    pattern = pdl_pattern("s", match, "%sum", "rowsum", "%x, %dims, %keep")
    kernel = """
@pdlkit.kernel(op="rowsum", meta=lambda x, d, k: x.sum(d, keepdim=k))
def k_rowsum(x: Tensor, dims: list[int], keepdim: bool) -> Tensor:
    return x.sum(dims, keepdim=keepdim)
"""

    def f(x):
        return x.sum([1], keepdim=True) * 2

    args = (torch.randn(3, 5),)
    out = run(tmp_path, f, args, {"a.pdl.mlir": pattern}, kernel)
    assert (
        body(out.graph)[0]
        == "k_rowsum_default = torch.ops.pdlkit.k_rowsum.default(x_1, [1], True, SITE)"
    )
    torch.testing.assert_close(out.graph(*args), f(*args))


def test_multi_output_match_replaces_both_roots(tmp_path):
    # relu(x) is used twice: by the add the pattern matches and by the graph output
    pattern = pdl_pattern("relu_add", RELU_ADD, "%a", "relu_add", "%x, %y, %r:operation")
    kernel = """
def m2(x, y):
    return x.new_empty(x.shape), x.new_empty(x.shape)

@pdlkit.kernel(op="relu_add", meta=m2)
def k_relu_add(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    r = torch.relu(x)
    return r, r + y
"""

    def f(x, y):
        r = torch.relu(x)
        return r + y, r * 3

    args = (torch.randn(4, 4), torch.randn(4, 4))
    out = run(tmp_path, f, args, {"a.pdl.mlir": pattern}, kernel)
    lines = body(out.graph)
    assert lines[0] == "k_relu_add_default = torch.ops.pdlkit.k_relu_add.default(x_1, y_1, SITE)"
    assert (
        "getitem = k_relu_add_default[0]" in lines and "getitem_1 = k_relu_add_default[1]" in lines
    )
    assert not any("aten.relu" in ln or "aten.add" in ln for ln in lines)
    assert out.report.substitutions[0].replaced == ["add", "relu"]
    for a, b in zip(out.graph(*args), f(*args), strict=True):
        torch.testing.assert_close(a, b)


def any_linear(name: str, benefit: int, op: str = "lin") -> str:
    return pdl_pattern(name, LINEAR, "%lin", op, "%x, %w, %b", benefit)


def lin_kernel(op: str) -> str:
    """A kernel of x @ w.T + b for ``op``, named k_<op>."""
    return f"""
@pdlkit.kernel(op="{op}", meta=meta)
def k_{op}(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    return x @ w.t() + b
"""


LIN_KERNEL = RELU_KERNEL + lin_kernel("lin")


def _competing(x, w, b):
    return torch.relu(F.linear(x, w, b)), F.linear(x, w, b)


@pytest.mark.parametrize(
    ("fused_benefit", "linear_benefit", "expect"),
    [
        (2, 1, ["k_lin_relu", "k_lin"]),  # the fused pattern claims the relu's linear first
        (1, 2, ["k_lin", "k_lin"]),  # the linear pattern claims both linears first
    ],
)
def test_competing_patterns_benefit_decides(tmp_path, fused_benefit, linear_benefit, expect):
    pats = {
        "a.pdl.mlir": linear_act_pattern("fused", "relu", "lin_relu", fused_benefit),
        "b.pdl.mlir": any_linear("plain", linear_benefit),
    }
    args = xwb()
    out = run(tmp_path, _competing, args, pats, LIN_KERNEL)
    assert sorted(s.kernel for s in out.report.substitutions) == sorted(expect)
    for a, b in zip(out.graph(*args), _competing(*args), strict=True):
        torch.testing.assert_close(a, b)


def test_equal_benefit_file_order_decides(tmp_path):
    second = LIN_KERNEL + lin_kernel("lin2")
    pats = {
        "a.pdl.mlir": any_linear("first", 1),
        "b.pdl.mlir": any_linear("second", 1, "lin2"),
    }
    args = xwb()
    out = run(tmp_path, _competing, args, pats, second)
    assert [s.pattern for s in out.report.substitutions] == ["first", "first"]
    # every linear was claimed by the earlier file's pattern before this one ran
    assert out.report.silent["second"] == "root op torch.aten.linear does not occur in the graph"


def test_near_miss_for_constraint_and_kernel_eligibility(tmp_path):
    single_use = 'pdl.apply_native_constraint "single_use"(%y : !pdl.value)'
    pats = {"a.pdl.mlir": linear_act_pattern("lr", "relu", "lin_relu", extra=single_use)}
    kernel = """
@pdlkit.kernel(op="lin_relu", meta=meta, dtypes={"x": [torch.float32]})
def k_lin_relu(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    return torch.relu(x @ w.t() + b)
"""

    def f(x, w, b, xd, wd, bd):
        y = F.linear(x, w, b)
        return torch.relu(y), y, torch.relu(F.linear(xd, wd, bd))

    args = xwb()
    args = args + tuple(a.double() for a in args)
    out = run(tmp_path, f, args, pats, kernel)
    assert out.report.substitutions == []
    reasons = [m.reason for m in out.report.near_misses]
    assert any(r.startswith("constraint single_use(linear) does not hold") for r in reasons), (
        reasons
    )
    assert any("x is float64, the kernel takes float32" in r for r in reasons), reasons


def test_subgraph_reading_an_input_the_kernel_does_not_receive_is_refused(tmp_path):
    pattern = pdl_pattern("lr", linear_act("relu"), "%act", "lin_relu", "%x, %w")
    kernel = """
@pdlkit.kernel(op="lin_relu", meta=lambda x, w: x.new_empty((x.shape[0], w.shape[0])))
def k_lin_relu(x: Tensor, w: Tensor) -> Tensor:
    return torch.relu(x @ w.t())
"""

    def f(x, w, b):
        return torch.relu(F.linear(x, w, b))

    args = xwb()
    out = run(tmp_path, f, args, {"a.pdl.mlir": pattern}, kernel)
    assert out.report.substitutions == []
    assert "reads b_1, which the kernel call does not receive" in out.report.near_misses[0].reason


def test_kernel_meta_disagreeing_with_the_pattern_is_a_near_miss(tmp_path):
    kernel = """
@pdlkit.kernel(op="lin_relu", meta=lambda x, w, b: x.new_empty((1,)))
def k_lin_relu(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    return torch.relu(x @ w.t() + b)
"""

    def f(x, w, b):
        return torch.relu(F.linear(x, w, b))

    out = run(tmp_path, f, xwb(), kernels=kernel)
    assert out.report.substitutions == []
    assert "meta function gives [1] torch.float32, the replaced subgraph produces [4, 6]" in (
        out.report.near_misses[0].reason
    )


def test_chained_substitutions_feed_each_other(tmp_path):
    def f(x, w1, b1, w2, b2):
        return torch.relu(F.linear(torch.relu(F.linear(x, w1, b1)), w2, b2))

    args = (torch.randn(4, 8), torch.randn(8, 8), torch.randn(8), torch.randn(3, 8), torch.randn(3))
    out = run(tmp_path, f, args)
    lines = body(out.graph)
    assert lines == [
        "k_lin_relu_default = torch.ops.pdlkit.k_lin_relu.default(x_1, w1_1, b1_1, SITE)",
        "k_lin_relu_default_1 = torch.ops.pdlkit.k_lin_relu.default(k_lin_relu_default, w2_1, b2_1, SITE)",
        "return k_lin_relu_default_1",
    ]
    torch.testing.assert_close(out.graph(*args), f(*args))


def test_patterns_on_disjoint_ops_share_a_walk_and_keep_their_reports(tmp_path):
    from pdlkit.matcher.match_context import batches as _batches

    sig = linear_act_pattern("sig", "sigmoid", "lin_relu").replace(
        "torch.aten.linear", "torch.aten.matmul"
    )
    sig = sig.replace(
        '"torch.aten.matmul"(%x, %w, %b : !pdl.value, !pdl.value, !pdl.value)',
        '"torch.aten.matmul"(%x, %w : !pdl.value, !pdl.value)',
    )
    sig = sig.replace(
        "%op, %x, %w, %b, %act : !pdl.attribute, !pdl.value, !pdl.value, !pdl.value,",
        "%op, %x, %w, %act : !pdl.attribute, !pdl.value, !pdl.value,",
    )
    sig = sig.replace("%b = pdl.operand\n", "")
    pats = {
        "a.pdl.mlir": linear_act_pattern(
            "lr",
            "relu",
            "lin_relu",
            extra='pdl.apply_native_constraint "single_use"(%y : !pdl.value)',
        ),
        "b.pdl.mlir": sig,
    }

    def f(x, w, b):
        y = F.linear(x, w, b)
        return torch.relu(y), y, torch.sigmoid(x @ w.t())

    args = xwb()
    pdir = tmp_path / "p"
    for name, text in pats.items():
        write(pdir, name, text)
    ps = load_patterns([pdir])
    assert [[p.name for p in b] for b in _batches(ps.ordered())] == [["lr", "sig"]]
    out = run(tmp_path, f, args, pats, RELU_KERNEL)
    assert out.report.substitutions == []
    # the single_use failure is reported for lr; sig found no eligible kernel (wrong arity)
    by_pattern = {m.pattern: m.reason for m in out.report.near_misses}
    assert by_pattern["lr"].startswith("constraint single_use(linear) does not hold")
    assert "takes 3 arguments" in by_pattern["sig"]

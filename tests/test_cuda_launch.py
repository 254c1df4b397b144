"""Kernels that Inductor launches (runtime_abi/triton_binding.py), checked on the CPU.

A kernel declared ``@launched_by_inductor`` is traced into the compiled graph, so Inductor's
generated code runs its body (torch ops, and Triton kernels through ``wrap_triton``) with no
call back into pdlkit. Kernels whose body is torch ops run that way on the CPU under
Inductor, end to end; the shipped CUDA kernels' Triton launches are checked in the graph
AOT autograd hands Inductor (running them needs a GPU: tests/test_cuda.py does, there).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import torch
from conftest import KERNEL_HEADER, MLP, linear_act_pattern, write
from torch._inductor.utils import run_and_get_code

import pdlkit

LAUNCHED = """
from pdlkit.runtime_abi.triton_binding import launched_by_inductor

@pdlkit.kernel(op="lin_sigmoid", meta=meta, dtypes={"x": [torch.float32]})
@launched_by_inductor()
def k_traced(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    if x.shape[0] > 8:
        raise pdlkit.KernelUnsupported("more than 8 rows")
    return torch.sigmoid(torch.addmm(b, x, w.t())) * 1.0
"""

WRONG_DTYPE = """
from pdlkit.runtime_abi.triton_binding import launched_by_inductor

@pdlkit.kernel(op="lin_sigmoid", meta=meta, dtypes={"x": [torch.float32]})
@launched_by_inductor()
def k_wrong(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    return torch.sigmoid(torch.addmm(b, x, w.t())).double()
"""

PREPACKED = """
from pdlkit.runtime_abi.triton_binding import launched_by_inductor

@pdlkit.kernel(op="lin_sigmoid", meta=meta, dtypes={"x": [torch.float32]},
               prepack=lambda w, attrs: w.t().contiguous(), prepack_arg="w")
@launched_by_inductor()
def k_packed(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    return torch.sigmoid(x @ w + b)
"""


def _folders(tmp_path: Path, kernel: str) -> tuple[Path, Path]:
    p, k = tmp_path / "patterns", tmp_path / "kernels"
    write(p, "lin_sigmoid.pdl.mlir", linear_act_pattern("lin_sigmoid", "sigmoid", "lin_sigmoid"))
    write(k, "k.py", KERNEL_HEADER + kernel)
    return p, k


def _compiled_code(model, x, p, k, **kw):
    """The model's output and Inductor's code, compiled afresh (no cached graph: the tests
    look at what compiling does)."""
    torch._dynamo.reset()
    f = pdlkit.optimize(model, patterns=p, kernels=k, autotune="off", dynamic=False, **kw)
    fresh = torch._functorch.config.patch(enable_autograd_cache=False)
    with torch.no_grad(), fresh, torch._inductor.config.patch(fx_graph_cache=False):
        y, code = run_and_get_code(f, x)
    return y, "\n".join(code)


@pytest.fixture
def model():
    torch.manual_seed(0)
    return MLP().eval()


def test_inductor_runs_the_kernel_body_with_no_call_into_pdlkit(model, tmp_path):
    p, k = _folders(tmp_path, LAUNCHED)
    x = torch.randn(4, 16)
    pdlkit.stats(reset=True)
    y, code = _compiled_code(model, x, p, k)
    torch.testing.assert_close(y, model(x))
    assert pdlkit.stats()["by_kernel"]["k_traced"]["substitutions"] == 1
    assert "torch.ops.pdlkit" not in code  # the body is Inductor's own code now


def test_a_kernel_that_declines_at_compile_time_leaves_the_replaced_ops(model, tmp_path):
    p, k = _folders(tmp_path, LAUNCHED)
    x = torch.randn(12, 16)  # more than the kernel's 8 rows
    with pytest.warns(UserWarning, match="k_traced declined .*more than 8 rows"):
        y, code = _compiled_code(model, x, p, k)
    torch.testing.assert_close(y, model(x))
    assert "torch.ops.pdlkit" not in code


def test_first_call_verification_keeps_the_op_and_its_runner(model, tmp_path):
    p, k = _folders(tmp_path, LAUNCHED)
    x = torch.randn(4, 16)
    pdlkit.stats(reset=True)
    y, code = _compiled_code(model, x, p, k, verify="first_call")
    torch.testing.assert_close(y, model(x))
    assert "torch.ops.pdlkit.k_traced" in code  # verification runs per call, in the runner
    assert pdlkit.stats()["by_kernel"]["k_traced"]["verifications"] == 1


def test_a_body_that_breaks_its_meta_function_fails_compilation(model, tmp_path):
    p, k = _folders(tmp_path, WRONG_DTYPE)
    with pytest.raises(Exception, match="k_wrong.*returns .*float64.*meta function declares"):
        _compiled_code(model, torch.randn(4, 16), p, k)


def test_launched_kernels_cannot_prepack(model, tmp_path):
    p, k = _folders(tmp_path, PREPACKED)
    with pytest.raises(Exception, match="k_packed.*pre-packs a weight"):
        _compiled_code(model, torch.randn(4, 16), p, k)


def test_autotune_times_a_launched_kernel_as_inductor_compiles_it(model, tmp_path, monkeypatch):
    monkeypatch.setenv("PDLKIT_CACHE_DIR", str(tmp_path / "cache"))
    p, k = _folders(tmp_path, LAUNCHED)
    torch._dynamo.reset()
    report = pdlkit.explain(model, torch.randn(4, 16), patterns=p, kernels=k, autotune="full")
    assert re.search(r"k_traced [0-9.]+ us", str(report))


def test_a_launched_kernel_that_declines_while_timed_leaves_the_replaced_ops(
    model, tmp_path, monkeypatch
):
    """Timed while Dynamo compiles the model, a launched kernel that declines (16 rows, over
    its 8) is no candidate, and the model compiles and runs with the replaced ops."""
    monkeypatch.setenv("PDLKIT_CACHE_DIR", str(tmp_path / "cache"))
    p, k = _folders(tmp_path, LAUNCHED)
    torch._dynamo.reset()
    f = pdlkit.optimize(model, patterns=p, kernels=k, autotune="full", dynamic=False)
    x = torch.randn(16, 16)
    with torch.no_grad():
        torch.testing.assert_close(f(x), model(x))


def test_a_nested_compile_adds_nothing_to_the_ambient_shape_env():
    """A launched kernel's timing call is compiled apart from the compilation in progress:
    no symbols or guards in its shape env (on an H200, inside Dynamo's compile, such guards
    had no source and Dynamo's guard building failed: Llama prefill 8 x 512, IndexError)."""
    from pdlkit.runtime_abi import triton_binding
    from torch._guards import TracingContext, tracing
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    def op(x, shape, sid):
        return x.reshape(shape) * 2

    env = ShapeEnv()
    with tracing(TracingContext(FakeTensorMode(shape_env=env))):
        call = triton_binding.compiled_call(op, [torch.randn(8, 16), [4, 32]], 0)
    assert call().shape == (4, 32)
    assert not env.guards and not env.backed_var_to_val


# -- the shipped CUDA kernels' Triton launches, in the graph Inductor gets ------------------------


class _Traced(Exception):
    """Raised by the compiler below once it has the graph: nothing runs it."""


def _aot_forward(op, args, sid, dynamic=False):
    from torch._functorch.aot_autograd import aot_function

    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    graphs = []

    def keep(gm, _):
        graphs.append(gm)
        raise _Traced

    def call(*ts):
        it = iter(ts)
        return op(*[next(it) if isinstance(a, torch.Tensor) else a for a in args], sid)

    # without a GPU Triton cannot analyse which arguments a kernel writes (it says so at
    # length): AOT then assumes all of them, which changes nothing checked here
    logging.getLogger("torch._higher_order_ops.triton_kernel_wrap").setLevel(logging.ERROR)
    with pytest.raises(_Traced):
        aot_function(call, fw_compiler=keep, dynamic=dynamic)(*tensors)
    return graphs[0]


def _cuda_kernel(name: str):
    pytest.importorskip("triton", reason="Triton is not installed (pip install triton)")
    import pdlkit.kernels
    from pdlkit.runtime_abi.registry import load_kernel_file

    shipped = Path(pdlkit.kernels.__file__).parent
    load_kernel_file(shipped / "ops" / "logical_ops.py")  # the ops (schemas), then the kernels
    return {k.name: k for k in load_kernel_file(shipped / "cuda" / "gemm.py")}[name]


def _site(kernel):
    from pdlkit.runtime_abi.binding import CallSite, bind, new_site

    def fallback(q, xs, w, ws, bias, dtype):
        y = torch._int_mm(q, w.t()).to(torch.float32) * xs * ws
        return y.to(torch.bfloat16)

    return bind(kernel), new_site(CallSite(kernel, "test", "node", "", fallback))


def _int8_args(m: int):
    q = torch.randint(-127, 128, (m, 64), dtype=torch.int8)
    w = torch.randint(-127, 128, (32, 64), dtype=torch.int8)
    return (q, torch.rand(m, 1), w, torch.rand(32), None, 15)


@pytest.mark.parametrize(
    "name,m", [("int8_linear_triton", 100), ("int8_linear_triton", 8), ("int8_linear_splitk", 8)]
)
def test_cuda_int8_linear_is_a_triton_launch_in_inductors_graph(name, m):
    op, sid = _site(_cuda_kernel(name))
    gm = _aot_forward(op, _int8_args(m), sid)
    targets = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    assert "triton_kernel_wrapper_functional" in targets
    assert not any("pdlkit" in t for t in targets)


def test_split_k_kernel_over_256_rows_compiles_the_replaced_ops():
    op, sid = _site(_cuda_kernel("int8_linear_splitk"))
    with pytest.warns(UserWarning, match="300 rows"):
        gm = _aot_forward(op, _int8_args(300), sid)
    targets = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    assert "aten._int_mm.default" in targets
    assert "triton_kernel_wrapper_functional" not in targets


def test_a_decode_gemm_launch_passes_only_the_tensors_it_reads():
    # every argument is work for Inductor's launcher at each call: the split-K kernel gets
    # None (a constexpr, never passed) for what a plain GEMM does not read (a second weight,
    # the workspace, bias, residual, a float row to quantize)
    op, sid = _site(_cuda_kernel("int8_linear_splitk"))
    gm = _aot_forward(op, _int8_args(8), sid)
    (launch,) = [n for n in gm.graph.nodes if "triton_kernel_wrapper" in str(n.target)]
    passed = sorted(k for k, v in launch.kwargs["kwargs"].items() if isinstance(v, torch.fx.Node))
    assert passed == ["a_ptr", "a_scale_ptr", "b_ptr", "b_scale_ptr", "c_ptr"]


@pytest.mark.parametrize(
    "name,m", [("int8_linear_triton", 100), ("int8_linear_triton", 8), ("int8_linear_splitk", 8)]
)
def test_a_cuda_kernel_traced_with_dynamic_rows_adds_no_guard_on_them(name, m):
    """The kernels pick tiles and paths by M's hint (triton_binding.size_hint): traced for
    dynamic shapes they leave no guard on M, so a model compiled once serves every row count
    (with guards on M's tile and path thresholds a Llama prefill recompiled at each length)."""
    op, sid = _site(_cuda_kernel(name))
    gm = _aot_forward(op, _int8_args(m), sid, dynamic=True)
    q = next(n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder")
    rows = q.shape[0].node.expr
    guards = [g.expr for g in q.shape[0].node.shape_env.guards]
    assert isinstance(q.shape[0], torch.SymInt) and guards  # K and N, dynamic here, are guarded
    assert [g for g in guards if rows in g.free_symbols] == []

"""The canonical rules for torchao's int8 linears (matcher/canonical_int8.py): the graph torchao's
``Int8Tensor`` gives on CUDA becomes pdlkit.quantization.int8_dynamic's form, and back, with
the same numbers, where no kernel claims it."""

from __future__ import annotations

import torch
from pdlkit.matcher.canonicalize import canonicalize, restore
from torch._higher_order_ops.out_dtype import out_dtype
from torch.fx.experimental.proxy_tensor import make_fx

aten = torch.ops.aten
M, K, N = 6, 32, 24


def torchao_linear(q, xs, w, ws):
    """torchao 0.18's Int8Tensor linear on CUDA, op for op (seen on an H200: an Int8Tensor
    MLP's forward graph): int8 GEMM, the row scale broadcast, a rounding to bf16, the [N, 1]
    weight scale flattened, a reshape and the cast to the activation dtype."""
    mm = out_dtype(aten.mm.default, torch.int32, q, w.t())
    y = aten._to_copy.default(mm * xs.expand(M, N), dtype=torch.bfloat16)
    y = y * ws.reshape(N)
    return aten._to_copy.default(y.reshape(2, M // 2, N), dtype=torch.bfloat16)


def torchao_linear_pre_dispatch(q, xs, w, ws):
    """The same at the pre-dispatch level, where pdlkit desugars torchao's subclasses:
    ``_int_mm``, ``to`` casts and ``flatten`` of the weight scale."""
    mm = torch._int_mm(q, w.t())
    y = (mm * xs.to(torch.float32).expand(M, N)).to(torch.bfloat16) * ws.flatten()
    return y.reshape(2, M // 2, N).to(torch.bfloat16)


def _inputs():
    g = torch.Generator().manual_seed(0)
    q = torch.randint(-128, 128, (M, K), dtype=torch.int8, generator=g)
    w = torch.randint(-128, 128, (N, K), dtype=torch.int8, generator=g)
    xs = torch.rand(M, 1, generator=g) * 0.05 + 1e-3
    ws = torch.rand(N, 1, generator=g) * 0.01 + 1e-4
    return q, xs, w, ws


def _ops(gm):
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


def test_torchao_linear_becomes_the_int8_dynamic_form():
    gm = make_fx(torchao_linear, pre_dispatch=True, tracing_mode="fake")(*_inputs())
    fired = canonicalize(gm)
    assert {"int_mm", "to_copy_as_to", "int8_rescale"} <= set(fired)
    # reshape(ws) moved to the graph's first op; to(_int_mm, f32) * xs * ws; to(bf16); reshape
    assert _ops(gm) == [
        "aten.reshape.default",
        "aten.t.default",
        "aten._int_mm.default",
        "aten.to.dtype",
        "aten.mul.Tensor",
        "aten.mul.Tensor",
        "aten.to.dtype",
        "aten.reshape.default",
    ]


def test_an_unclaimed_rescale_is_restored_to_the_same_numbers():
    args = _inputs()
    want = torchao_linear(*args)
    gm = make_fx(torchao_linear, pre_dispatch=True, tracing_mode="fake")(*args)
    canonicalize(gm)
    assert restore(gm) == 1  # the rescale; the exact rules stay
    assert "aten.expand.default" in _ops(gm) and "aten._int_mm.default" in _ops(gm)
    assert torch.equal(gm(*args), want)  # bit for bit: the rounding to bf16 is back


def test_the_claimed_form_differs_by_the_one_rounding_it_drops():
    args = _inputs()
    want = torchao_linear(*args)
    gm = make_fx(torchao_linear, pre_dispatch=True, tracing_mode="fake")(*args)
    canonicalize(gm)
    got = gm(*args)  # what a kernel claiming it computes: float32 until the last cast
    assert got.dtype == want.dtype and got.shape == want.shape
    assert not torch.equal(got, want)  # inexact: hence restored where no kernel claims it
    ulp = torch.finfo(torch.bfloat16).eps * want.float().abs()
    assert ((got.float() - want.float()).abs() <= ulp).all()


def test_out_dtype_of_other_dtypes_or_ops_is_left_alone():
    def f(a, b):
        return out_dtype(aten.mm.default, torch.int32, a.float(), b.float())

    a = torch.randint(-8, 8, (4, 8), dtype=torch.int8)
    gm = make_fx(f, pre_dispatch=True, tracing_mode="fake")(a, a.t().contiguous())
    assert "int_mm" not in canonicalize(gm)
    assert "aten._int_mm.default" not in _ops(gm)


def test_a_copy_that_changes_more_than_the_dtype_stays_a_copy():
    def f(x):
        return aten._to_copy.default(x, dtype=torch.float16, memory_format=torch.channels_last)

    gm = make_fx(f, pre_dispatch=True, tracing_mode="fake")(torch.randn(1, 3, 4, 4))
    assert "to_copy_as_to" not in canonicalize(gm)
    assert _ops(gm) == ["aten._to_copy.default"]


def test_the_pre_dispatch_spelling_becomes_the_same_form():
    gm = make_fx(torchao_linear_pre_dispatch, pre_dispatch=True, tracing_mode="fake")(*_inputs())
    fired = canonicalize(gm)
    assert {"int8_rescale", "int8_cast_first"} <= set(fired)
    ops = _ops(gm)
    assert ops[0] == "aten.flatten.using_ints"  # the weight scale's view, first
    assert ops[-3:] == ["aten.mul.Tensor", "aten.to.dtype", "aten.reshape.default"]
    assert "aten.expand.default" not in ops


def test_outputs_of_one_multi_output_op_are_merged_like_any_pure_op():
    from pdlkit.matcher.cse import eliminate_common_subexpressions

    def f(x):
        a = torch.ops.aten.var_mean.correction(x, [1], keepdim=True)
        b = torch.ops.aten.var_mean.correction(x, [1], keepdim=True)
        return a[0] + b[0], a[1] * b[1]

    gm = make_fx(f, pre_dispatch=True, tracing_mode="fake")(torch.randn(3, 4))
    assert eliminate_common_subexpressions(gm) == 3  # the second call and its two outputs
    assert _ops(gm).count("<built-in function getitem>") == 2


def torchao_linear_with_bias(q, xs, w, ws, b):
    """torchao's linear with a bias (pre-dispatch): the bias added in place into the rescaled
    result's reshape (``y += bias``), then the cast."""
    mm = torch._int_mm(q, w.t())
    y = (mm * xs.expand(M, N)).to(torch.bfloat16) * ws.flatten()
    y = y.reshape(2, M // 2, N)
    y += b
    return y.to(torch.bfloat16)


def test_a_bias_added_in_place_becomes_a_functional_add_before_the_reshape():
    args = (*_inputs(), torch.randn(N).to(torch.bfloat16))
    gm = make_fx(torchao_linear_with_bias, pre_dispatch=True, tracing_mode="fake")(*args)
    fired = canonicalize(gm)
    assert {"int8_rescale", "int8_bias_in_place", "int8_cast_first"} <= set(fired)
    ops = _ops(gm)
    assert "aten.add_.Tensor" not in ops
    assert ops[-4:] == [
        "aten.mul.Tensor",
        "aten.add.Tensor",
        "aten.to.dtype",
        "aten.reshape.default",
    ]
    assert restore(gm) == 1
    assert torch.equal(gm(*args), torchao_linear_with_bias(*args))  # exact, once restored


def test_a_wider_bias_than_the_weight_only_result_stays_in_place():
    # bf16 result, float32 bias: the in-place add rounds to bf16, a functional one would not
    def f(x, w, ws, b):
        y = torch.mm(x, w.t().to(torch.bfloat16)) * ws.to(torch.bfloat16).flatten()
        y = y.reshape(2, M // 2, N)
        y += b
        return y.to(torch.bfloat16)

    q, _, w, ws = _inputs()
    args = (torch.randn(M, K).to(torch.bfloat16), w, ws, torch.randn(N))
    gm = make_fx(f, pre_dispatch=True, tracing_mode="fake")(*args)
    assert "int8_bias_in_place" not in canonicalize(gm)
    assert "aten.add_.Tensor" in _ops(gm)
    assert torch.equal(gm(*args), f(*args))

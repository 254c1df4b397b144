"""The native constraint library, one behaviour each, on values of a real Torch-dialect module."""

from __future__ import annotations

import pytest
from pdlkit.matcher import natives
from pdlkit.matcher.to_mlir import new_context
from torch_mlir import ir

MODULE = """
func.func @main(%x: !torch.vtensor<[4,?],f32>, %w: !torch.vtensor<[8,16],bf16>, %q: !torch.vtensor<[8,16],si8>) -> !torch.vtensor<[4,?],f32> {
  %none = torch.constant.none
  %s = torch.constant.str "tanh"
  %i = torch.constant.int 3
  %l = torch.prim.ListConstruct %i, %i : (!torch.int, !torch.int) -> !torch.list<int>
  %g = torch.aten.gelu %x, %s : !torch.vtensor<[4,?],f32>, !torch.str -> !torch.vtensor<[4,?],f32>
  %r = torch.aten.relu %g : !torch.vtensor<[4,?],f32> -> !torch.vtensor<[4,?],f32>
  %r2 = torch.aten.relu %x : !torch.vtensor<[4,?],f32> -> !torch.vtensor<[4,?],f32>
  %r3 = torch.aten.relu %x : !torch.vtensor<[4,?],f32> -> !torch.vtensor<[4,?],f32>
  %i4 = torch.constant.int 4
  %l2 = torch.prim.ListConstruct %i, %i : (!torch.int, !torch.int) -> !torch.list<int>
  %l3 = torch.prim.ListConstruct %i, %i4 : (!torch.int, !torch.int) -> !torch.list<int>
  return %r : !torch.vtensor<[4,?],f32>
}
"""


@pytest.fixture(scope="module")
def v():
    ctx = new_context()
    module = ir.Module.parse(MODULE, ctx)
    func = module.body.operations[0].operation
    block = func.regions[0].blocks[0]
    ops = [o.operation for o in block.operations]
    vals = {"x": block.arguments[0], "w": block.arguments[1], "q": block.arguments[2]}
    for name, op in zip(["none", "s", "i", "l", "g", "r"], ops, strict=False):
        vals[name] = op.results[0]
    vals["l2"], vals["l3"] = ops[9].results[0], ops[10].results[0]
    vals["_keep"] = (ctx, module)
    return vals


def attr(v, text):
    return ir.Attribute.parse(text, v["_keep"][0])


def test_tensor_kinds(v):
    assert natives.is_tensor(v["x"]) and not natives.is_tensor(v["s"])
    assert natives.is_float_tensor(v["w"]) and not natives.is_float_tensor(v["q"])


def test_dtype_by_dialect_or_torch_name(v):
    assert natives.has_dtype(v["w"], attr(v, '"bf16"'))
    assert natives.has_dtype(v["q"], attr(v, '"int8"'))
    assert not natives.has_dtype(v["x"], attr(v, '"bf16"'))
    assert natives.same_dtype(v["x"], v["g"]) and not natives.same_dtype(v["x"], v["w"])


def test_rank_and_dims(v):
    assert natives.has_rank(v["w"], attr(v, "2 : i64")) and not natives.has_rank(
        v["w"], attr(v, "3 : i64")
    )
    assert natives.dim_equals(v["w"], attr(v, "-1 : i64"), attr(v, "16 : i64"))
    assert natives.dim_divisible_by(v["w"], attr(v, "1 : i64"), attr(v, "4 : i64"))
    assert not natives.dim_divisible_by(
        v["x"], attr(v, "1 : i64"), attr(v, "4 : i64")
    )  # dynamic dim
    assert not natives.dim_equals(v["w"], attr(v, "5 : i64"), attr(v, "1 : i64"))  # out of range
    assert natives.has_static_shape(v["w"]) and not natives.has_static_shape(v["x"])


def test_same_dims_compares_static_dims_of_two_tensors(v):
    assert natives.same_dims(v["w"], v["q"], attr(v, "[0, 1]"))  # [8, 16] and [8, 16]
    assert natives.same_dims(v["x"], v["g"], attr(v, "[0]"))  # 4 and 4
    assert not natives.same_dims(v["x"], v["g"], attr(v, "[1]"))  # dynamic: not known equal
    assert not natives.same_dims(v["x"], v["w"], attr(v, "[0]"))  # 4 and 8
    assert not natives.same_dims(v["w"], v["q"], attr(v, "[2]"))  # no dim 2
    assert not natives.same_dims(v["w"], v["s"], attr(v, "[0]"))  # a string, not a tensor


def test_constants(v):
    assert (
        natives.is_constant(v["s"])
        and natives.is_constant(v["l"])
        and not natives.is_constant(v["x"])
    )
    assert natives.constant_value(v["l"]) == [3, 3]
    assert natives.constant_equals(v["s"], attr(v, '"tanh"')) and not natives.constant_equals(
        v["s"], attr(v, '"none"')
    )
    assert (
        natives.is_none(v["none"]) and natives.is_not_none(v["x"]) and not natives.is_none(v["x"])
    )


def test_same_constant_compares_two_constant_values(v):
    # two list constants with equal elements (what the importer makes of one literal used twice)
    assert natives.same_constant(v["l"], v["l2"])
    assert not natives.same_constant(v["l"], v["l3"])  # [3, 3] vs [3, 4]
    assert not natives.same_constant(v["x"], v["x"])  # not a constant


def test_single_use(v):
    assert natives.single_use(v["g"])  # only the relu reads it
    assert not natives.single_use(v["x"])  # gelu and two relus read it


def test_adapter_inverts_and_reports():
    fails, errors = [], []
    ok = natives.adapt_constraint(
        "c", lambda: True, lambda n, a: fails.append(n), lambda n, e: errors.append(n)
    )
    no = natives.adapt_constraint(
        "c", lambda: False, lambda n, a: fails.append(n), lambda n, e: errors.append(n)
    )
    boom = natives.adapt_constraint(
        "c", lambda: 1 / 0, lambda n, a: fails.append(n), lambda n, e: errors.append(n)
    )
    assert ok(None, None, []) is None  # MLIR: None = success
    assert no(None, None, []) is True and fails == ["c"]
    assert boom(None, None, []) is True and errors == ["c"]


def test_not_dequantized_tells_dequantized_weights_from_plain_ones():
    import torch
    import torch.ao.quantization.fx._decomposed  # noqa: F401 (registers quantized_decomposed)
    from pdlkit.matcher.to_mlir import import_graph
    from torch.fx.experimental.proxy_tensor import make_fx

    qd = torch.ops.quantized_decomposed

    def f(wq, ws, wz, w):
        per_channel = qd.dequantize_per_channel(wq, ws[:, 0], wz[:, 0], 0, -127, 127, torch.int8)
        per_group = qd.dequantize_per_channel_group(wq, ws, wz, -8, 7, torch.int8, 8, torch.float32)
        # tensor qparams: imported as a generic torch.operator
        per_tensor = qd.dequantize_per_tensor.tensor(wq, ws[0, 0], wz[0, 0], -127, 127, torch.int8)
        return per_channel + 1, per_group + 1, per_tensor + 1, w + 1

    args = (
        torch.zeros(4, 16, dtype=torch.int8),
        torch.ones(4, 2),
        torch.zeros(4, 2, dtype=torch.int64),
        torch.ones(4, 16),
    )
    ctx = new_context()
    imported = import_graph(make_fx(f, tracing_mode="fake")(*args), ctx)
    block = imported.func.regions[0].blocks[0]
    adds = [o.operation for o in block.operations if o.operation.name == "torch.aten.add.Scalar"]
    per_channel, per_group, per_tensor, plain = (op.operands[0] for op in adds)
    assert not natives.not_dequantized(per_channel)
    assert not natives.not_dequantized(per_group)
    assert natives.defining_op(per_tensor).name == "torch.operator"
    assert not natives.not_dequantized(per_tensor)
    assert natives.not_dequantized(plain)  # a graph input

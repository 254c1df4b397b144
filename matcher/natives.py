"""The native function library that every pattern can call by name.

Constraints are plain Python predicates over MLIR values and attributes that return
``True`` when the constraint holds. MLIR's PDL interpreter wants the inverse (a truthy
return means *failure*); :func:`adapt_constraint` is the one place that converts.

Use them from PDL like this::

    %dt = pdl.attribute = "f32"
    pdl.apply_native_constraint "has_dtype"(%x, %dt : !pdl.value, !pdl.attribute)

The rewrite ``pdlkit_call`` is in :mod:`pdlkit.matcher.substitute`, next to the state it
records into.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

from torch_mlir import ir

# -- reading MLIR values --------------------------------------------------------------------------

_VTENSOR = re.compile(r"^!torch\.(?:v)?tensor<\[([^\]]*)\],([a-z0-9]+)>$")
# torch names users write -> the Torch dialect's element type spelling
_DTYPE_ALIASES = {
    "float32": "f32",
    "float": "f32",
    "float16": "f16",
    "half": "f16",
    "bfloat16": "bf16",
    "float64": "f64",
    "double": "f64",
    "int8": "si8",
    "uint8": "ui8",
    "int16": "si16",
    "int32": "si32",
    "int": "si64",
    "int64": "si64",
    "long": "si64",
    "bool": "i1",
}
_FLOATS = {"f16", "bf16", "f32", "f64"}
_CONSTANT_OPS = {
    "torch.constant.int",
    "torch.constant.float",
    "torch.constant.str",
    "torch.constant.bool",
    "torch.constant.none",
    "torch.constant.device",
    "torch.constant.number",
}


@functools.lru_cache(maxsize=4096)
def _parse_type(text: str) -> tuple[tuple[int | None, ...], str] | None:
    m = _VTENSOR.match(text)
    if m is None:
        return None
    dims = tuple(None if d.strip() == "?" else int(d) for d in m.group(1).split(",") if d.strip())
    return dims, m.group(2)


def tensor_type(v: ir.Value) -> tuple[tuple[int | None, ...], str] | None:
    """``(shape, element type)`` of a tensor value, ``None`` dims for dynamic ones; None if not a tensor."""
    return _parse_type(str(v.type))


def defining_op(v: ir.Value) -> ir.Operation | None:
    return v.owner.operation if isinstance(v, ir.OpResult) else None


def py_attr(a: Any) -> Any:
    """An MLIR attribute as a Python value (str, int, float, bool, list; ``unit`` is None)."""
    if isinstance(a, ir.UnitAttr):  # `pdl.attribute = unit` passes None, e.g. an absent bias
        return None
    for kind in (ir.BoolAttr, ir.StringAttr, ir.IntegerAttr, ir.FloatAttr):
        if isinstance(a, kind):
            return kind(a).value
    if isinstance(a, ir.ArrayAttr):
        return [py_attr(x) for x in ir.ArrayAttr(a)]
    if isinstance(a, ir.TypeAttr):
        return str(ir.TypeAttr(a).value)
    return str(a)


_NOT_CONSTANT = object()


def constant_value(v: ir.Value) -> Any:
    """The Python value of a ``torch.constant.*`` (or a list of them); ``NOT_CONSTANT`` otherwise."""
    op = defining_op(v)
    if op is None:
        return _NOT_CONSTANT
    name = op.name
    if name == "torch.constant.none":
        return None
    if name in _CONSTANT_OPS:
        return py_attr(op.attributes["value"])
    if name == "torch.prim.ListConstruct":
        items = [constant_value(x) for x in op.operands]
        return _NOT_CONSTANT if any(x is _NOT_CONSTANT for x in items) else items
    return _NOT_CONSTANT


NOT_CONSTANT = _NOT_CONSTANT


def _dtype_name(a: Any) -> str:
    s = str(py_attr(a)) if not isinstance(a, str) else a
    return _DTYPE_ALIASES.get(s.removeprefix("torch."), s)


def _int(a: Any) -> int:
    return int(py_attr(a)) if not isinstance(a, int) else a


# -- the constraint library -----------------------------------------------------------------------
# Each takes MLIR values / attributes and returns True when the constraint holds.


def is_tensor(v: ir.Value) -> bool:
    """``"is_tensor"(%x)``: %x is a tensor (not a scalar, list or None)."""
    return tensor_type(v) is not None


def is_float_tensor(v: ir.Value) -> bool:
    """``"is_float_tensor"(%x)``: %x is an f16/bf16/f32/f64 tensor."""
    t = tensor_type(v)
    return t is not None and t[1] in _FLOATS


def has_dtype(v: ir.Value, dtype: Any) -> bool:
    """``"has_dtype"(%x, %dt)`` with ``%dt = pdl.attribute = "f32"`` (torch names like "int8" work too)."""
    t = tensor_type(v)
    return t is not None and t[1] == _dtype_name(dtype)


def has_rank(v: ir.Value, rank: Any) -> bool:
    """``"has_rank"(%w, %r)`` with ``%r = pdl.attribute = 2``."""
    t = tensor_type(v)
    return t is not None and len(t[0]) == _int(rank)


def dim_equals(v: ir.Value, dim: Any, size: Any) -> bool:
    """``"dim_equals"(%w, %d, %n)``: dimension %d (negative counts from the end) is statically %n."""
    t = tensor_type(v)
    if t is None:
        return False
    d = _int(dim)
    return -len(t[0]) <= d < len(t[0]) and t[0][d] == _int(size)


def dim_divisible_by(v: ir.Value, dim: Any, k: Any) -> bool:
    """``"dim_divisible_by"(%x, %d, %k)``: dimension %d is static and a multiple of %k (e.g. K % 4 == 0)."""
    t = tensor_type(v)
    if t is None:
        return False
    d = _int(dim)
    if not -len(t[0]) <= d < len(t[0]):
        return False
    size = t[0][d]
    return size is not None and size % _int(k) == 0


def has_static_shape(v: ir.Value) -> bool:
    """``"has_static_shape"(%x)``: no dynamic dimension."""
    t = tensor_type(v)
    return t is not None and None not in t[0]


def same_dtype(a: ir.Value, b: ir.Value) -> bool:
    """``"same_dtype"(%a, %b)``: two tensors share an element type."""
    ta, tb = tensor_type(a), tensor_type(b)
    return ta is not None and tb is not None and ta[1] == tb[1]


def is_constant(v: ir.Value) -> bool:
    """``"is_constant"(%v)``: %v is a compile-time constant (number, string, bool, None, or a list of them)."""
    return constant_value(v) is not NOT_CONSTANT


def is_none(v: ir.Value) -> bool:
    """``"is_none"(%b)``: %b is the constant None (e.g. a Linear without bias)."""
    op = defining_op(v)
    return op is not None and op.name == "torch.constant.none"


def is_not_none(v: ir.Value) -> bool:
    """``"is_not_none"(%b)``: %b is not the constant None."""
    return not is_none(v)


def constant_equals(v: ir.Value, expected: Any) -> bool:
    """``"constant_equals"(%approx, %s)`` with ``%s = pdl.attribute = "tanh"``: constant %v equals %s."""
    value = constant_value(v)
    return value is not NOT_CONSTANT and value == py_attr(expected)


def same_constant(a: ir.Value, b: ir.Value) -> bool:
    """``"same_constant"(%a, %b)``: two compile-time constants with equal values (the importer
    gives every use of a literal its own constant op, so the same value in two places of a
    graph is two SSA values: ``view(q, [B, S, -1, D])`` and the same view of k)."""
    value = constant_value(a)
    return value is not NOT_CONSTANT and value == constant_value(b)


def distinct(a: ir.Value, b: ir.Value) -> bool:
    """``"distinct"(%a, %b)``: two different SSA values. PDL lets two ``pdl.operation`` of a
    pattern bind one op; a pattern with several roots over a shared operand (three GEMMs of
    one activation) says with this that they are different ops."""
    return a != b


def single_use(v: ir.Value) -> bool:
    """``"single_use"(%y)``: %y has exactly one user, so replacing that user makes it dead."""
    return sum(1 for _ in v.uses) == 1


_DEQUANTIZE = "torch.quantized_decomposed.dequantize"


def not_dequantized(v: ir.Value) -> bool:
    """``"not_dequantized"(%w)``: %w is not the result of a ``quantized_decomposed.dequantize*``
    op. Float patterns use it so that a quantized GEMM no int8 pattern claimed (an unsupported
    scheme, e.g. per-group weights) stays with the default code generator instead of becoming
    a float kernel on the dequantized tensor."""
    op = defining_op(v)
    if op is None:
        return True
    name = op.name
    if name == "torch.operator":  # ops the importer has no registered form for
        name = str(py_attr(op.attributes["name"]))
    return not name.startswith(_DEQUANTIZE)


CONSTRAINTS: dict[str, Callable[..., bool]] = {
    f.__name__: f
    for f in (
        is_tensor,
        is_float_tensor,
        has_dtype,
        has_rank,
        dim_equals,
        dim_divisible_by,
        has_static_shape,
        same_dtype,
        is_constant,
        is_none,
        is_not_none,
        constant_equals,
        same_constant,
        distinct,
        single_use,
        not_dequantized,
    )
}


def adapt_constraint(
    name: str,
    fn: Callable[..., bool],
    on_fail: Callable[[str, list[Any]], None],
    on_error: Callable[[str, BaseException], None],
) -> Callable[[Any, Any, list[Any]], Any]:
    """Wrap a ``True``-when-it-holds predicate in MLIR's inverted convention (truthy = failure)."""

    def callback(rewriter: Any, results: Any, values: list[Any]) -> Any:
        try:
            ok = bool(fn(*values))
        except Exception as e:  # a broken constraint fails the match and is reported, never crashes
            on_error(name, e)
            return True
        if not ok:
            on_fail(name, values)
        return None if ok else True

    return callback

"""The native function library that every pattern can call by name.

Constraints are records (:class:`Constraint`): a plain Python predicate over MLIR values and
attributes that returns ``True`` when the constraint holds, and ``explain``, which says in
user words why it does not (explain's near misses read it; before, that knowledge was a chain
of ``if name == ...`` in ``matcher/why.py``). MLIR's PDL interpreter wants the inverse (a truthy
return means *failure*); :func:`adapt_constraint` is the one place that converts.

Use them from PDL like this::

    %dt = pdl.attribute = "f32"
    pdl.apply_native_constraint "has_dtype"(%x, %dt : !pdl.value, !pdl.attribute)

The rewrite ``pdlkit_call`` is in :mod:`pdlkit.matcher.substitute`, next to the state it
records into.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pdlkit.matcher.pdl_checks import CONSTANT_OPS as _CONSTANT_OPS
from pdlkit.runtime_abi.dtypes import FLOAT_MLIR, mlir_name, torch_name
from torch_mlir import ir

# -- reading MLIR values --------------------------------------------------------------------------

_VTENSOR = re.compile(r"^!torch\.(?:v)?tensor<\[([^\]]*)\],([a-z0-9]+)>$")


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


NOT_CONSTANT = object()


def constant_value(v: ir.Value) -> Any:
    """The Python value of a ``torch.constant.*`` (or a list of them); ``NOT_CONSTANT`` otherwise."""
    op = defining_op(v)
    if op is None:
        return NOT_CONSTANT
    name = op.name
    if name == "torch.constant.none":
        return None
    if name in _CONSTANT_OPS:
        return py_attr(op.attributes["value"])
    if name == "torch.prim.ListConstruct":
        items = [constant_value(x) for x in op.operands]
        return NOT_CONSTANT if any(x is NOT_CONSTANT for x in items) else items
    return NOT_CONSTANT


def _dtype_name(a: Any) -> str:
    return mlir_name(str(py_attr(a)) if not isinstance(a, str) else a)


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
    return t is not None and t[1] in FLOAT_MLIR


def has_dtype(v: ir.Value, dtype: Any) -> bool:
    """``"has_dtype"(%x, %dt)`` with ``%dt = pdl.attribute = "f32"`` (torch names like "int8" work too)."""
    t = tensor_type(v)
    return t is not None and t[1] == _dtype_name(dtype)


def has_rank(v: ir.Value, rank: Any) -> bool:
    """``"has_rank"(%w, %r)`` with ``%r = pdl.attribute = 2``."""
    t = tensor_type(v)
    return t is not None and len(t[0]) == _int(rank)


def _size(t: tuple[tuple[int | None, ...], str], d: int) -> int | None:
    """Dimension ``d``'s static size (negative counts from the end); None where it is
    dynamic or the tensor has no such dimension."""
    return t[0][d] if -len(t[0]) <= d < len(t[0]) else None


def dim_equals(v: ir.Value, dim: Any, size: Any) -> bool:
    """``"dim_equals"(%w, %d, %n)``: dimension %d (negative counts from the end) is statically %n."""
    t = tensor_type(v)
    n = _size(t, _int(dim)) if t is not None else None
    return n is not None and n == _int(size)


def dim_divisible_by(v: ir.Value, dim: Any, k: Any) -> bool:
    """``"dim_divisible_by"(%x, %d, %k)``: dimension %d is static and a multiple of %k (e.g. K % 4 == 0)."""
    t = tensor_type(v)
    size = _size(t, _int(dim)) if t is not None else None
    return size is not None and size % _int(k) == 0


def same_dims(a: ir.Value, b: ir.Value, dims: Any) -> bool:
    """``"same_dims"(%a, %b, %d)`` with ``%d = pdl.attribute = [0, 2, 3]``: those dimensions of
    two tensors are static and equal (a repeated K/V cache keeps its batch, length and head
    size: ``patterns/cuda/attention.pdl.mlir``)."""
    ta, tb = tensor_type(a), tensor_type(b)
    if ta is None or tb is None:
        return False
    for d in py_attr(dims) if isinstance(dims, ir.Attribute) else dims:
        n = _size(ta, _int(d))
        if n is None or n != _size(tb, _int(d)):
            return False
    return True


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


# -- why a constraint does not hold, in user words (explain, near misses) -----------------------


@dataclass(frozen=True)
class Why:
    """What an explanation reads: the constraint's values and how to name them to the user."""

    values: list[Any]
    who: Callable[[int], str]  # "%w = arg3_1" or a literal

    def attr(self, i: int) -> Any:
        return py_attr(self.values[i]) if i < len(self.values) else None

    @property
    def tensor(self) -> tuple[tuple[int | None, ...], str] | None:
        v = self.values[0] if self.values else None
        return tensor_type(v) if isinstance(v, ir.Value) else None

    def not_tensor(self) -> str:
        v = self.values[0] if self.values else None
        return f"{self.who(0)} is not a tensor (it is {v.type if isinstance(v, ir.Value) else v})"


def _dims(t: tuple[tuple[int | None, ...], str]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in t[0]) + "]"


def _why_float(w: Why) -> str:
    t = w.tensor
    if t is None:
        return w.not_tensor()
    return f"{w.who(0)} dtype is {torch_name(t[1])}, the constraint wants a floating-point dtype"


def _why_dtype(w: Why) -> str:
    t = w.tensor
    if t is None:
        return w.not_tensor()
    want = torch_name(_dtype_name(w.values[1]))
    return f"{w.who(0)} dtype is {torch_name(t[1])}, the constraint wants {want}"


def _why_rank(w: Why) -> str:
    t = w.tensor
    if t is None:
        return w.not_tensor()
    return f"{w.who(0)} has rank {len(t[0])} {_dims(t)}, the constraint wants {w.attr(1)}"


def _why_dim(want: str) -> Callable[[Why], str]:
    """dim_equals ("is"), dim_divisible_by ("multiple")."""

    def why(w: Why) -> str:
        t = w.tensor
        if t is None:
            return f"{w.who(0)} is not a tensor"
        d = int(w.attr(1))
        if not -len(t[0]) <= d < len(t[0]):
            return f"{w.who(0)} {_dims(t)} has no dim {d}"
        size = t[0][d]
        if size is None:
            return f"dim {d} of {w.who(0)} is dynamic, the constraint needs it known"
        if want == "is":
            return f"dim {d} of {w.who(0)} is {size}, the constraint wants {w.attr(2)}"
        return f"dim {d} of {w.who(0)} is {size}, not a multiple of {w.attr(2)}"

    return why


def _why_same_dims(w: Why) -> str:
    ta, v2 = w.tensor, w.values[1]
    tb = tensor_type(v2) if isinstance(v2, ir.Value) else None
    if ta is None or tb is None:
        return f"{w.who(0) if ta is None else w.who(1)} is not a tensor"
    return f"{w.who(0)} {_dims(ta)} and {w.who(1)} {_dims(tb)} differ in dims {w.attr(2)}"


def _why_static(w: Why) -> str:
    t = w.tensor
    return f"{w.who(0)} is not a tensor" if t is None else f"{w.who(0)} has dynamic dims {_dims(t)}"


def _why_same_dtype(w: Why) -> str:
    t, v2 = w.tensor, w.values[1]
    t2 = tensor_type(v2) if isinstance(v2, ir.Value) else None
    a = torch_name(t[1]) if t else "not a tensor"
    b = torch_name(t2[1]) if t2 else "not a tensor"
    return f"{w.who(0)} is {a} but {w.who(1)} is {b}"


def _constant(v: Any) -> Any:
    return constant_value(v) if isinstance(v, ir.Value) else v


def _why_equals(w: Why) -> str:
    c = _constant(w.values[0])
    if c is NOT_CONSTANT:
        return f"{w.who(0)} is not a compile-time constant (the constraint wants {w.attr(1)!r})"
    return f"{w.who(0)} is {c!r}, the constraint wants {w.attr(1)!r}"


def _why_same_constant(w: Why) -> str:
    a, b = (_constant(x) for x in w.values[:2])
    if NOT_CONSTANT in (a, b):
        return f"{w.who(0 if a is NOT_CONSTANT else 1)} is not a compile-time constant"
    return f"{w.who(0)} is {a!r} but {w.who(1)} is {b!r}"


def _why_single_use(w: Why) -> str:
    v = w.values[0]
    if not isinstance(v, ir.Value):
        return _generic("single_use", w)
    users = [_loc(u.owner) or u.owner.operation.name for u in v.uses]
    return f"{w.who(0)} has {len(users)} uses ({', '.join(users)}), the constraint wants one"


def _loc(op: Any) -> str:
    return getattr(getattr(op, "location", None), "name_str", "") or ""


def _generic(name: str, w: Why) -> str:
    return f"constraint {name} does not hold for " + ", ".join(
        w.who(i) for i in range(len(w.values))
    )


def _says(text: str) -> Callable[[Why], str]:
    return lambda w: f"{w.who(0)} {text}"


# -- the library as records -----------------------------------------------------------------------


@dataclass(frozen=True)
class Constraint:
    """One native constraint: ``fn`` holds or not (``True`` when it holds), ``explain`` says
    why not in user words (explain's near misses)."""

    fn: Callable[..., bool]
    explain: Callable[[Why], str] | None = None

    @property
    def name(self) -> str:
        return self.fn.__name__

    @property
    def __signature__(self) -> inspect.Signature:  # what PDLL's prelude declares
        return inspect.signature(self.fn)

    def __call__(self, *values: Any) -> bool:
        return self.fn(*values)

    def why(self, w: Why) -> str:
        return self.explain(w) if self.explain is not None else _generic(self.name, w)


CONSTRAINTS: dict[str, Constraint] = {
    c.name: c
    for c in (
        Constraint(is_tensor, lambda w: w.not_tensor()),
        Constraint(is_float_tensor, _why_float),
        Constraint(has_dtype, _why_dtype),
        Constraint(has_rank, _why_rank),
        Constraint(dim_equals, _why_dim("is")),
        Constraint(dim_divisible_by, _why_dim("multiple")),
        Constraint(same_dims, _why_same_dims),
        Constraint(has_static_shape, _why_static),
        Constraint(same_dtype, _why_same_dtype),
        Constraint(is_constant, _says("is not a compile-time constant")),
        Constraint(is_none, _says("is not None")),
        Constraint(is_not_none, _says("is None")),
        Constraint(constant_equals, _why_equals),
        Constraint(same_constant, _why_same_constant),
        Constraint(single_use, _why_single_use),
        Constraint(distinct, lambda w: f"{w.who(0)} and {w.who(1)} are the same value"),
        Constraint(not_dequantized),
    )
}


def explain(name: str, values: list[Any], describe: Callable[[Any], str], names: list[str]) -> str:
    """Why native constraint ``name`` does not hold for ``values``, in user words. ``names``
    are the pattern's names for the values (``%w``), ``describe`` gives the graph's (an FX
    node name or a literal)."""

    def who(i: int) -> str:
        d = describe(values[i])
        return f"{names[i]} = {d}" if names[i] and names[i] != d else d

    c = CONSTRAINTS.get(name)
    w = Why(values, who)
    return c.why(w) if c is not None else _generic(name, w)


def adapt_constraint(
    name: str,
    fn: Callable[..., bool],
    on_fail: Callable[[str, list[Any]], None],
    on_error: Callable[[str, BaseException], None],
) -> Callable[[Any, Any, list[Any]], Any]:
    """Wrap a ``True``-when-it-holds predicate in MLIR's inverted convention (truthy = failure)."""

    fn = fn.fn if isinstance(fn, Constraint) else fn  # one call less per evaluation

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

"""Canonical forms: equivalent spellings of one computation become one before matching.

A pattern written once for ``aten.linear`` then matches every way a model spells a linear::

    before:  t = aten.t(w); mm = aten.mm(x, t); add = aten.add(mm, b)
    after:   linear = aten.linear(x, w, b)

It runs on the pre-dispatch FX graph, after the re-trace and before the MLIR import
(:func:`canonicalize`), and :func:`restore` runs after substitution. The rules are the
table :data:`RULES` (``before -> after``, in the order they apply). Each application is

* **exact** -- the canonical spelling computes bitwise the same numbers in eager mode (for
  example ``linear(x, w, b)`` on a 2-D input *is* ``addmm(b, x, w.t())`` in ATen), or
* **inexact** -- the same function, but ATen computes it another way (``linear`` with a
  bias runs one ``addmm``, where ``mm`` + ``add`` rounds the product before adding). An
  inexact rewrite is kept only where a substitution claimed it; :func:`restore` puts
  every unclaimed one back to an equivalent of the original spelling, so
  canonicalization never changes the numbers of what runs without a kernel.

A weight given pre-transposed (GPT-2's ``Conv1D``: ``addmm(b, x, w)`` with ``w`` of shape
``[in, out]``) becomes ``linear(x, aten.t(w), b)``: a view, never a copy, so the numbers
are exact and a kernel's pre-pack cache keys the view by its base parameter (stable across
calls). Only right-hand operands that come from a graph input or constant (a parameter,
possibly through views or a dequantize) count as weights: a product of two activations
stays a ``mm`` / ``matmul``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from pdlkit.matcher import canonical_int8 as int8
from pdlkit.matcher.fx_nodes import NOTE as _NOTE
from pdlkit.matcher.fx_nodes import arg as _arg
from pdlkit.matcher.fx_nodes import call as _call
from pdlkit.matcher.fx_nodes import is_call as _is
from pdlkit.matcher.fx_nodes import known_equal as _same
from pdlkit.matcher.fx_nodes import shape_is as _shape_is
from pdlkit.matcher.fx_nodes import value_of as _val

aten = torch.ops.aten


def _contiguous(t: torch.Tensor) -> bool:
    """Provably contiguous, without adding a guard on symbolic sizes."""
    from torch._prims_common import is_contiguous_or_false

    if all(type(d) is int for d in (*t.shape, *t.stride())):
        return bool(t.is_contiguous())  # static: no guard to fear, and 100x faster
    return bool(is_contiguous_or_false(t))


def _bias_ok(b: Any, out: Any) -> bool:
    """``b`` is a 1-D bias of the output's last dim and dtype (what ``linear`` adds)."""
    bv, ov = _val(b), _val(out)
    return (
        isinstance(bv, torch.Tensor)
        and isinstance(ov, torch.Tensor)
        and bv.dim() == 1
        and _same(bv.shape[0], ov.shape[-1])
        and bv.dtype == ov.dtype
    )


_TRANSPOSES = (aten.t.default, aten.numpy_T.default, aten.mT.default)
_VIEWISH = {*_TRANSPOSES, aten.transpose.int, aten.permute.default, aten.view.default}
_VIEWISH |= {aten.reshape.default, aten.contiguous.default, aten.clone.default}


def _is_weight(n: Any) -> bool:
    """A graph input or constant, possibly through views or a dequantize (PT2E weights)."""
    seen = 0
    while isinstance(n, fx.Node) and seen < 8:
        if n.op in ("placeholder", "get_attr"):
            return True
        if n.op != "call_function" or not n.args:
            return False
        name = getattr(n.target, "__name__", "")
        if n.target not in _VIEWISH and not name.startswith("dequantize_per_"):
            return False
        n, seen = n.args[0], seen + 1
    return False


def _untransposed(w: fx.Node) -> fx.Node | None:
    """``w`` if it is ``t(v)`` / ``transpose(v, 0, 1)`` / ``permute(v, [1, 0])`` of a 2-D ``v``: ``v``."""
    if not isinstance(w, fx.Node) or w.op != "call_function":
        return None
    src = w.args[0] if w.args else None
    if not isinstance(src, fx.Node) or not isinstance(_val(src), torch.Tensor):
        return None
    if _val(src).dim() != 2:
        return None
    dims: Any = (
        w.args[1:3] if w.target is aten.transpose.int else w.args[1] if len(w.args) > 1 else ()
    )
    if w.target in _TRANSPOSES:  # t(v), v.T, v.mT
        return src
    if w.target is aten.transpose.int and sorted(int(d) % 2 for d in dims) == [0, 1]:
        return src
    if w.target is aten.permute.default and [int(d) % 2 for d in dims] == [1, 0]:
        return src
    return None


# -- building nodes -----------------------------------------------------------------------------


def _transposed(v: Any) -> Any:
    """The fake value of ``t(v)`` for a static 2-D fake ``v``, built directly (a fake view
    op dispatches in about 2 ms); None when it has to be dispatched."""
    from torch._subclasses.fake_tensor import FakeTensor

    if not isinstance(v, FakeTensor) or not all(type(d) is int for d in (*v.shape, *v.stride())):
        return None
    meta = torch.empty_strided(
        (v.shape[1], v.shape[0]), (v.stride(1), v.stride(0)), dtype=v.dtype, device="meta"
    )
    return FakeTensor(v.fake_mode, meta, v.device)


def _weight_of(graph: fx.Graph, mat2: fx.Node, like: fx.Node) -> fx.Node | None:
    """The ``[out, in]`` weight whose transpose is ``mat2`` (``x @ mat2``), or None if
    ``mat2`` is no weight. A pre-transposed weight gets a ``t`` view, never a copy."""
    if not isinstance(mat2, fx.Node) or not _is_weight(mat2):
        return None
    v = _val(mat2)
    if not isinstance(v, torch.Tensor) or v.dim() != 2:
        return None
    w = _untransposed(mat2)
    if w is None:
        w = _call(graph, aten.t.default, (mat2,), like, val=_transposed(_val(mat2)))
    return w


def _linear(graph: fx.Graph, x: Any, w: Any, b: Any, like: fx.Node) -> fx.Node:
    """``linear(x, w, b)`` standing for ``like``, which computes the same tensor."""
    return _call(graph, aten.linear.default, (x, w, b), like, same=True)


# -- the rules ----------------------------------------------------------------------------------
# A rule's `apply(graph, node)` returns (replacement, exact) or None when it does not apply.

Applied = tuple[fx.Node, bool] | None


def _addmm(graph: fx.Graph, n: fx.Node) -> Applied:
    b, x, mat2 = n.args[:3]
    if _arg(n, 3, "beta") != 1 or _arg(n, 4, "alpha") != 1:
        return None
    if not isinstance(_val(x), torch.Tensor) or _val(x).dim() != 2 or not _bias_ok(b, n):
        return None
    w = _weight_of(graph, mat2, n)  # type: ignore[arg-type]
    return (_linear(graph, x, w, b, n), True) if w is not None else None


def _mm(graph: fx.Graph, n: fx.Node) -> Applied:
    x, mat2 = n.args[:2]
    w = _weight_of(graph, mat2, n)  # type: ignore[arg-type]
    return (_linear(graph, x, w, None, n), True) if w is not None else None


def _matmul(graph: fx.Graph, n: fx.Node) -> Applied:
    x, mat2 = n.args[:2]
    xv = _val(x)
    if not isinstance(xv, torch.Tensor) or xv.dim() < 2:
        return None
    return _mm(graph, n)


def _add_bias(graph: fx.Graph, n: fx.Node) -> Applied:
    if _arg(n, 2, "alpha") != 1:
        return None
    a, b = n.args[:2]
    if not _is(a, aten.linear.default):
        a, b = b, a
    if not _is(a, aten.linear.default) or len(a.users) != 1:  # type: ignore[union-attr]
        return None
    assert isinstance(a, fx.Node)
    x, w = a.args[:2]
    if _arg(a, 2, "bias") is not None or not _bias_ok(b, n):
        return None
    if not _shape_is(_val(n), tuple(_val(a).shape)):  # the add must not broadcast the product
        return None
    lin = _linear(graph, x, w, b, n)
    lin.meta[_NOTE] = "add_bias"
    return lin, False


def _flatten_linear(graph: fx.Graph, n: fx.Node) -> Applied:
    """reshape(linear(reshape(x, [-1, K]), w, b), [*x.shape[:-1], N]) -> linear(x, w, b);
    ``view`` in place of either ``reshape`` too."""
    lin = n.args[0]
    if not _is(lin, aten.linear.default) or len(lin.users) != 1:  # type: ignore[union-attr]
        return None
    assert isinstance(lin, fx.Node)
    flat, w, b = lin.args[0], lin.args[1], _arg(lin, 2, "bias")
    if not _is(flat, aten.view.default, aten.reshape.default):
        return None
    assert isinstance(flat, fx.Node)
    x = flat.args[0]
    xv, fv, out = _val(x), _val(flat), _val(n)
    if not isinstance(xv, torch.Tensor) or xv.dim() < 3 or fv.dim() != 2:
        return None
    if not _same(fv.shape[-1], xv.shape[-1]):
        return None
    if not _shape_is(out, (*xv.shape[:-1], _val(lin).shape[-1])):
        return None
    # ATen's linear with a bias flattens a contiguous 3-D input itself (one addmm); otherwise
    # it runs matmul + add, which rounds differently: no rewrite there.
    if b is not None and not (xv.dim() == 3 and _contiguous(xv)):
        return None
    new = _linear(graph, x, w, b, n)
    if _NOTE in lin.meta:  # an inexact bias add stays inexact, whatever shape it takes
        new.meta[_NOTE] = lin.meta[_NOTE]
        return new, False
    return new, True


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _scalar_side(n: Any, target: Any, value: float, tol: float = 0.0) -> Any:
    """For ``n = target(a, c)`` or ``target(c, a)`` with the number ``c`` within ``tol`` of
    ``value`` and ``n`` used once: ``(a, c)``; else None."""
    if not _is(n, target) or len(n.users) != 1:
        return None
    if target is aten.add.Tensor and _arg(n, 2, "alpha") != 1:
        return None
    a, b = n.args[:2]
    if isinstance(a, int | float) and not isinstance(a, bool):
        a, b = b, a
    if isinstance(b, int | float) and not isinstance(b, bool) and abs(b - value) <= tol:
        return a, b
    return None


def _gelu_tanh(graph: fx.Graph, n: fx.Node) -> Applied:
    """0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3))) -> gelu(x, 'tanh') (GPT-2's
    NewGELU); either operand order of each mul and add."""
    if len(n.args) < 2 or not all(isinstance(a, fx.Node) for a in n.args[:2]):
        return None
    for half, one in (n.args[:2], n.args[1::-1]):
        h = _scalar_side(half, aten.mul.Tensor, 0.5)
        o = _scalar_side(one, aten.add.Tensor, 1.0)
        if h is None or o is None or not _is(o[0], aten.tanh.default) or len(o[0].users) != 1:
            continue
        x = h[0]
        inner = _scalar_side(o[0].args[0], aten.mul.Tensor, _SQRT_2_OVER_PI, 1e-6)
        if inner is None or not _is(inner[0], aten.add.Tensor) or len(inner[0].users) != 1:
            continue
        s = inner[0]
        if _arg(s, 2, "alpha") != 1:
            continue
        cubic = s.args[1] if s.args[0] is x else s.args[0] if s.args[1] is x else None
        c = _scalar_side(cubic, aten.mul.Tensor, 0.044715, 1e-7)
        p = c[0] if c is not None else None
        if not (_is(p, aten.pow.Tensor_Scalar) and p.args[0] is x and p.args[1] == 3):  # type: ignore[union-attr]
            continue
        if len(p.users) != 1 or not isinstance(_val(x), torch.Tensor):  # type: ignore[union-attr]
            continue
        gelu = _call(graph, aten.gelu.default, (x,), n, same=True)
        gelu.kwargs = {"approximate": "tanh"}
        gelu.meta[_NOTE] = ("gelu_tanh", inner[1], c[1], p.args[1])  # type: ignore[union-attr]
        return gelu, False
    return None


def _view_as_reshape(graph: fx.Graph, n: fx.Node) -> Applied:
    # a view that is valid is exactly what reshape returns: the same alias of the same memory
    return _call(graph, aten.reshape.default, tuple(n.args[:2]), n, same=True), True


def _spell_defaults(graph: fx.Graph, n: fx.Node) -> Applied:
    """Every schema argument spelled: positional ones as args, keyword-only ones as kwargs."""
    schema = getattr(n.target, "_schema", None)
    if schema is None or any(
        a.alias_info is not None and a.alias_info.is_write for a in schema.arguments
    ):
        return None
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for i, a in enumerate(schema.arguments):
        if i < len(n.args):
            v = n.args[i]
        elif a.name in n.kwargs:
            v = n.kwargs[a.name]
        elif a.has_default_value():
            v = a.default_value
        else:
            return None  # malformed call: leave it to torch to complain
        if a.kwarg_only:
            kwargs[a.name] = v
        else:
            args.append(v)
    if tuple(args) == tuple(n.args) and kwargs == dict(n.kwargs):
        return None
    n.args, n.kwargs = tuple(args), kwargs
    return n, True


@dataclass(frozen=True)
class Rule:
    """One canonicalization: ``before -> after``, applied at nodes whose target is in ``at``."""

    name: str
    before: str
    after: str
    at: tuple[Any, ...]
    apply: Callable[[fx.Graph, fx.Node], Applied]
    exactness: str  # when the rewrite is bitwise exact in eager mode


RULES: tuple[Rule, ...] = (
    # spell_defaults:  gelu(x)  ->  gelu(x, approximate='none');  linear(x, w) -> linear(x, w, None)
    Rule("spell_defaults", "op(args...)", "op(all schema args)", (), _spell_defaults, "always"),
    # addmm:  addmm(b, x, t(w))  ->  linear(x, w, b);   addmm(b, x, w_io)  ->  linear(x, t(w_io), b)
    Rule("addmm", "addmm(b, x, t(w))", "linear(x, w, b)", (aten.addmm.default,), _addmm, "always"),
    # mm:  mm(x, t(w))  ->  linear(x, w, None);   mm(x, w_io)  ->  linear(x, t(w_io), None)
    Rule("mm", "mm(x, t(w))", "linear(x, w, None)", (aten.mm.default,), _mm, "always"),
    # matmul:  matmul(x, t(w))  ->  linear(x, w, None)      (x of rank >= 2, any leading dims)
    Rule("matmul", "matmul(x, t(w))", "linear(x, w, None)", (aten.matmul.default,), _matmul, "always"),
    # flatten_linear:  reshape(linear(reshape(x, [-1, K]), w, b), [*lead, N])  ->  linear(x, w, b)
    Rule(
        "flatten_linear",
        "reshape(linear(reshape(x, [-1, K]), w, b), [*lead, N])",
        "linear(x, w, b)",
        (aten.view.default, aten.reshape.default),
        _flatten_linear,
        "without bias, or a contiguous 3-D x",
    ),
    # view_as_reshape:  view(x, s)  ->  reshape(x, s)   (after flatten_linear: it reads both)
    Rule("view_as_reshape", "view(x, s)", "reshape(x, s)", (aten.view.default,), _view_as_reshape, "always"),
    # add_bias:  add(linear(x, w, None), b)  ->  linear(x, w, b)    (b: 1-D [N]; inexact, restored if unclaimed)
    Rule("add_bias", "add(linear(x, w, None), b)", "linear(x, w, b)", (aten.add.Tensor,), _add_bias, "never: restored unless a kernel claims it"),
    # gelu_tanh:  0.5*x * (1 + tanh(sqrt(2/pi) * (x + 0.044715*x**3)))  ->  gelu(x, approximate='tanh')
    Rule("gelu_tanh", "0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*x**3)))", "gelu(x, 'tanh')", (aten.mul.Tensor,), _gelu_tanh, "never: restored unless a kernel claims it"),
    # torchao's int8 linear (matcher/canonical_int8.py): out_dtype(aten.mm, int32, a, b) -> _int_mm(a, b)
    Rule("int_mm", "out_dtype(aten.mm, int32, a, b)", "_int_mm(a, b)", (torch.ops.higher_order.out_dtype,), int8.int_mm, "always"),
    # to_copy_as_to:  _to_copy(x, dtype=d) -> to(x, d)   (a dtype-only copy; after a rescaled int8 GEMM, cast first as below)
    Rule("to_copy_as_to", "_to_copy(x, dtype=d)", "to(x, d)", (aten._to_copy.default,), int8.to_copy_as_to, "always"),
    # int8_cast_first:  to(reshape(int8_rescale(...), s), d)  ->  reshape(to(int8_rescale(...), d), s)
    Rule("int8_cast_first", "to(reshape(rescaled, s), d)", "reshape(to(rescaled, d), s)", (aten.to.dtype,), int8.cast_first, "always"),
    # int8_bias_in_place:  add_(reshape(int8_rescale(...), s), b)  ->  reshape(add(int8_rescale(...), b), s)
    Rule("int8_bias_in_place", "add_(reshape(rescaled, s), b)", "reshape(add(rescaled, b), s)", (aten.add_.Tensor,), int8.bias_in_place, "always"),
    # int8_rescale:  mul(to(mul(_int_mm, expand(xs)), d), ws)  ->  mul(mul(to(_int_mm, f32), xs), ws)
    Rule("int8_rescale", "mul(to(mul(mm, expand(xs)), d), ws)", "mul(mul(to(mm, f32), xs), ws)", (aten.mul.Tensor,), int8.int8_rescale, "never: restored unless a kernel claims it"),
)  # fmt: skip


_OPS = (torch._ops.OpOverload, torch._ops.HigherOrderOperator)  # the calls rules look at


def describe_rules() -> str:
    """The rule table as text (``pdlkit`` docs and ``explain`` use it)."""
    w = max(len(r.before) for r in RULES)
    return "\n".join(
        f"{r.name:<16} {r.before:<{w}} -> {r.after}   [exact: {r.exactness}]" for r in RULES
    )


# -- the passes ---------------------------------------------------------------------------------


def canonicalize(gm: fx.GraphModule) -> Counter[str]:
    """Rewrite ``gm`` (pre-dispatch ATen with ``meta["val"]``) into canonical spellings, in
    place; returns how often each rule applied. Example::

        before: t = aten.t(w); addmm = aten.addmm(b, x, t)
        after:  linear = aten.linear(x, w, b)
    """
    graph = gm.graph
    by_target: dict[Any, list[Rule]] = {}
    for r in RULES:
        for t in r.at:  # spell_defaults (no targets) runs on every node first
            by_target.setdefault(t, []).append(r)
    fired: Counter[str] = Counter()
    for node in list(graph.nodes):  # topological: a rule sees its inputs already canonical
        if node.op != "call_function" or not isinstance(node.target, _OPS):
            continue
        if _spell_defaults(graph, node) is not None:
            fired["spell_defaults"] += 1
        for rule in by_target.get(node.target, ()):
            done = rule.apply(graph, node)
            if done is None:
                continue
            new, _exact = done
            node.replace_all_uses_with(new)
            _erase_dead(graph, node)
            fired[rule.name] += 1
            break
    if fired:
        graph.lint()
        gm.recompile()
    return fired


def _erase_dead(graph: fx.Graph, node: fx.Node) -> None:
    """Erase a replaced node (an in-place op too: its rule computes it functionally) and
    whatever only it used (the original spelling's views)."""
    stack = [node]
    while stack:
        n = stack.pop()
        if n.users or n.op != "call_function" or (n.is_impure() and n is not node):
            continue
        inputs = n.all_input_nodes
        graph.erase_node(n)
        stack.extend(inputs)


def restore(gm: fx.GraphModule) -> int:
    """Put back every inexact canonical node that no substitution claimed, as an equivalent
    of its original spelling (``linear(x, w, b)`` -> ``add(linear(x, w, None), b)``, which
    is bitwise ``add(mm(x, t(w)), b)``); returns how many."""
    graph = gm.graph
    n_restored = 0
    for node in list(graph.nodes):
        note = node.meta.get(_NOTE)
        if note == "add_bias" and node.target is aten.linear.default:
            x, w, b = node.args[:3]
            prod = _linear(graph, x, w, None, node)
            out = _call(graph, aten.add.Tensor, (prod, b), node, same=True)
        elif isinstance(note, tuple) and note[0] == "gelu_tanh":
            _, k, c, three = note
            out = _gelu_tanh_formula(graph, node.args[0], k, c, three, node)
        elif isinstance(note, tuple) and note[0] == "int8_rescale":
            out = int8.restore_rescale(graph, node, note)
        else:
            continue
        node.replace_all_uses_with(out)
        _erase_dead(graph, node)  # and the canonical nodes only it used
        n_restored += 1
    if n_restored:
        graph.lint()
        gm.recompile()
    return n_restored


def _gelu_tanh_formula(
    graph: fx.Graph, x: fx.Node, k: float, c: float, three: float, like: fx.Node
) -> fx.Node:
    """0.5*x * (1 + tanh(k * (x + c * x**three))) with the original constants, op for op as
    NewGELU writes it (the same numbers: each mul and add is commutative bitwise)."""
    mul, add = aten.mul.Tensor, aten.add.Tensor
    half = _call(graph, mul, (x, 0.5), like, same=True)
    cube = _call(graph, aten.pow.Tensor_Scalar, (x, three), like, same=True)
    inner = _call(graph, add, (x, _call(graph, mul, (cube, c), like, same=True)), like, same=True)
    th = _call(
        graph, aten.tanh.default, (_call(graph, mul, (inner, k), like, same=True),), like, same=True
    )
    return _call(graph, mul, (half, _call(graph, add, (th, 1.0), like, same=True)), like, same=True)


def weight_views(kernel: Any, args: list[Any]) -> tuple[int, ...]:
    """Kernel arguments that are a transpose (``t(w)``: canonical, or the user's ``w.T``) of a
    graph input or constant and that the kernel pre-packs. The call passes the weight itself
    and the call site takes the transpose as a view of it, so the pre-pack cache sees the
    parameter (stable identity, in-place updates noticed) where Inductor would make a fresh
    alias per call."""
    if kernel.prepack is None or kernel.prepack_arg not in kernel.params:
        return ()
    i = kernel.params.index(kernel.prepack_arg)
    a = args[i] if i < len(args) else None
    src = _untransposed(a) if isinstance(a, fx.Node) else None
    if src is not None and src.op in ("placeholder", "get_attr"):
        return (i,)
    return ()

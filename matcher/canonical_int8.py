"""Canonical forms for int8 GEMMs as torchao's tensor subclasses dispatch them.

A model quantized with ``torchao.quantization.quantize_(m, Int8DynamicActivationInt8WeightConfig())``
holds ``Int8Tensor`` weights. Desugared (pdlkit/distributed.py's ``desugar``: at the
pre-dispatch level for torchao's subclasses, else as AOT autograd traces), its linear is::

    s, zp = torchao.choose_qparams_affine(x, ...); q = torchao.quantize_affine(x, ..., s, zp, ...)
    mm = _int_mm(q, t(w))        # post-dispatch on CUDA: out_dtype(aten.mm, int32, q, t(w))
    y = to(mul(mm, expand(s, [M, N])), bf16)                  # the activation scale [M, 1]
    y = to(reshape(mul(y, flatten(ws)), shape), bf16)         # post-dispatch: _to_copy, reshape

Five rules of :data:`pdlkit.matcher.canonicalize.RULES` make it the form of
``pdlkit.quantization.int8_dynamic``, which the shipped CUDA patterns match (``int8_linear``,
the SiLU-gated pair, Q/K/V as one launch, the residual epilogues)::

    int_mm:          out_dtype(aten.mm, int32, a, b)      ->  _int_mm(a, b)                  exact
    to_copy_as_to:   _to_copy(x, dtype=d)                 ->  to(x, d)                       exact
    int8_rescale:    mul(to(mul(mm, expand(xs)), d), ws)  ->  mul(mul(to(mm, f32), xs), ws)
    int8_cast_first: to(reshape(rescaled, s), d)          ->  reshape(to(rescaled, d), s)   exact
    int8_bias_in_place: add_(reshape(rescaled, s), b)     ->  reshape(add(rescaled, b), s)  exact
                     (the same for torchao's weight-only linear, patterns/cuda/torchao_weight_only.pdl.mlir)

``int8_rescale`` is inexact: torchao rounds the accumulator times the activation scale to the
activation dtype ``d`` before the weight scale, which a kernel's float32 epilogue does not (a
difference of at most half a unit in the last place of ``d`` there). Like every inexact
rewrite it stays only where a kernel claims it; ``canonicalize.restore`` puts the rest back
(:func:`restore_rescale`). The activations' quantization itself (torchao's ops) is left to
Inductor.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
from pdlkit.matcher.fx_nodes import NOTE, call, is_call, known_equal, value_of

aten = torch.ops.aten
Applied = tuple[fx.Node, bool] | None
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def value_args(n: Any) -> tuple[Any, ...]:
    """The arguments of the node ``n`` (typed loosely: they are nodes or constants)."""
    assert isinstance(n, fx.Node)
    return n.args


def _tensor(n: Any, dtype: torch.dtype | None = None, rank: int | None = None) -> bool:
    v = value_of(n)
    return (
        isinstance(v, torch.Tensor)
        and (dtype is None or v.dtype == dtype)
        and (rank is None or v.dim() == rank)
    )


def int_mm(graph: fx.Graph, n: fx.Node) -> Applied:
    """``out_dtype(aten.mm.default, torch.int32, a, b)`` of two 2-D int8 tensors is
    ``_int_mm(a, b)``: what the higher-order op itself runs for them on CUDA, and the same
    int32 sums anywhere."""
    if len(n.args) != 4 or n.kwargs or n.args[0] is not aten.mm.default:
        return None
    if n.args[1] is not torch.int32:
        return None
    a, b = n.args[2:]
    if not (_tensor(a, torch.int8, 2) and _tensor(b, torch.int8, 2)):
        return None
    return call(graph, aten._int_mm.default, (a, b), n, same=True), True


def _plain_copy(n: fx.Node) -> torch.dtype | None:
    """The dtype of a ``_to_copy`` that changes only the dtype (no layout, device, pinning
    or memory format of its own), else None."""
    kw: dict[str, Any] = dict(n.kwargs)
    xv, dtype = value_of(n.args[0] if n.args else None), kw.get("dtype")
    if len(n.args) != 1 or not isinstance(xv, torch.Tensor) or not isinstance(dtype, torch.dtype):
        return None
    if dtype == xv.dtype:
        return None
    if kw.get("layout") not in (None, xv.layout) or kw.get("device") not in (None, xv.device):
        return None
    if kw.get("pin_memory") or kw.get("non_blocking"):
        return None
    if kw.get("memory_format") not in (None, torch.preserve_format):
        return None
    return dtype


def _to(graph: fx.Graph, x: Any, dtype: torch.dtype, like: fx.Node, same: bool) -> fx.Node:
    """``aten.to.dtype(x, dtype)`` with every argument spelled, as the patterns match it."""
    return call(graph, aten.to.dtype, (x, dtype, False, False, None), like, same=same)


def to_copy_as_to(graph: fx.Graph, n: fx.Node) -> Applied:
    """A dtype-only ``_to_copy`` (a subclass's or a decomposition's) is ``to(x, dtype)``, which
    a ``.to(dtype)`` in the model's code is."""
    dtype = _plain_copy(n)
    if dtype is None:
        return None
    return _cast_first(graph, n, dtype) or (_to(graph, n.args[0], dtype, n, same=True), True)


def cast_first(graph: fx.Graph, n: fx.Node) -> Applied:
    """``to(reshape(y, s), d)`` -> ``reshape(to(y, d), s)`` where ``y`` is a rescaled int8
    GEMM (an ``int8_rescale``): the cast is the kernel's last step, the reshape after it."""
    return _cast_first(graph, n, n.args[1]) if len(n.args) > 1 else None


def _rescaled(y: Any) -> bool:
    """Whether ``y`` is a rescaled int8 GEMM (``int8_rescale``), or its bias added
    (``int8_bias``)."""
    note = y.meta.get(NOTE) if isinstance(y, fx.Node) else None
    return isinstance(note, tuple) and note[0] in ("int8_rescale", "int8_bias")


def _weight_only(y: Any) -> bool:
    """Whether ``y`` is torchao's weight-only linear, ``mul(mm(x, to(t(w), d)), s)`` of an
    int8 ``w`` (patterns/cuda/torchao_weight_only.pdl.mlir)."""
    if not is_call(y, aten.mul.Tensor) or not is_call(y.args[0], aten.mm.default):
        return False
    wide = y.args[0].args[1]
    return (
        is_call(wide, aten.to.dtype)
        and is_call(wide.args[0], aten.t.default)
        and _tensor(wide.args[0].args[0], torch.int8, 2)
    )


def _cast_first(graph: fx.Graph, n: fx.Node, dtype: Any) -> Applied:
    x: Any = n.args[0]
    if _single(x, aten.reshape.default) is None or not isinstance(dtype, torch.dtype):
        return None
    y = x.args[0]
    if not _rescaled(y):
        return None
    inner = _to(graph, y, dtype, n, same=False)
    return call(graph, aten.reshape.default, (inner, x.args[1]), n, same=True), True


def _row_scale(e: Any, mm: fx.Node) -> Any:
    """The [M, 1] float32 activation scale that ``e`` is, or broadcasts from (``expand``)."""
    if is_call(e, aten.expand.default):
        e = e.args[0]
    v, mv = value_of(e), value_of(mm)
    if not _tensor(e, torch.float32, 2) or not isinstance(mv, torch.Tensor):
        return None
    return e if known_equal(v.shape[0], mv.shape[0]) and known_equal(v.shape[1], 1) else None


def _single(n: Any, target: Any) -> Any:
    """``n`` if it calls ``target`` and has one user, else None."""
    return n if is_call(n, target) and len(n.users) == 1 else None


def _hoist_weight_view(graph: fx.Graph, ws: Any) -> None:
    """Move ``reshape(s, [N])`` (or ``flatten(s)``) of a weight scale ``s`` (a graph input or
    constant) up to the graph's first op. torchao spells it just before each linear's
    rescale, so in Q, K, V it would come after Q's result is read, and a call replacing the
    three (``int8_linear3``) would have no place; a view of an input computes the same
    wherever it stands."""
    if not is_call(ws, aten.reshape.default, aten.view.default, aten.flatten.using_ints):
        return
    if not all(a.op in ("placeholder", "get_attr") for a in ws.all_input_nodes):
        return
    first = next(n for n in graph.nodes if n.op not in ("placeholder", "get_attr"))
    if first is not ws:
        first.prepend(ws)


def int8_rescale(graph: fx.Graph, n: fx.Node) -> Applied:
    """``mul(to(mul(mm, xs'), d), ws)`` -> ``mul(mul(to(mm, float32), xs), ws)``, where ``mm``
    is an ``_int_mm``, ``xs'`` the [M, 1] float32 activation scale (or its ``expand`` to
    [M, N]) and ``ws`` the weight's [N] float32 scale; ``to(..., d)`` may be absent (float32
    activations). Inexact (see the module's docstring)."""
    if len(n.args) != 2 or not _tensor(n.args[1], torch.float32, 1):
        return None
    c, ws = n.args
    rounded = _single(c, aten.to.dtype)
    if rounded is not None and rounded.args[1] not in _FLOATS:
        return None
    m = _single(rounded.args[0] if rounded is not None else c, aten.mul.Tensor)
    if m is None or len(m.args) != 2 or not is_call(m.args[0], aten._int_mm.default):
        return None
    mm, e = m.args
    xs = _row_scale(e, mm)
    if xs is None:
        return None
    _hoist_weight_view(graph, ws)
    acc = _to(graph, mm, torch.float32, n, same=False)
    scaled = call(graph, aten.mul.Tensor, (acc, xs), n, val=value_of(acc))
    out = call(graph, aten.mul.Tensor, (scaled, ws), n, same=True)
    expand = list(e.args[1]) if e is not xs else None
    out.meta[NOTE] = ("int8_rescale", rounded.args[1] if rounded is not None else None, expand)
    return out, False


def bias_in_place(graph: fx.Graph, n: fx.Node) -> Applied:
    """``add_(reshape(y, s), b)`` -> ``reshape(add(y, b), s)`` where ``y`` is a rescaled int8
    GEMM (or torchao's weight-only linear) that nothing else reads and ``b`` a bias of its
    last dimension: torchao adds the bias in place (``y += bias``) into a temporary, which no
    one sees mutated, so the functional add computes the same (where it keeps ``y``'s dtype,
    as the in-place add does); the reshape moves after it, as the cast does."""
    if len(n.args) != 2 or n.kwargs.get("alpha", 1) != 1:
        return None
    r: Any = _single(n.args[0], aten.reshape.default)
    if r is None or len(r.args[0].users) != 1:
        return None
    if not (_rescaled(r.args[0]) or _weight_only(r.args[0])):
        return None
    y, b = r.args[0], n.args[1]
    yv, bv = value_of(y), value_of(b)
    if not _tensor(b, rank=1) or torch.result_type(yv, bv) != yv.dtype:
        return None
    if not known_equal(bv.shape[0], yv.shape[-1]):  # then a valid add_ keeps it last
        return None
    added = call(graph, aten.add.Tensor, (y, b), n, val=yv)
    added.kwargs = {"alpha": 1}
    added.meta[NOTE] = ("int8_bias",)
    return call(graph, aten.reshape.default, (added, r.args[1]), n, same=True), True


def restore_rescale(graph: fx.Graph, node: fx.Node, note: tuple[Any, ...]) -> fx.Node:
    """torchao's spelling of an unclaimed ``int8_rescale`` node, ``mul(to(mul(mm, xs'), d),
    ws)``: the same numbers as before the rewrite."""
    _, dtype, expand = note
    scaled, ws = node.args
    acc, xs = value_args(scaled)
    if expand is not None:
        xs = call(graph, aten.expand.default, (xs, expand), node)
    out = call(graph, aten.mul.Tensor, (value_args(acc)[0], xs), node, val=value_of(scaled))
    if dtype is not None:
        out = _to(graph, out, dtype, node, same=False)
    return call(graph, aten.mul.Tensor, (out, ws), node, same=True)

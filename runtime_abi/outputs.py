"""What a kernel returns, checked: tensors of the shapes and dtypes its meta function
declares, sharing no memory with its inputs.

``check`` is the whole check, run on a call site's first calls and then every
``CHECK_EVERY``-th (see ``binding.py``); ``recheck`` compares shapes and dtypes alone and
runs on every other call that the one-comparison test against ``CallSite.expect`` does not
settle, so that a kernel whose output changes shape or dtype late is named at once, not
left to a later op (or an Inductor assert) to trip over.

Memory is compared by storage address ranges, not by ``Tensor._base``: a view made inside
a kernel that the dispatcher calls has no ``_base`` (it is made below autograd), and
``torch.from_numpy(x.numpy())`` or ``out.set_(x)`` share an input's memory without being
views of it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
from pdlkit.runtime_abi.kernel import KernelDecl

from pdlkit.errors import PdlkitError

# input signatures (shapes and dtypes) whose expected outputs a call site remembers; in a
# graph with dynamic shapes, a site that meets more leaves further shapes to the sampled
# calls' whole check (the meta function is too slow to run on every call)
CACHED_SIGNATURES = 256

Expected = list[tuple[torch.Size, torch.dtype]]


class KernelCallError(PdlkitError, RuntimeError):
    """A kernel failed or returned something its declaration does not allow."""


def as_list(out: Any) -> list[Any]:
    return list(out) if isinstance(out, tuple | list) else [out]


def meta_of(decl: KernelDecl, args: Sequence[Any]) -> Expected:
    meta_args = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in args]
    return [(t.shape, t.dtype) for t in as_list(decl.meta(*meta_args))]


def fmt(shapes: Sequence[tuple[Any, Any]]) -> str:
    return ", ".join(
        f"{list(s) if isinstance(s, tuple) else s} {str(d).removeprefix('torch.')}"
        for s, d in shapes
    )


def _where(cs: Any) -> str:
    return cs.where() if cs is not None else "a direct call"


def _expected(decl: KernelDecl, cs: Any, args: Sequence[Any], compute: bool) -> Expected | None:
    """The outputs the meta function declares for these arguments, cached per site by the
    tensors' shapes and dtypes (a site's other arguments are compile-time constants).
    None when not cached and ``compute`` is false."""
    if cs is None:
        return meta_of(decl, args)
    key = tuple([(a.shape, a.dtype) for a in args if isinstance(a, torch.Tensor)])
    expected: Expected | None = cs._expected.get(key)
    if expected is None and (compute or len(cs._expected) < CACHED_SIGNATURES):
        expected = meta_of(decl, args)
        if len(cs._expected) < CACHED_SIGNATURES:
            cs._expected[key] = expected
    return expected


def check(decl: KernelDecl, cs: Any, args: Sequence[Any], out: Any) -> None:
    """Raise :class:`KernelCallError`, naming the kernel and the call site, unless ``out`` is
    tensors of the declared shapes and dtypes that share no input's memory."""
    for k, t in enumerate(_compare(decl, cs, args, out, compute=True)):
        mine = _span(t)
        if mine is None:
            continue
        for i, a in _tensors(args):
            theirs = _span(a)
            if theirs is not None and _overlaps(mine, theirs) and t.device == a.device:
                name = decl.params[i] if i < len(decl.params) else f"#{i}"
                raise KernelCallError(
                    f"pdlkit kernel {decl.name!r} ({decl.source}) returned output {k} sharing "
                    f"memory with its input {name!r} at {_where(cs)}; kernels must return new "
                    "tensors (not an input, a view of one, or anything else over its memory)"
                )


def recheck(decl: KernelDecl, cs: Any, args: Sequence[Any], out: Any) -> None:
    """The per-call check of a call that ``CallSite.expect`` did not settle: shapes and
    dtypes, against the declaration cached for these input shapes (a shape the site has not
    cached while its cache is full is left to the sampled calls)."""
    key = tuple([(a.shape, a.dtype) for a in args if isinstance(a, torch.Tensor)])
    expected = cs._expected.get(key)
    if expected is not None and len(expected) == 1 and isinstance(out, torch.Tensor):
        shape, dtype = expected[0]  # the common case, in a graph with dynamic shapes
        if out.dtype is dtype and out.shape == shape:
            return
    _compare(decl, cs, args, out, compute=False)


def _compare(
    decl: KernelDecl, cs: Any, args: Sequence[Any], out: Any, compute: bool
) -> Sequence[torch.Tensor]:
    outs = out if isinstance(out, tuple | list) else (out,)
    for t in outs:
        if not isinstance(t, torch.Tensor):
            raise KernelCallError(
                f"pdlkit kernel {decl.name!r} ({decl.source}) returned {type(out).__name__} at "
                f"{_where(cs)}; it must return tensors"
            )
    expected = _expected(decl, cs, args, compute)
    if expected is None:
        return outs
    same = len(outs) == len(expected)
    for t, (shape, dtype) in zip(outs, expected, strict=False):
        same = same and t.dtype is dtype and t.shape == shape
    if not same:
        got = [(tuple(t.shape), t.dtype) for t in outs]
        raise KernelCallError(
            f"pdlkit kernel {decl.name!r} ({decl.source}) returned {fmt(got)} at "
            f"{_where(cs)}, but its meta function declares {fmt(expected)}"
        )
    if cs is not None and cs.static and len(expected) == 1:
        cs.expect = expected[0]  # what every later call is compared with (binding.py)
    return outs


def _span(t: torch.Tensor) -> tuple[int, int] | None:
    """The addresses a tensor's storage covers, or None (empty, meta, or no storage)."""
    if t.is_meta:
        return None
    try:
        storage = t.untyped_storage()
    except (RuntimeError, NotImplementedError):  # sparse, mkldnn, ...
        return None
    start = storage.data_ptr()
    return (start, start + storage.nbytes()) if start else None


def _tensors(args: Sequence[Any]) -> Iterator[tuple[int, torch.Tensor]]:
    """(argument index, tensor) of every tensor argument, lists of tensors included."""
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            yield i, a
        elif isinstance(a, list | tuple):
            yield from ((i, t) for t in a if isinstance(t, torch.Tensor))


def _overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def shared(out: torch.Tensor, args: Sequence[Any]) -> bool:
    """Whether ``out`` shares memory with a tensor among ``args``."""
    mine = _span(out)
    return mine is not None and any(
        (s := _span(a)) is not None and _overlaps(mine, s) and out.device == a.device
        for _, a in _tensors(args)
    )


def fresh(out: Any, args: Sequence[Any]) -> Any:
    """The fallback may return an input or a view of one; a custom op may not."""
    outs = [t.clone() if shared(t, args) else t for t in as_list(out)]
    return tuple(outs) if isinstance(out, tuple | list) else outs[0]

"""Calling a native kernel's ``run``: the packed ``pdlkit_call_frame`` (one buffer holding the
frame, its DLTensors, their shape / stride arrays and the error text) and, on the CPU, the
per-thread plans that make a call cost a key lookup, the outputs' allocation, a few data
pointers written and one foreign call.

A CPU call's plan is keyed by what the frame holds besides data pointers: each tensor's shape,
strides and dtype, and the attributes. A compiled call site passes the same constant objects
for its attributes in every call, so those are matched by identity with the thread's last call
first (by value, with ``-0.0`` and ``NaN`` told apart, otherwise).
"""

from __future__ import annotations

import ctypes
import struct
import weakref
from collections.abc import Sequence
from ctypes import c_int64
from dataclasses import dataclass
from operator import is_, itemgetter
from typing import Any

import torch
from pdlkit.runtime_abi.kernel import KernelUnsupported
from pdlkit.runtime_abi.native_abi import (
    _DEVICE_CODES,
    _DL_CODES,
    _DL_FMT,
    _ERROR_BYTES,
    _FRAME_FMT,
    KIND_FLOAT,
    KIND_INT_LIST,
    OK,
    STATUS_NAMES,
    UNSUPPORTED,
)
from pdlkit.runtime_abi.native_desc import _Spec
from pdlkit.runtime_abi.prepack import version_of

Shape = tuple[int, ...]
_COMPLEX = frozenset(d for d in vars(torch).values() if isinstance(d, torch.dtype) and d.is_complex)


class PackedWeight:
    """A weight packed by a native kernel's prepack hook (ABI 1.1): the bytes run() reads
    (1-D uint8, 64-byte aligned) and the logical shape and dtype meta() sees. Weakly
    referenceable, so that a compiled call site remembers it (binding.py's direct path);
    ``sys.getsizeof`` is the bytes, what the pre-pack cache counts."""

    __slots__ = ("__weakref__", "data", "dtype", "shape")

    def __init__(self, data: torch.Tensor, shape: Shape, dtype: torch.dtype) -> None:
        self.data, self.shape, self.dtype = data, shape, dtype

    def __sizeof__(self) -> int:
        return int(self.data.nbytes)

    def __repr__(self) -> str:
        return f"PackedWeight({self.data.nbytes} bytes of a {list(self.shape)} {self.dtype} weight)"


class _Site:
    """What one thread saw at a call site's last call (a site is a packed weight; kernels
    without one share a single record): per tensor parameter a weak reference to the object,
    its version, data pointer and (shape, strides, dtype); the attributes; the plan. Nothing is
    kept alive by it; a parameter that was another object at the previous call (the
    activations) is not referenced at all."""

    __slots__ = ("akey", "attrs", "metas", "objs", "plan", "ptrs", "ref", "vers", "volatile")

    def __init__(self, pw: Any, n: int) -> None:
        self.ref = weakref.ref(pw) if pw is not None else None
        self.objs: list[Any] = [_dead] * n  # weakref.ref, _dead or _absent
        self.vers, self.ptrs = [0] * n, [0] * n
        self.metas: list[Any] = [_UNSEEN] * n
        self.volatile = [False] * n
        self.attrs: tuple[Any, ...] | None = None
        self.akey: tuple[Any, ...] = ()
        self.plan: _Plan | None = None


_UNSEEN = object()


def _dead() -> object:
    """The reference of a parameter not seen yet, or not kept: no tensor is it."""
    return _UNSEEN


def _absent() -> None:
    """The reference of an absent optional tensor."""
    return None


class CpuCall:
    """``NativeKernel``'s CPU calls: ``self(args)`` runs the kernel through this thread's
    :class:`_Plan` for the call's shapes and attributes. (Building the frame per call cost
    25-30 us, 60-85 us with the interpreter's data cold after a large kernel.) A compiled call
    site passes the same constant tensors and attribute objects in every call: those are
    recognised by identity (and, for tensors, version and data pointer: an in-place resize,
    transpose or ``set_`` bumps the version) against the site's last call on this thread, and
    when nothing else changed either, the site's last plan is used without a lookup."""

    __slots__ = (
        "attrs_of", "check", "floats", "k", "lists", "local", "packed_at", "run", "spec",
        "tensor_at",
    )  # fmt: skip

    def __init__(self, k: Any) -> None:
        self.k, self.spec, self.run, self.local = k, k.spec, k.spec.run, k._local
        self.tensor_at = tuple(k.tensor_args)
        self.packed_at = k.packed_index
        # the tensor parameters to look at per call (the packed weight is the site itself)
        self.check = tuple((j, i) for j, i in enumerate(self.tensor_at) if i != self.packed_at)
        idx = [i for i, _ in k.attr_args]
        # the attributes in frame order, as one tuple (a C-level getter)
        self.attrs_of = (lambda a: ()) if not idx else _getter(idx)
        self.floats = tuple(j for j, (_, a) in enumerate(k.attr_args) if a.kind == KIND_FLOAT)
        self.lists = tuple(j for j, (_, a) in enumerate(k.attr_args) if a.kind == KIND_INT_LIST)

    def _attr_key(self, values: tuple[Any, ...]) -> tuple[Any, ...]:
        """The attributes as a plan key: lists as tuples, floats by their bits (-0.0 is not
        0.0 to a kernel; a NaN finds its own plan again)."""
        out = list(values)
        for j in self.floats:
            out[j] = float(out[j]).hex()
        for j in self.lists:
            out[j] = tuple(out[j])
        return tuple(out)

    def _site(self, args: Sequence[Any]) -> tuple[_Site, Sequence[Any]]:
        """This thread's record of the call site (and ``args`` with the weight packed)."""
        local, pw = self.local, None
        if self.packed_at is not None:
            pw = args[self.packed_at]
            if type(pw) is not PackedWeight:  # a direct call with the logical weight
                args = self.k._packed(args)
                pw = args[self.packed_at]
        try:
            sites = local.sites
        except AttributeError:
            sites = local.sites = {}
            local.plans = {}
        s = sites.get(id(pw))
        if s is None or (s.ref is not None and s.ref() is not pw):
            if len(sites) >= 512:
                sites.clear()
            s = sites[id(pw)] = _Site(pw, len(self.tensor_at))
            if pw is not None:
                self._seen(s, self.tensor_at.index(self.packed_at), pw, args)
        return s, args

    def __call__(self, args: Sequence[Any]) -> Any:
        s, args = self._site(args)
        objs, vers, ptrs = s.objs, s.vers, s.ptrs
        same = s.plan is not None
        for j, i in self.check:
            t = args[i]
            if objs[j]() is t and (
                t is None or (t._version == vers[j] and t.data_ptr() == ptrs[j])
            ):
                continue  # the same constant as at the site's last call
            same = self._seen(s, j, t, args) and same
        values = self.attrs_of(args)
        last = s.attrs
        if last is None or len(last) != len(values) or not all(map(is_, values, last)):
            s.attrs, akey = values, self._attr_key(values)
            same = same and akey == s.akey
            s.akey = akey
        plan = s.plan
        if not same or plan is None:
            plan = self._plan(s, args)
        words = plan.words
        for at, p in zip(plan.data_at, ptrs):  # noqa: B905 (the outputs' follow)
            words[at] = p
        spec = self.spec
        if plan.one is not None:  # one output
            out = torch.empty(plan.one[0], dtype=plan.one[1])
            words[plan.data_at[-1]] = out.data_ptr()
            status = self.run(plan.base)
            return out if status == OK else _result(spec, status, plan.buf, plan.layout, [out])
        outs = [torch.empty(s, dtype=dt) for s, dt in plan.outs]
        for at, o in zip(plan.data_at[len(ptrs) :], outs):  # noqa: B905
            words[at] = o.data_ptr()
        status = self.run(plan.base)
        return tuple(outs) if status == OK else _result(spec, status, plan.buf, plan.layout, outs)

    def _seen(self, s: _Site, j: int, t: Any, args: Sequence[Any]) -> bool:
        """Record tensor parameter ``j`` (``t``): whether its shape, strides and dtype are
        those of the last call."""
        last = s.objs[j]
        if last is not _dead and last() is not t:
            s.volatile[j] = True  # another object per call: not referenced any more
        elif not s.volatile[j] and t is not None and type(t) is not PackedWeight:
            s.volatile[j] = t.is_inference()  # no version: looked at on every call
        volatile = s.volatile[j]
        s.objs[j] = _dead if volatile else _absent if t is None else weakref.ref(t)
        if t is None:  # an absent optional tensor
            s.ptrs[j] = 0
            meta = None
        else:
            u = t.data if type(t) is PackedWeight else t
            if not u.is_cpu:
                where = ", ".join(str(a.device) for a in args if isinstance(a, torch.Tensor))
                raise KernelUnsupported(f"{self.spec.name} runs on cpu, got tensors on {where}")
            dt = u.dtype
            if dt in _COMPLEX and (u.is_conj() or u.is_neg()):  # lazy bits C would not see
                raise KernelUnsupported(f"{self.spec.name}: an input has a pending conj/neg bit")
            # packed bytes of one size come from weights of several shapes: a packed weight's
            # logical shape (which meta() reads) is part of the plan's key too
            meta = (u.shape, u.stride(), dt, (t.shape, t.dtype) if u is not t else None)
            s.ptrs[j] = u.data_ptr()
            # a version is compared only for a constant (``__call__``), never a volatile one
            s.vers[j] = version_of(t) if u is t and not volatile else 0
        same = meta == s.metas[j]
        s.metas[j] = meta
        return same

    def _plan(self, s: _Site, args: Sequence[Any]) -> _Plan:
        """The thread's plan for the site's current shapes and attributes (made on a miss)."""
        key = (*s.metas, s.akey)
        plans = self.local.plans
        plan = plans.get(key)
        if plan is None:
            if len(plans) >= 256:
                plans.clear()
            tensors = [args[i] for i in self.tensor_at]
            real = [t.data if type(t) is PackedWeight else t for t in tensors]
            plan = plans[key] = _Plan(self.k, tensors, real, args)
        s.plan = plan
        return plan


def _getter(idx: list[int]) -> Any:
    if len(idx) == 1:
        i = idx[0]
        return lambda a: (a[i],)
    return itemgetter(*idx)


class _Plan:
    """A CPU call frame made once per thread and call shape: the CallFrame, its DLTensors
    with their shape and stride arrays, the attributes and the workspace filled in; ``words``
    views the frame as 64-bit words, ``data_at`` indexes each DLTensor's data pointer."""

    __slots__ = ("base", "buf", "data_at", "keep", "layout", "one", "outs", "words")

    def __init__(self, k: Any, tensors: list[Any], real: list[Any], args: Sequence[Any]) -> None:
        self.outs = [(tuple(s), dt) for s, dt in k._meta_cached(tensors, args)]
        self.one = self.outs[0] if len(self.outs) == 1 else None
        outs = [torch.empty(s, dtype=dt) for s, dt in self.outs]  # for their strides only
        self.keep: list[Any] = []
        attrs = k._attrs(args, self.keep) if k.attr_args else None
        ws, ws_addr = k._workspace(torch.device("cpu")) if k.spec.workspace else (None, 0)
        self.keep.append(ws)
        every = real + outs
        self.buf, self.layout = _frame(k, every, len(real), attrs, torch.device("cpu"), 0, ws_addr)
        self.base = ctypes.addressof(self.buf)
        self.words = (c_int64 * (len(self.buf) // 8)).from_buffer(self.buf)
        self.data_at = [(_FRAME_SIZE + i * _DL_SIZE) // 8 for i in range(len(every))]


def _result(spec: _Spec, status: int, buf: Any, lay: _Layout, outs: list[torch.Tensor]) -> Any:
    if status == OK:
        return outs[0] if len(outs) == 1 else tuple(outs)
    raw = buf.raw[lay.err_at :]
    message = raw[: raw.find(b"\0")].decode(errors="replace")
    if status == UNSUPPORTED:
        raise KernelUnsupported(message or f"{spec.name} declined the call")
    raise RuntimeError(f"{spec.name}: {STATUS_NAMES.get(status, f'status {status}')}: {message}")


@dataclass(frozen=True)
class _Layout:
    """Where a CallFrame, its DLTensors, their shape/stride arrays and the error text lie."""

    packer: struct.Struct
    size: int
    ints_at: tuple[int, ...]  # per tensor: offset of its shape array (strides follow)
    err_at: int

    @staticmethod
    def of(dims: tuple[int, ...]) -> _Layout:
        frame, dl = struct.calcsize("@" + _FRAME_FMT), struct.calcsize("@" + _DL_FMT)
        pos, ints_at = frame + len(dims) * dl, []
        for nd in dims:
            ints_at.append(pos)
            pos += 16 * nd
        fmt = f"@{_FRAME_FMT}{_DL_FMT * len(dims)}{2 * sum(dims)}q"
        return _Layout(struct.Struct(fmt), pos + _ERROR_BYTES, tuple(ints_at), pos)


_LAYOUTS: dict[tuple[int, ...], _Layout] = {}
_FRAME_SIZE, _DL_SIZE = struct.calcsize("@" + _FRAME_FMT), struct.calcsize("@" + _DL_FMT)


def _frame(
    k: Any,
    every: list[Any],
    n_in: int,
    attrs: Any,
    device: torch.device,
    stream: int,
    workspace: int,
) -> tuple[Any, _Layout]:
    """One buffer holding a CallFrame, its DLTensors (inputs then outputs; None is an absent
    optional tensor), their shape/stride arrays and the error text, filled in."""
    spec = k.spec
    shapes = [() if t is None else t.shape for t in every]
    dims = tuple(map(len, shapes))
    lay = _LAYOUTS.get(dims)
    if lay is None:
        lay = _LAYOUTS.setdefault(dims, _Layout.of(dims))
    buf = ctypes.create_string_buffer(lay.size)
    base = ctypes.addressof(buf)
    values: list[Any] = [
        _FRAME_SIZE, spec.addr,
        base + _FRAME_SIZE, n_in, base + _FRAME_SIZE + n_in * _DL_SIZE, len(every) - n_in,
        ctypes.addressof(attrs) if attrs is not None else 0, len(k.attr_args),
        stream, workspace, spec.workspace if workspace else 0,
        base + lay.err_at, _ERROR_BYTES,
    ]  # fmt: skip
    ints: list[int] = []
    dev, index = _DEVICE_CODES.get(device.type, 0), device.index or 0
    for t, shape, nd, at in zip(every, shapes, dims, lay.ints_at, strict=True):
        if t is None:  # absent: data NULL, ndim 0, dtype {0, 0, 0}
            values += (0, dev, index, 0, 0, 0, 0, base + at, base + at, 0)
            continue
        code, bits = _DL_CODES.get(t.dtype) or _no_code(t.dtype)
        values += (t.data_ptr(), dev, index, nd, code, bits, 1, base + at, base + at + 8 * nd, 0)
        ints += (*shape, *t.stride())
    lay.packer.pack_into(buf, 0, *values, *ints)
    return buf, lay


def _no_code(dt: torch.dtype) -> tuple[int, int]:
    raise KernelUnsupported(f"dtype {dt} has no DLPack code")

"""Native kernel libraries: ``*.so`` files built against ``include/pdlkit_abi.h``, loaded with ctypes.

:func:`load_native_library` opens a library, calls its ``pdlkit_register``, refuses another
ABI major, validates every descriptor (names, dtypes, ISA features, shape rules, traits) and
turns each into a :class:`KernelDecl` whose function converts torch tensors to DLTensors,
preallocates the outputs from the kernel's C meta function and calls its ``run``. The
registry then binds it like any Python kernel; status UNSUPPORTED becomes
:class:`KernelUnsupported` (per-call fallback), any other failure a ``RuntimeError``.

Libraries are never unloaded: descriptors and function pointers point into them. A library
is opened from the bytes that were hashed (and checked against a pin), never from its path
again (:func:`pdlkit.runtime_abi.dlopen.open_library`).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Mapping, Sequence
from ctypes import POINTER, c_int64
from typing import Any

import torch
from pdlkit.runtime_abi.kernel import (
    KernelUnsupported,
)
from pdlkit.runtime_abi.native_abi import (
    _DEVICE_CODES,
    _DL_CODES,
    _DTYPES,
    _ERROR_BYTES,
    KIND_FLOAT,
    KIND_INT,
    KIND_INT_LIST,
    KIND_STRING,
    KIND_TENSOR,
    MAX_NDIM,
    OK,
    STATUS_NAMES,
    UNSUPPORTED,
    Attribute,
    DLDataType,
    DLDevice,
    DLTensor,
    MetaFrame,
    PrepackFrame,
)
from pdlkit.runtime_abi.native_desc import (
    _Arg,
    _Spec,
)
from pdlkit.runtime_abi.native_frame import CpuCall, PackedWeight, _frame, _result

__all__ = ["NativeKernel", "PackedWeight"]

# -- calling ----------------------------------------------------------------------------------------


def _dl_dtype(dt: torch.dtype) -> DLDataType:
    code = _DL_CODES.get(dt)
    if code is None:
        raise KernelUnsupported(f"dtype {dt} has no DLPack code")
    return DLDataType(code[0], code[1], 1)


def _torch_dtype(d: DLDataType, kernel: str) -> torch.dtype:
    dt = _DTYPES.get((d.code, d.bits))
    if dt is None or d.lanes != 1:
        raise RuntimeError(
            f"{kernel}: meta gave an unknown dtype (code={d.code}, bits={d.bits}, lanes={d.lanes})"
        )
    return dt


Shape = tuple[int, ...]


def _logical(t: Any) -> tuple[Any, torch.dtype] | None:
    """(shape, dtype) that meta() sees for one tensor parameter; None when absent."""
    if t is None:
        return None
    return t.shape, t.dtype  # torch.Size hashes and compares as the tuple it is


def _cpu_dl(t: torch.Tensor, keep: list[Any]) -> DLTensor:
    """A DLTensor over a contiguous CPU tensor (``keep`` holds it and its shape arrays)."""
    shape = (c_int64 * t.dim())(*t.shape)
    strides = (c_int64 * t.dim())(*t.stride())
    keep += (t, shape, strides)
    return DLTensor(
        data=t.data_ptr(),
        device=DLDevice(_DEVICE_CODES["cpu"], 0),
        ndim=t.dim(),
        dtype=_dl_dtype(t.dtype),
        shape=shape,
        strides=strides,
    )


class NativeKernel:
    """The Python side of one native kernel: meta (real, meta or fake tensors) and calls."""

    def __init__(self, spec: _Spec):
        self.spec = spec
        self.tensor_args = [i for i, a in enumerate(spec.args) if a.kind == KIND_TENSOR]
        self.attr_args = sorted(
            ((i, a) for i, a in enumerate(spec.args) if a.kind != KIND_TENSOR),
            key=lambda ia: ia[1].name.encode(),  # strcmp order
        )
        self._meta_cache: dict[Any, list[tuple[Shape, torch.dtype]]] = {}
        self._local = threading.local()  # per thread: a reusable CPU workspace
        names = [a.name for a in spec.args]
        self.packed_index = names.index(spec.prepack_arg) if spec.prepack_arg else None
        self.cpu = CpuCall(self)  # the CPU calls (native_frame.py)

    # attributes ----------------------------------------------------------------------------
    def _attrs(self, args: Sequence[Any], keep: list[Any]) -> Any:
        n = len(self.attr_args)
        ptrs = (POINTER(Attribute) * n)()
        for j, (i, a) in enumerate(self.attr_args):
            v = args[i]
            at = Attribute(struct_size=ctypes.sizeof(Attribute), name=a.name.encode(), kind=a.kind)
            if a.kind == KIND_INT:
                at.i = int(v)
            elif a.kind == KIND_FLOAT:
                at.f = float(v)
            elif a.kind == KIND_STRING:
                raw = str(v).encode()
                at.s, at.s_size = raw, len(raw)
                keep.append(raw)
            else:
                ints = (c_int64 * len(v))(*map(int, v))
                at.ints, at.num_ints = ints, len(v)
                keep.append(ints)
            keep.append(at)
            ptrs[j] = ctypes.pointer(at)
        keep.append(ptrs)
        return ptrs

    # meta ----------------------------------------------------------------------------------
    def _meta_c(
        self,
        shapes: Sequence[Shape | None],
        dtypes: Sequence[torch.dtype | None],
        args: Sequence[Any],
    ) -> list[tuple[Shape, torch.dtype]]:
        """Ask the C meta function: concrete input shapes -> output (shape, dtype)s.
        A shape of None is an absent optional tensor."""
        spec, keep = self.spec, list[Any]()
        inputs = (DLTensor * len(shapes))()
        for dl, shape, dt in zip(inputs, shapes, dtypes, strict=True):
            if shape is None or dt is None:  # absent: data NULL, ndim 0, dtype {0, 0, 0}
                continue
            buf = (c_int64 * len(shape))(*shape)
            keep.append(buf)
            dl.ndim, dl.shape, dl.dtype = len(shape), buf, _dl_dtype(dt)
            dl.device = DLDevice(_DEVICE_CODES[spec.device], 0)
        outs = (DLTensor * spec.num_outputs)()
        bufs = [(c_int64 * MAX_NDIM)() for _ in outs]
        for o, b in zip(outs, bufs, strict=True):
            o.shape = b
        attrs = self._attrs(args, keep)
        err = ctypes.create_string_buffer(_ERROR_BYTES)
        frame = MetaFrame(
            struct_size=ctypes.sizeof(MetaFrame),
            kernel=spec.addr,
            inputs=inputs,
            num_inputs=len(shapes),
            attrs=attrs,
            num_attrs=len(self.attr_args),
            outputs=outs,
            num_outputs=len(outs),
            max_ndim=MAX_NDIM,
            error=ctypes.addressof(err),
            error_size=_ERROR_BYTES,
        )
        status = spec.meta(ctypes.byref(frame))
        if status != OK:
            raise RuntimeError(
                f"{spec.name}: meta: {STATUS_NAMES.get(status, status)}: "
                f"{err.value.decode(errors='replace')}"
            )
        result = []
        for o, b in zip(outs, bufs, strict=True):
            if not 0 <= o.ndim <= MAX_NDIM:
                raise RuntimeError(f"{spec.name}: meta gave ndim {o.ndim}")
            result.append((tuple(b[: o.ndim]), _torch_dtype(o.dtype, spec.name)))
        return result

    def _meta_cached(
        self, tensors: Sequence[Any], args: Sequence[Any]
    ) -> list[tuple[Shape, torch.dtype]]:
        views = [_logical(t) for t in tensors]
        key: tuple[Any, ...] = tuple(views)
        if self.attr_args:
            key += tuple(
                tuple(args[i]) if a.kind == KIND_INT_LIST else args[i] for i, a in self.attr_args
            )
        hit = self._meta_cache.get(key)
        if hit is None:
            hit = self._meta_c(
                [v[0] if v else None for v in views], [v[1] if v else None for v in views], args
            )
            if len(self._meta_cache) >= 1024:
                self._meta_cache.clear()
            self._meta_cache[key] = hit
        return hit

    def meta(self, *args: Any) -> Any:
        """Empty outputs like the kernel's, for real, meta or fake (also symbolic) tensors."""
        tensors = [args[i] for i in self.tensor_args]
        present = [t for t in tensors if t is not None]
        symbolic = any(
            isinstance(v, torch.SymInt)
            for v in (*[d for t in present for d in t.shape], *_ints(args, self.attr_args))
        )
        if symbolic:
            outs: list[tuple[Sequence[Any], torch.dtype]] = list(_symbolic_meta(self, args))
        else:
            outs = list(self._meta_cached(tensors, args))
        if present:
            made = [present[0].new_empty(tuple(s), dtype=dt) for s, dt in outs]
        else:
            made = [torch.empty(tuple(s), dtype=dt, device=self.spec.device) for s, dt in outs]
        return made[0] if len(made) == 1 else tuple(made)

    # call ----------------------------------------------------------------------------------
    def _workspace(self, device: torch.device) -> tuple[Any, int]:
        """A buffer of the declared size, 64-byte aligned as the header promises.

        CPU: one per thread, reused (run() returns before the next call on this thread).
        CUDA: fresh from the caching allocator, ordered on the current stream.
        """
        size = self.spec.workspace
        ws = getattr(self._local, "ws", None) if device.type == "cpu" else None
        if ws is None:
            ws = torch.empty(size + 64, dtype=torch.uint8, device=device)
            if device.type == "cpu":
                self._local.ws = ws
        return ws, (ws.data_ptr() + 63) & ~63

    # prepack (ABI 1.1) ---------------------------------------------------------------------
    def prepack(self, weight: torch.Tensor, attrs: Mapping[str, Any]) -> PackedWeight:
        """Pack a constant weight with the kernel's prepack hook (size query, then fill)."""
        spec, keep = self.spec, list[Any]()
        if weight.device.type != "cpu":
            raise KernelUnsupported(f"{spec.name}: prepack takes CPU weights")
        w = weight.contiguous()
        dl = _cpu_dl(w, keep)
        with_ = [attrs[n] for n in spec.prepack_with]  # ABI 1.2: packed together with w
        if any(not isinstance(t, torch.Tensor) or t.device.type != "cpu" for t in with_):
            raise KernelUnsupported(f"{spec.name}: prepack_with takes CPU tensors")
        with_dl = (DLTensor * len(with_))(*(_cpu_dl(t.contiguous(), keep) for t in with_))
        # attributes the caller did not pass read as zero / empty
        empty = {KIND_INT: 0, KIND_FLOAT: 0.0, KIND_STRING: "", KIND_INT_LIST: []}
        args = [attrs.get(a.name, empty.get(a.kind)) for a in spec.args]
        err = ctypes.create_string_buffer(_ERROR_BYTES)
        frame = PrepackFrame(
            struct_size=ctypes.sizeof(PrepackFrame),
            kernel=spec.addr,
            weight=ctypes.pointer(dl),
            attrs=self._attrs(args, keep) if self.attr_args else None,
            num_attrs=len(self.attr_args),
            error=ctypes.addressof(err),
            error_size=_ERROR_BYTES,
            with_=with_dl if with_ else None,
            num_with=len(with_),
        )

        def step(what: str) -> None:
            status = spec.prepack(ctypes.byref(frame))
            if status == UNSUPPORTED:
                raise KernelUnsupported(
                    f"{spec.name}: prepack: {err.value.decode(errors='replace')}"
                )
            if status != OK:
                raise RuntimeError(
                    f"{spec.name}: prepack ({what}): {STATUS_NAMES.get(status, status)}: "
                    f"{err.value.decode(errors='replace')}"
                )

        step("size query")
        size = int(frame.packed_size)
        raw = torch.empty(size + 64, dtype=torch.uint8)
        start = -raw.data_ptr() % 64
        data = raw[start : start + size]
        frame.packed = data.data_ptr()
        step("fill")
        del keep
        return PackedWeight(data, tuple(w.shape), w.dtype)

    def _packed(self, args: Sequence[Any]) -> Sequence[Any]:
        """``args`` with the prepack argument packed, for calls that bypass the cache."""
        i = self.packed_index
        if i is None or not isinstance(args[i], torch.Tensor):
            return args
        attrs = {
            a.name: args[j]
            for j, a in enumerate(self.spec.args)
            if a.kind != KIND_TENSOR or a.name in self.spec.prepack_with
        }
        out = list(args)
        out[i] = self.prepack(args[i], attrs)
        return out

    def __call__(self, args: Sequence[Any]) -> Any:
        spec = self.spec
        if spec.device == "cpu":
            return self.cpu(args)
        args = self._packed(args)
        tensors = [args[i] for i in self.tensor_args]
        inputs = [t.data if isinstance(t, PackedWeight) else t for t in tensors]
        real = [t for t in inputs if t is not None]
        device = real[0].device if real else torch.device(spec.device)
        if device.type != spec.device or any(t.device != device for t in real[1:]):
            where = ", ".join(str(t.device) for t in real)
            raise KernelUnsupported(f"{spec.name} runs on {spec.device}, got tensors on {where}")
        if any(t.is_conj() or t.is_neg() for t in real):  # lazy bits C would not see
            raise KernelUnsupported(f"{spec.name}: an input has a pending conj/neg bit")
        outs = [
            torch.empty(s, dtype=dt, device=device) for s, dt in self._meta_cached(tensors, args)
        ]
        keep: list[Any] = []
        attrs = self._attrs(args, keep) if self.attr_args else None
        workspace, ws_addr = self._workspace(device) if spec.workspace else (None, 0)
        stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
        buf, lay = _frame(self, inputs + outs, len(inputs), attrs, device, stream, ws_addr)
        status = spec.run(ctypes.addressof(buf))
        del workspace, keep
        return _result(spec, status, buf, lay, outs)


def _ints(args: Sequence[Any], attr_args: Sequence[tuple[int, _Arg]]) -> list[Any]:
    out: list[Any] = []
    for i, a in attr_args:
        if a.kind == KIND_INT:
            out.append(args[i])
        elif a.kind == KIND_INT_LIST:
            out.extend(args[i])
    return out


def _symbolic_meta(k: NativeKernel, args: Sequence[Any]) -> list[tuple[list[Any], torch.dtype]]:
    """Meta for symbolic sizes: C sees only numbers, so probe it.

    Call meta at the sizes' hints, then once per symbol with that symbol doubled (doubling
    keeps every divisibility rule). An output dim whose values follow one input size across
    the probes is that size (the same SymInt); one that never moves is a constant.
    """
    import sympy

    tensors = [args[i] for i in k.tensor_args]
    slots: list[Any] = [d for t in tensors if t is not None for d in t.shape]
    slots += _ints(args, k.attr_args)
    exprs = [v.node.expr if isinstance(v, torch.SymInt) else sympy.Integer(int(v)) for v in slots]
    symbols = sorted(set().union(*(e.free_symbols for e in exprs)), key=str)
    hints: dict[Any, int] = {}
    for v in slots:
        if isinstance(v, torch.SymInt):
            for s in v.node.expr.free_symbols:
                if s not in hints:
                    env = v.node.shape_env
                    table = (
                        env.backed_var_to_val
                        if hasattr(env, "backed_var_to_val")
                        else env.var_to_val
                    )
                    hint = table.get(s)
                    if hint is None:
                        raise RuntimeError(
                            f"{k.spec.name}: meta cannot size an output from the data-dependent "
                            f"size {s}"
                        )
                    hints[s] = int(hint)
    probes = [hints] + [{**hints, s: 2 * hints[s]} for s in symbols]
    values: list[list[int]] = []  # per probe: every slot's value
    results = []
    for assign in probes:
        vals = [int(e.xreplace(assign)) for e in exprs]
        values.append(vals)
        shapes: list[Shape | None] = []
        pos = 0
        for t in tensors:
            if t is None:
                shapes.append(None)
                continue
            shapes.append(tuple(vals[pos : pos + t.dim()]))
            pos += t.dim()
        rebuilt = _rebuild_args(args, k, vals[pos:])
        dtypes = [None if t is None else t.dtype for t in tensors]
        try:
            results.append(k._meta_c(shapes, dtypes, rebuilt))
        except RuntimeError as e:
            raise RuntimeError(f"{e} (probing symbolic sizes {assign})") from None
    outs = []
    for j, (shape0, dtype) in enumerate(results[0]):
        dims: list[Any] = []
        for d in range(len(shape0)):
            track = [r[j][0][d] if d < len(r[j][0]) else None for r in results]
            if all(v == track[0] for v in track):
                dims.append(track[0])
                continue
            match = next(
                (slots[s] for s in range(len(slots)) if [v[s] for v in values] == track), None
            )
            if match is None:
                raise RuntimeError(
                    f"{k.spec.name}: output {j} dim {d} is not a constant or an input size; "
                    "with dynamic shapes each output size must be one of those"
                )
            dims.append(match)
        outs.append((dims, dtype))
    return outs


def _rebuild_args(args: Sequence[Any], k: NativeKernel, ints: list[int]) -> list[Any]:
    """``args`` with their int attributes replaced by probe values (in :func:`_ints` order)."""
    out = list(args)
    it = iter(ints)
    for i, a in k.attr_args:
        if a.kind == KIND_INT:
            out[i] = next(it)
        elif a.kind == KIND_INT_LIST:
            out[i] = [next(it) for _ in args[i]]
    return out

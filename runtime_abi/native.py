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
import hashlib
import inspect
import keyword
import struct
import threading
from collections.abc import Mapping, Sequence
from ctypes import POINTER, c_char_p, c_double, c_int32, c_int64, c_size_t, c_uint32, c_void_p
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Optional

import torch
from pdlkit.runtime_abi.dlopen import open_library
from pdlkit.runtime_abi.kernel import (
    FEATURES,
    KernelDecl,
    KernelDeclarationError,
    KernelUnsupported,
    declare,
)

from pdlkit.errors import KernelLoadError

ABI_MAJOR, ABI_MINOR = 1, 1
HEADER = Path(__file__).resolve().parent / "include" / "pdlkit_abi.h"
REGISTER_SYMBOL = "pdlkit_register"
MAX_NDIM = 64  # the shape buffer meta() may fill per output
_ERROR_BYTES = 1024

OK, UNSUPPORTED, INVALID_ARGUMENT, INTERNAL = 0, 1, 2, 3
STATUS_NAMES = {
    OK: "OK",
    UNSUPPORTED: "UNSUPPORTED",
    INVALID_ARGUMENT: "INVALID_ARGUMENT",
    INTERNAL: "INTERNAL",
}
KIND_TENSOR, KIND_INT, KIND_FLOAT, KIND_STRING, KIND_INT_LIST, KIND_DENSE_TENSOR = range(1, 7)
_KIND_TYPES: dict[int, Any] = {
    KIND_TENSOR: torch.Tensor,
    KIND_INT: int,
    KIND_FLOAT: float,
    KIND_STRING: str,
    KIND_INT_LIST: list[int],
}
_TRAIT_BITS = {1 << 0: "deterministic", 1 << 1: "inplace", 1 << 2: "graph_capture_safe"}
_DEVICES = {1: "cpu", 2: "cuda"}  # kDLCPU, kDLCUDA
_DEVICE_CODES = {v: k for k, v in _DEVICES.items()}

# (DLDataTypeCode, bits) <-> torch dtype; the codes are DLPack 1.x's (checked against torch's
# own to_dlpack in the tests).
_DTYPES: dict[tuple[int, int], torch.dtype] = {
    (0, 8): torch.int8,
    (0, 16): torch.int16,
    (0, 32): torch.int32,
    (0, 64): torch.int64,
    (1, 8): torch.uint8,
    (1, 16): torch.uint16,
    (1, 32): torch.uint32,
    (1, 64): torch.uint64,
    (2, 16): torch.float16,
    (2, 32): torch.float32,
    (2, 64): torch.float64,
    (4, 16): torch.bfloat16,
    (5, 64): torch.complex64,
    (5, 128): torch.complex128,
    (6, 8): torch.bool,
    (10, 8): torch.float8_e4m3fn,
    (11, 8): torch.float8_e4m3fnuz,
    (12, 8): torch.float8_e5m2,
    (13, 8): torch.float8_e5m2fnuz,
    (14, 8): torch.float8_e8m0fnu,
}
_DL_CODES = {v: k for k, v in _DTYPES.items()}


# -- the header's structs, field for field ----------------------------------------------------


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", c_void_p),
        ("device", DLDevice),
        ("ndim", c_int32),
        ("dtype", DLDataType),
        ("shape", POINTER(c_int64)),
        ("strides", POINTER(c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class Attribute(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("name", c_char_p),
        ("kind", c_int32),
        ("i", c_int64),
        ("f", c_double),
        ("s", c_char_p),
        ("s_size", c_size_t),
        ("ints", POINTER(c_int64)),
        ("num_ints", c_size_t),
        ("tensor", POINTER(DLTensor)),
    ]


class MetaFrame(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("kernel", c_void_p),
        ("inputs", POINTER(DLTensor)),
        ("num_inputs", c_size_t),
        ("attrs", POINTER(POINTER(Attribute))),
        ("num_attrs", c_size_t),
        ("outputs", POINTER(DLTensor)),
        ("num_outputs", c_size_t),
        ("max_ndim", c_int32),
        ("error", c_void_p),
        ("error_size", c_size_t),
    ]


class CallFrame(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("kernel", c_void_p),
        ("inputs", POINTER(DLTensor)),
        ("num_inputs", c_size_t),
        ("outputs", POINTER(DLTensor)),
        ("num_outputs", c_size_t),
        ("attrs", POINTER(POINTER(Attribute))),
        ("num_attrs", c_size_t),
        ("stream", c_void_p),
        ("workspace", c_void_p),
        ("workspace_size", c_size_t),
        ("error", c_void_p),
        ("error_size", c_size_t),
    ]


class ArgDesc(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("name", c_char_p),
        ("kind", c_int32),
        ("dtypes", POINTER(DLDataType)),
        ("num_dtypes", c_size_t),
        ("ranks", POINTER(c_int32)),
        ("num_ranks", c_size_t),
        ("divisible_dims", POINTER(c_int32)),
        ("divisible_by", POINTER(c_int64)),
        ("num_divisible", c_size_t),
        ("contiguous", c_int32),
        ("alignment", c_uint32),
        ("optional", c_int32),  # ABI 1.1
    ]


class KernelDesc(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("name", c_char_p),
        ("version", c_int32),
        ("op", c_char_p),
        ("device_type", c_int32),
        ("priority", c_int32),
        ("args", c_void_p),  # stepped through by each element's struct_size
        ("num_args", c_size_t),
        ("isa", POINTER(c_char_p)),
        ("num_isa", c_size_t),
        ("workspace_size", c_size_t),
        ("traits", ctypes.c_uint64),
        ("num_outputs", c_size_t),
        ("meta", c_void_p),
        ("run", c_void_p),
        ("doc", c_char_p),
        ("prepack_arg", c_char_p),  # ABI 1.1
        ("prepack", c_void_p),  # ABI 1.1
    ]


class PrepackFrame(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("kernel", c_void_p),
        ("weight", POINTER(DLTensor)),
        ("attrs", POINTER(POINTER(Attribute))),
        ("num_attrs", c_size_t),
        ("packed", c_void_p),
        ("packed_size", c_size_t),
        ("error", c_void_p),
        ("error_size", c_size_t),
    ]


class Registration(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("abi_major", c_uint32),
        ("abi_minor", c_uint32),
        ("kernels", POINTER(c_void_p)),
        ("num_kernels", c_size_t),
    ]


_META_FN = ctypes.CFUNCTYPE(c_int32, POINTER(MetaFrame))
_RUN_FN = ctypes.CFUNCTYPE(c_int32, c_void_p)  # takes the address of a packed CallFrame
_PREPACK_FN = ctypes.CFUNCTYPE(c_int32, POINTER(PrepackFrame))

# The size of each descriptor struct in ABI 1.0: a 1.0 library's structs end there, and the
# fields appended since read as zero.
_V10_SIZE: dict[type, int] = {
    ArgDesc: ArgDesc.optional.offset,
    KernelDesc: KernelDesc.prepack_arg.offset,
}

# run() frames are packed with struct.pack_into (filling ctypes fields one by one costs
# ~15 us per tensor); these formats are checked against the ctypes layouts above.
_FRAME_FMT = "NPPNPNPNPPNPN"
_DL_FMT = "PiiiBBHPPQ"
assert struct.calcsize("@" + _FRAME_FMT) == ctypes.sizeof(CallFrame)
assert struct.calcsize("@" + _DL_FMT) == ctypes.sizeof(DLTensor)

# -- reading the library's descriptors ---------------------------------------------------------


def _read_struct(cls: type[ctypes.Structure], addr: int, what: str) -> ctypes.Structure:
    """Copy a library struct into a zeroed host struct: fields past its struct_size read as 0."""
    if not addr:
        raise ValueError(f"{what} is a NULL pointer")
    size = c_size_t.from_address(addr).value
    host = ctypes.sizeof(cls)
    least = _V10_SIZE.get(cls, host)
    if size < least:  # every field of ABI 1.0 is required
        raise ValueError(f"{what} has struct_size {size}; ABI {ABI_MAJOR}.0 needs {least}")
    if size > 64 * host:
        raise ValueError(f"{what} has an implausible struct_size {size} (uninitialized?)")
    obj = cls()
    ctypes.memmove(ctypes.addressof(obj), addr, min(size, host))
    return obj


def _text(raw: bytes | None, what: str) -> str:
    if not raw:
        raise ValueError(f"{what} is empty")
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise ValueError(f"{what} is not UTF-8: {raw!r}") from None


def _array(ptr: Any, n: int, what: str) -> list[Any]:
    if n and not ptr:
        raise ValueError(f"{what}: {n} entries but a NULL pointer")
    return [ptr[i] for i in range(n)]


@dataclass(frozen=True)
class _Arg:
    name: str
    kind: int
    dtypes: tuple[torch.dtype, ...]
    shape: dict[str, Any]  # a ShapeRule spec; empty = no rule
    optional: bool = False  # a TENSOR that may be None (ABI 1.1)


@dataclass(frozen=True)
class _Spec:
    """One validated kernel descriptor."""

    addr: int
    name: str
    version: int
    op: str
    device: str
    priority: int
    args: tuple[_Arg, ...]
    isa: tuple[str, ...]
    workspace: int
    traits: tuple[str, ...]
    num_outputs: int
    meta: Any  # _META_FN
    run: Any  # _RUN_FN
    doc: str
    prepack_arg: str | None = None  # ABI 1.1
    prepack: Any = None  # _PREPACK_FN


def _read_arg(addr: int, i: int) -> _Arg:
    a: Any = _read_struct(ArgDesc, addr, f"argument {i}")
    name = _text(a.name, f"argument {i} name")
    if not name.isidentifier() or keyword.iskeyword(name):
        raise ValueError(f"argument name {name!r} is not an identifier")
    if a.kind not in _KIND_TYPES:
        raise ValueError(
            f"argument {name!r} has kind {a.kind}; parameters are TENSOR (1), INT (2), FLOAT (3), "
            "STRING (4) or INT_LIST (5)"
        )
    dtypes = []
    for d in _array(a.dtypes, a.num_dtypes, f"argument {name!r} dtypes"):
        dt = _DTYPES.get((d.code, d.bits))
        if dt is None or d.lanes != 1:
            raise ValueError(
                f"argument {name!r}: unknown dtype (code={d.code}, bits={d.bits}, lanes={d.lanes})"
            )
        dtypes.append(dt)
    ranks = _array(a.ranks, a.num_ranks, f"argument {name!r} ranks")
    dims = _array(a.divisible_dims, a.num_divisible, f"argument {name!r} divisible_dims")
    by = _array(a.divisible_by, a.num_divisible, f"argument {name!r} divisible_by")
    shape: dict[str, Any] = {}
    if ranks:
        shape["rank"] = tuple(ranks)
    if dims:
        shape["divisible"] = dict(zip(dims, by, strict=True))
    if a.contiguous:
        shape["contiguous"] = True
    if a.alignment:
        shape["align"] = a.alignment
    if a.kind != KIND_TENSOR and (dtypes or shape or a.optional):
        raise ValueError(
            f"argument {name!r} is not a tensor but declares dtypes, shape rules or optional"
        )
    return _Arg(name, a.kind, tuple(dtypes), shape, bool(a.optional))


def _read_kernel(addr: int, i: int, lib_minor: int) -> _Spec:
    d: Any = _read_struct(KernelDesc, addr, f"kernel #{i}")
    name = _text(d.name, f"kernel #{i} name")
    try:
        return _validate(addr, d, name, lib_minor)
    except ValueError as e:
        raise ValueError(f"kernel {name!r}: {e}") from None


def _validate(addr: int, d: Any, name: str, lib_minor: int) -> _Spec:
    op = _text(d.op, "op")
    device = _DEVICES.get(d.device_type)
    if device is None:
        raise ValueError(f"device_type {d.device_type} is not kDLCPU (1) or kDLCUDA (2)")
    if not 1 <= d.num_outputs <= 64:
        raise ValueError(f"num_outputs is {d.num_outputs}; a kernel returns 1 to 64 tensors")
    if not d.meta or not d.run:
        raise ValueError("meta and run must both be set")
    args = []
    if d.num_args and not d.args:
        raise ValueError(f"{d.num_args} arguments but a NULL args pointer")
    stride = c_size_t.from_address(d.args).value if d.num_args else 0
    for j in range(d.num_args):
        args.append(_read_arg(d.args + j * stride, j))
    isa = tuple(_text(s, "an ISA feature name") for s in _array(d.isa, d.num_isa, "isa"))
    unknown = sorted(set(isa) - FEATURES)
    if unknown:
        raise ValueError(f"unknown ISA feature(s) {unknown}; known: {', '.join(sorted(FEATURES))}")
    prepack_arg = _text(d.prepack_arg, "prepack_arg") if d.prepack_arg else None
    if prepack_arg is not None:
        packed = [a for a in args if a.name == prepack_arg]
        if not packed or packed[0].kind != KIND_TENSOR or packed[0].optional:
            raise ValueError(f"prepack_arg {prepack_arg!r} is not a required tensor parameter")
        if not d.prepack:
            raise ValueError(f"prepack_arg is {prepack_arg!r} but prepack is NULL")
    traits = tuple(n for bit, n in _TRAIT_BITS.items() if d.traits & bit)
    extra = d.traits & ~sum(_TRAIT_BITS)
    if extra and lib_minor <= ABI_MINOR:  # a newer minor's promises we do not know are harmless
        raise ValueError(f"unknown trait bits {extra:#x}")
    return _Spec(
        addr=addr,
        name=name,
        version=d.version,
        op=op,
        device=device,
        priority=d.priority,
        args=tuple(args),
        isa=isa,
        workspace=d.workspace_size,
        traits=traits,
        num_outputs=d.num_outputs,
        meta=_META_FN(d.meta),
        run=_RUN_FN(d.run),
        doc=d.doc.decode(errors="replace") if d.doc else "",
        prepack_arg=prepack_arg,
        prepack=_PREPACK_FN(d.prepack) if prepack_arg else None,
    )


# -- opening and registering ----------------------------------------------------------------------

_LOCK = threading.Lock()
_SPECS: dict[str, tuple[_Spec, ...]] = {}  # digest -> its validated descriptors


def _register(path: Path, lib: ctypes.CDLL) -> tuple[_Spec, ...]:
    try:
        fn = getattr(lib, REGISTER_SYMBOL)
    except AttributeError:
        raise KernelLoadError(
            f"{path}: not a pdlkit kernel library: it exports no `{REGISTER_SYMBOL}` symbol "
            f"(see {HEADER})"
        ) from None
    fn.restype = c_int32
    fn.argtypes = [c_uint32, c_uint32, POINTER(Registration), c_void_p, c_size_t]
    reg = Registration(struct_size=ctypes.sizeof(Registration))
    err = ctypes.create_string_buffer(_ERROR_BYTES)
    status = fn(ABI_MAJOR, ABI_MINOR, ctypes.byref(reg), ctypes.addressof(err), _ERROR_BYTES)
    message = err.value.decode(errors="replace")
    if reg.abi_major and reg.abi_major != ABI_MAJOR:
        raise KernelLoadError(
            f"{path}: built for pdlkit ABI {reg.abi_major}.{reg.abi_minor}, but this pdlkit "
            f"speaks ABI {ABI_MAJOR}.{ABI_MINOR}; rebuild it against {HEADER}"
        )
    if status != OK:
        raise KernelLoadError(
            f"{path}: {REGISTER_SYMBOL} failed: {STATUS_NAMES.get(status, status)}: {message}"
        )
    if reg.abi_major != ABI_MAJOR:
        raise KernelLoadError(f"{path}: {REGISTER_SYMBOL} did not report its ABI version")
    if reg.num_kernels > 100_000 or (reg.num_kernels and not reg.kernels):
        raise KernelLoadError(
            f"{path}: {REGISTER_SYMBOL} returned {reg.num_kernels} kernels at NULL"
        )
    specs = []
    seen: set[tuple[str, int]] = set()
    for i in range(reg.num_kernels):
        spec = read_descriptor(path, reg.kernels[i] or 0, i, reg.abi_minor)
        if (spec.name, spec.version) in seen:
            raise KernelLoadError(
                f"{path}: kernel {spec.name!r} version {spec.version} is declared twice"
            )
        seen.add((spec.name, spec.version))
        specs.append(spec)
    return tuple(specs)


def read_descriptor(path: Path, addr: int, i: int, lib_minor: int) -> _Spec:
    """The validated kernel descriptor at ``addr``; a bad one is a KernelLoadError naming ``path``."""
    try:
        return _read_kernel(addr, i, lib_minor)
    except ValueError as e:
        raise KernelLoadError(f"{path}: {e}") from None


def declare_spec(path: Path, digest: str, spec: _Spec) -> KernelDecl:
    """The declaration for a validated descriptor; what ``declare`` refuses is a KernelLoadError."""
    try:
        return _declare(path, digest, spec)
    except (KernelDeclarationError, ValueError, TypeError) as e:
        msg = str(e)
        raise KernelLoadError(msg if str(path) in msg else f"{path}: {msg}") from None


def load_native_library(
    path: Path, digest: str | None = None, data: bytes | None = None
) -> tuple[KernelDecl, ...]:
    """The kernels a native library declares, validated; bad libraries raise :class:`KernelLoadError`.

    ``data`` (the library's bytes, read once and hashed to ``digest`` by the caller) is what
    is loaded; without it ``path`` is read here, once."""
    path = Path(path).resolve()
    if data is None:
        data, digest = path.read_bytes(), None  # the digest of what was read, not a given one
    digest = digest or hashlib.sha256(data).hexdigest()
    with _LOCK:
        specs = _SPECS.get(digest)
        if specs is None:
            specs = _SPECS[digest] = _register(path, open_library(path, data, digest))
    return tuple(declare_spec(path, digest, spec) for spec in specs)


def _declare(path: Path, digest: str, spec: _Spec) -> KernelDecl:
    native = NativeKernel(spec)
    P = inspect.Parameter
    params = [
        P(a.name, P.POSITIONAL_OR_KEYWORD, annotation=Optional[torch.Tensor])  # noqa: UP045
        if a.optional
        else P(a.name, P.POSITIONAL_OR_KEYWORD, annotation=_KIND_TYPES[a.kind])
        for a in spec.args
    ]
    ret: Any = torch.Tensor
    if spec.num_outputs > 1:  # tuple[Tensor, Tensor, ...]: torch infers "-> (Tensor, Tensor, ...)"
        ret = tuple.__class_getitem__((torch.Tensor,) * spec.num_outputs)
    sig = inspect.Signature(params, return_annotation=ret)
    n = len(params)

    def fn(*args: Any, **kwargs: Any) -> Any:
        if kwargs or len(args) != n:
            args = sig.bind(*args, **kwargs).args
        return native(args)

    fn.__signature__ = sig  # type: ignore[attr-defined]
    fn.__annotations__ = {p.name: p.annotation for p in params} | {"return": ret}
    fn.__name__ = fn.__qualname__ = spec.name
    fn.__doc__ = spec.doc or None
    source = f"{path}:{spec.name}"
    try:
        return declare(
            fn,
            op=spec.op,
            meta=native.meta,
            name=spec.name,
            version=spec.version,
            priority=spec.priority,
            device=spec.device,
            dtypes={a.name: a.dtypes for a in spec.args if a.dtypes},
            requires=spec.isa,
            shapes={a.name: a.shape for a in spec.args if a.shape},
            workspace=spec.workspace,
            traits=spec.traits,
            prepack=native.prepack if spec.prepack_arg else None,
            prepack_arg=spec.prepack_arg,
            source=source,
            digest=digest,
        )
    except KernelDeclarationError as e:
        raise KernelLoadError(str(e)) from None


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


class PackedWeight(NamedTuple):
    """A weight packed by a native kernel's prepack hook (ABI 1.1): the bytes run() reads
    (1-D uint8, 64-byte aligned) and the logical shape and dtype meta() sees."""

    data: torch.Tensor
    shape: Shape
    dtype: torch.dtype


def _logical(t: Any) -> tuple[Any, torch.dtype] | None:
    """(shape, dtype) that meta() sees for one tensor parameter; None when absent."""
    if t is None:
        return None
    return t.shape, t.dtype  # torch.Size hashes and compares as the tuple it is


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
        shape = (c_int64 * w.dim())(*w.shape)
        strides = (c_int64 * w.dim())(*w.stride())
        dl = DLTensor(
            data=w.data_ptr(),
            device=DLDevice(_DEVICE_CODES["cpu"], 0),
            ndim=w.dim(),
            dtype=_dl_dtype(w.dtype),
            shape=shape,
            strides=strides,
        )
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
        attrs = {a.name: args[j] for j, a in enumerate(self.spec.args) if a.kind != KIND_TENSOR}
        out = list(args)
        out[i] = self.prepack(args[i], attrs)
        return out

    def __call__(self, args: Sequence[Any]) -> Any:
        spec = self.spec
        args = self._packed(args)
        if spec.device == "cpu":
            return self._call_cpu(args)
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

    def _call_cpu(self, args: Sequence[Any]) -> Any:
        """A CPU call through a :class:`_Plan`: the frame of this thread for these shapes,
        strides, dtypes and attributes, made once; a call writes its data pointers and runs.
        (Building the frame per call cost 25-30 us, 60-85 us with the interpreter's data
        cold after a large kernel: more than a 64 x 64 attention head takes.)"""
        spec = self.spec
        tensors = [args[i] for i in self.tensor_args]
        real: list[Any] = []
        key: list[Any] = []
        for t in tensors:
            if t is None:
                real.append(None)
                key.append(None)
                continue
            if type(t) is PackedWeight:
                t = t.data
            if not t.is_cpu:
                where = ", ".join(str(t.device) for t in tensors if t is not None)
                raise KernelUnsupported(f"{spec.name} runs on cpu, got tensors on {where}")
            if t.is_conj() or t.is_neg():  # lazy bits C would not see
                raise KernelUnsupported(f"{spec.name}: an input has a pending conj/neg bit")
            real.append(t)
            key.append((t.shape, t.stride(), t.dtype))
        for i, a in self.attr_args:
            v = args[i]
            if a.kind == KIND_INT_LIST:
                v = tuple(v)
            elif type(v) is float:
                v = v.hex()  # -0.0 is not 0.0 to a kernel; NaN finds its own plan again
            key.append((type(v), v))
        local = self._local
        try:
            plans = local.plans
        except AttributeError:
            plans = local.plans = {}
        k = tuple(key)
        plan = plans.get(k)
        if plan is None:
            if len(plans) >= 256:
                plans.clear()
            plan = plans[k] = _Plan(self, tensors, real, args)
        outs = [torch.empty(s, dtype=dt) for s, dt in plan.outs]
        words = plan.words
        for at, t in zip(plan.data_at, real + outs, strict=True):
            if t is not None:
                words[at] = t.data_ptr()
        status = spec.run(plan.base)
        return _result(spec, status, plan.buf, plan.layout, outs)


class _Plan:
    """A CPU call frame made once per thread and call shape: the CallFrame, its DLTensors
    with their shape and stride arrays, the attributes and the workspace filled in; ``words``
    views the frame as 64-bit words, ``data_at`` indexes each DLTensor's data pointer."""

    __slots__ = ("base", "buf", "data_at", "keep", "layout", "outs", "words")

    def __init__(
        self, k: NativeKernel, tensors: list[Any], real: list[Any], args: Sequence[Any]
    ) -> None:
        self.outs = [(tuple(s), dt) for s, dt in k._meta_cached(tensors, args)]
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
    k: NativeKernel,
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

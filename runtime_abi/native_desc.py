"""A native library's descriptors, read and validated, then declared as kernels.

``load_native_library`` opens a library (from the hashed bytes), calls its ``pdlkit_register``,
refuses another ABI major and turns each validated descriptor into a :class:`KernelDecl`
whose function is a :class:`pdlkit.runtime_abi.native.NativeKernel`."""

from __future__ import annotations

import ctypes
import keyword
import threading
from ctypes import POINTER, c_int32, c_size_t, c_uint32, c_void_p
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pdlkit.runtime_abi.kernel import (
    FEATURES,
)
from pdlkit.runtime_abi.native_abi import (
    _DEVICES,
    _DTYPES,
    _ERROR_BYTES,
    _KIND_TYPES,
    _META_FN,
    _PREPACK_FN,
    _RUN_FN,
    _TRAIT_BITS,
    _V10_SIZE,
    ABI_MAJOR,
    ABI_MINOR,
    HEADER,
    KIND_TENSOR,
    OK,
    REGISTER_SYMBOL,
    STATUS_NAMES,
    ArgDesc,
    KernelDesc,
    Registration,
)

from pdlkit.errors import KernelLoadError

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
    prepack_with: tuple[str, ...] = ()  # ABI 1.2


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
    prepack_with = _prepack_with(d, args, prepack_arg)
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
        prepack_with=prepack_with,
    )


def _prepack_with(d: Any, args: list[_Arg], prepack_arg: str | None) -> tuple[str, ...]:
    """The prepack_with names (ABI 1.2): required tensor parameters other than prepack_arg."""
    names = tuple(
        _text(s, "a prepack_with name")
        for s in _array(d.prepack_with, d.num_prepack_with, "prepack_with")
    )
    if names and prepack_arg is None:
        raise ValueError(f"prepack_with {list(names)} without a prepack_arg")
    tensors = {a.name for a in args if a.kind == KIND_TENSOR and not a.optional}
    for name in names:
        if name not in tensors or name == prepack_arg or names.count(name) > 1:
            raise ValueError(
                f"prepack_with {name!r} is not a required tensor parameter other than "
                f"prepack_arg, named once"
            )
    return names


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

"""A native library's kernels declared: each validated descriptor (:mod:`native_desc`) becomes
a :class:`KernelDecl` whose function is a :class:`pdlkit.runtime_abi.native.NativeKernel`.

:func:`load_native_library` opens a library from the bytes that were hashed (and checked
against a pin), calls its ``pdlkit_register``, refuses another ABI major and declares what it
registered; a bad library raises :class:`KernelLoadError` naming it.
"""

from __future__ import annotations

import hashlib
import inspect
from pathlib import Path
from typing import Any, Optional

import torch
from pdlkit.runtime_abi.dlopen import open_library
from pdlkit.runtime_abi.kernel import KernelDecl, KernelDeclarationError, declare
from pdlkit.runtime_abi.native import NativeKernel
from pdlkit.runtime_abi.native_abi import _KIND_TYPES
from pdlkit.runtime_abi.native_desc import _LOCK, _SPECS, _register, _Spec

from pdlkit.errors import KernelLoadError


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

    call = native.cpu if spec.device == "cpu" else native  # CPU: straight to the frame plans

    def fn(*args: Any, **kwargs: Any) -> Any:
        if kwargs or len(args) != n:
            args = sig.bind(*args, **kwargs).args
        return call(args)

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
            prepack_with=spec.prepack_with,
            source=source,
            digest=digest,
        )
    except KernelDeclarationError as e:
        raise KernelLoadError(str(e)) from None

"""The kernel declaration: what a kernel is, checked when it is declared, never at first call.

A kernel is a plain function plus data::

    @pdlkit.kernel(op="linear_gelu", device="cpu",
                   dtypes={"x": [torch.float32], "weight": [torch.float32]},
                   meta=lambda x, weight, bias, approximate: x.new_empty(*x.shape[:-1], weight.shape[0]))
    def linear_gelu_fused(x: Tensor, weight: Tensor, bias: Optional[Tensor], approximate: str) -> Tensor:
        ...

Patterns name the *logical op* (``pdlkit_call("linear_gelu", ...)``); the registry picks a
kernel implementing it. The function's type annotations are its schema (as with
``torch.library.custom_op``); the meta function gives output shapes and dtypes to fake
tensors so Dynamo, AOT autograd and Inductor see one opaque op.
"""

from __future__ import annotations

import hashlib
import inspect
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_OP = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")
DEVICES = ("cpu", "cuda")


class KernelUnsupported(Exception):
    """Raised by a kernel to decline one call; pdlkit then runs the replaced subgraph instead."""


class KernelDeclarationError(ValueError):
    """A kernel declaration is invalid; the message names the kernel and its source line."""


@dataclass(frozen=True, eq=False)
class KernelDecl:
    """A declared kernel. Instances are found by the loader in a kernel file's namespace."""

    name: str
    op: str
    fn: Callable[..., Any]
    meta: Callable[..., Any]
    device: str
    dtypes: Mapping[str, tuple[torch.dtype, ...]]
    requires: frozenset[str]
    version: int
    priority: int
    schema: str  # "(Tensor x, ...) -> Tensor", inferred from the annotations
    params: tuple[str, ...]
    source: str  # "file:line" of the function, for messages
    digest: str  # of the defining file's bytes: same code -> same torch op
    doc: str = field(default="", repr=False)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<pdlkit kernel {self.name} v{self.version} op={self.op} device={self.device} at {self.source}>"


def _source_of(fn: Callable[..., Any]) -> str:
    try:
        return f"{inspect.getsourcefile(fn)}:{inspect.getsourcelines(fn)[1]}"
    except (OSError, TypeError):
        return getattr(fn, "__qualname__", repr(fn))


def _digest_of(fn: Callable[..., Any]) -> str:
    try:
        path = inspect.getsourcefile(fn)
        if path:
            with open(path, "rb") as f:
                return hashlib.sha256(f.read()).hexdigest()
    except (OSError, TypeError):
        pass
    return f"id{id(fn)}"


def _infer_schema(fn: Callable[..., Any], where: str) -> str:
    from torch._library.infer_schema import infer_schema

    try:
        return infer_schema(fn, mutates_args=())
    except Exception as e:  # torch explains what annotation it could not map
        raise KernelDeclarationError(f"{where}: cannot infer the kernel's schema: {e}") from None


def declare(
    fn: Callable[..., Any],
    *,
    op: str,
    meta: Callable[..., Any],
    name: str | None = None,
    device: str = "cpu",
    dtypes: Mapping[str, Iterable[torch.dtype]] | None = None,
    requires: Iterable[str] = (),
    version: int = 1,
    priority: int = 0,
) -> KernelDecl:
    """Build and validate a :class:`KernelDecl` (the function form of :func:`kernel`)."""
    where = _source_of(fn)
    name = name or fn.__name__
    problems = []
    if not _NAME.match(name):
        problems.append(f"kernel name {name!r} is not an identifier")
    if not _OP.match(op):
        problems.append(f"logical op {op!r} must be an identifier (dots allowed)")
    if device not in DEVICES:
        problems.append(f"device {device!r} is not one of {DEVICES}")
    if not isinstance(version, int) or version < 1:
        problems.append(f"version must be a positive integer, got {version!r}")
    if not callable(meta):
        problems.append(
            "meta must be a function returning empty tensors of the output shapes and dtypes"
        )
    params = tuple(inspect.signature(fn).parameters)
    dts: dict[str, tuple[torch.dtype, ...]] = {}
    for arg, allowed in (dtypes or {}).items():
        if arg not in params:
            problems.append(f"dtypes names {arg!r}, which is not a parameter of {name}{params}")
            continue
        allowed = tuple(allowed) if not isinstance(allowed, torch.dtype) else (allowed,)
        if not all(isinstance(d, torch.dtype) for d in allowed):
            problems.append(f"dtypes[{arg!r}] must list torch dtypes, got {allowed!r}")
        dts[arg] = allowed
    if "pdlkit_site" in params:
        problems.append("the parameter name 'pdlkit_site' is reserved")
    if callable(meta):
        try:
            meta_params = inspect.signature(meta).parameters.values()
        except (TypeError, ValueError):
            meta_params = None
        if meta_params is not None and not any(p.kind is p.VAR_POSITIONAL for p in meta_params):
            if len(list(meta_params)) != len(params):
                problems.append(
                    f"meta takes {len(list(meta_params))} arguments, the kernel {len(params)}"
                )
    if problems:
        raise KernelDeclarationError(f"{where}: kernel {name!r}: " + "; ".join(problems))
    schema = _infer_schema(fn, f"{where}: kernel {name!r}")
    return KernelDecl(
        name=name,
        op=op,
        fn=fn,
        meta=meta,
        device=device,
        dtypes=dts,
        requires=frozenset(requires),
        version=version,
        priority=priority,
        schema=schema,
        params=params,
        source=where,
        digest=_digest_of(fn),
        doc=inspect.getdoc(fn) or "",
    )


def kernel(
    *,
    op: str,
    meta: Callable[..., Any],
    name: str | None = None,
    device: str = "cpu",
    dtypes: Mapping[str, Iterable[torch.dtype]] | None = None,
    requires: Iterable[str] = (),
    version: int = 1,
    priority: int = 0,
) -> Callable[[Callable[..., Any]], KernelDecl]:
    """Declare a kernel implementing the logical op ``op``.

    ``meta(*args)`` returns empty tensors with the output shapes and dtypes; ``dtypes`` maps
    parameter names to the dtypes the kernel accepts; ``requires`` lists ISA features
    (``"avx512_vnni"``, ...); higher ``priority`` wins when several kernels are eligible.
    Raise :class:`KernelUnsupported` inside the kernel to decline one call.
    """

    def wrap(fn: Callable[..., Any]) -> KernelDecl:
        return declare(
            fn,
            op=op,
            meta=meta,
            name=name,
            device=device,
            dtypes=dtypes,
            requires=requires,
            version=version,
            priority=priority,
        )

    return wrap

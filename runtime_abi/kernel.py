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

from pdlkit.errors import PdlkitError

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_OP = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")
DEVICES = ("cpu", "cuda")
FEATURES = frozenset(
    {
        "avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16",
        "asimddp", "i8mm", "bf16", "sve", "sve2", "sm_80", "sm_90", "sm_100",
    }
)  # fmt: skip
TRAITS = frozenset({"deterministic", "inplace", "graph_capture_safe"})


@dataclass(frozen=True)
class ShapeRule:
    """What one tensor argument must look like: ``{"rank": 2, "divisible": {-1: 4},
    "contiguous": True, "align": 64}`` (dims may be negative; align is in bytes)."""

    rank: tuple[int, ...] | None = None
    divisible: tuple[tuple[int, int], ...] = ()
    contiguous: bool = False
    align: int | None = None

    @classmethod
    def parse(cls, spec: Mapping[str, Any] | ShapeRule) -> ShapeRule:
        if isinstance(spec, ShapeRule):
            return spec
        bad = set(spec) - {"rank", "divisible", "contiguous", "align"}
        if bad:
            raise ValueError(
                f"unknown shape rule key(s) {sorted(bad)}; known: rank, divisible, contiguous, align"
            )
        rank = spec.get("rank")
        ranks = None if rank is None else (rank,) if isinstance(rank, int) else tuple(rank)
        div = tuple((int(d), int(k)) for d, k in dict(spec.get("divisible", {})).items())
        if any(k <= 0 for _, k in div):
            raise ValueError("divisible: divisors must be positive")
        align = spec.get("align")
        if align is not None and (align <= 0 or align & (align - 1)):
            raise ValueError(f"align must be a power of two, got {align}")
        return cls(ranks, div, bool(spec.get("contiguous", False)), align)

    def violation(self, t: torch.Tensor, *, static: bool = False) -> str | None:
        """Why ``t`` breaks the rule, or None. With ``static`` (fake tensors at compile time)
        only what is provable now is checked; the rest becomes a run-time guard."""
        if self.rank is not None and t.dim() not in self.rank:
            return f"rank {t.dim()}, needs {' or '.join(map(str, self.rank))}"
        for d, k in self.divisible:
            if not -t.dim() <= d < t.dim():
                return f"has no dim {d}"
            size = t.shape[d]
            if static and not isinstance(size, int):
                continue  # symbolic: checked per call
            if int(size) % k:
                return f"dim {d} is {size}, not a multiple of {k}"
        if static:
            return None
        if self.contiguous and not t.is_contiguous():
            return "is not contiguous"
        if self.align is not None and t.data_ptr() % self.align:
            return f"data is not {self.align}-byte aligned"
        return None


class KernelUnsupported(PdlkitError):
    """Raised by a kernel to decline one call; pdlkit then runs the replaced subgraph instead."""


class KernelDeclarationError(PdlkitError, ValueError):
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
    shapes: Mapping[str, ShapeRule] = field(default_factory=dict)
    workspace: int = 0  # bytes of scratch memory the kernel needs per call
    traits: frozenset[str] = frozenset()
    prepack: Callable[[Any, Mapping[str, Any]], Any] | None = None
    prepack_arg: str | None = None  # the parameter whose (constant) tensor is pre-packed
    # further constant tensors the packed form is made from (a fused QKV GEMM packs three
    # weights as one): the pack reads them from its attrs, and they key the cache with it
    prepack_with: tuple[str, ...] = ()
    reference: Callable[..., Any] | None = None  # the semantics, for abi-check
    examples: Callable[[torch.dtype], Iterable[tuple[Any, ...]]] | None = None  # abi-check inputs
    # the gradient: backward(ctx, *grad_outputs) -> one gradient (or None) per parameter;
    # setup_context(ctx, inputs, output) saves what it needs (default: ctx.inputs, ctx.output)
    backward: Callable[..., Any] | None = None
    setup_context: Callable[..., Any] | None = None
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
    shapes: Mapping[str, Mapping[str, Any] | ShapeRule] | None = None,
    workspace: int = 0,
    traits: Iterable[str] = (),
    prepack: Callable[[Any, Mapping[str, Any]], Any] | None = None,
    prepack_arg: str | None = None,
    prepack_with: Iterable[str] = (),
    reference: Callable[..., Any] | None = None,
    examples: Callable[[torch.dtype], Iterable[tuple[Any, ...]]] | None = None,
    backward: Callable[..., Any] | None = None,
    setup_context: Callable[..., Any] | None = None,
    source: str | None = None,
    digest: str | None = None,
) -> KernelDecl:
    """Build and validate a :class:`KernelDecl` (the function form of :func:`kernel`).

    ``source`` and ``digest`` default to the defining file; a native loader passes the
    shared library's path and hash.
    """
    where = source or _source_of(fn)
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
    defaults = [
        n for n, prm in inspect.signature(fn).parameters.items() if prm.default is not prm.empty
    ]
    if defaults:
        problems.append(
            f"parameters {defaults} have defaults; patterns pass every argument, and pdlkit "
            "appends a call-site argument after them, so kernel parameters take no defaults"
        )
    if "pdlkit_site" in params:
        problems.append("the parameter name 'pdlkit_site' is reserved")
    unknown = set(requires) - FEATURES
    if unknown:
        problems.append(
            f"unknown ISA feature(s) {sorted(unknown)}; known: {', '.join(sorted(FEATURES))}"
        )
    bad_traits = set(traits) - TRAITS
    if bad_traits:
        problems.append(
            f"unknown trait(s) {sorted(bad_traits)}; known: {', '.join(sorted(TRAITS))}"
        )
    rules: dict[str, ShapeRule] = {}
    for arg, spec in (shapes or {}).items():
        if arg not in params:
            problems.append(f"shapes names {arg!r}, which is not a parameter of {name}{params}")
            continue
        try:
            rules[arg] = ShapeRule.parse(spec)
        except (ValueError, TypeError) as e:
            problems.append(f"shapes[{arg!r}]: {e}")
    if not isinstance(workspace, int) or workspace < 0:
        problems.append(f"workspace must be a number of bytes >= 0, got {workspace!r}")
    if prepack is not None:
        if not callable(prepack):
            problems.append("prepack must be a function (weight, attrs) -> packed weight")
        if prepack_arg not in params:
            problems.append(f"prepack_arg must name the packed parameter, got {prepack_arg!r}")
    prepack_with = (prepack_with,) if isinstance(prepack_with, str) else tuple(prepack_with)
    if prepack_with and prepack is None:
        problems.append("prepack_with names tensors a prepack reads, but there is no prepack")
    for arg in prepack_with:
        if arg not in params or arg == prepack_arg:
            problems.append(
                f"prepack_with must name other parameters of {name}{params}, got {arg!r}"
            )
    if backward is not None and not callable(backward):
        problems.append("backward must be a function (ctx, *grad_outputs) -> gradients")
    if setup_context is not None and (backward is None or not callable(setup_context)):
        problems.append(
            "setup_context must be a function (ctx, inputs, output), used with backward"
        )
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
        digest=digest or _digest_of(fn),
        shapes=rules,
        workspace=workspace,
        traits=frozenset(traits),
        prepack=prepack,
        prepack_arg=prepack_arg if prepack is not None else None,
        prepack_with=prepack_with,
        reference=reference,
        examples=examples,
        backward=backward,
        setup_context=setup_context,
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
    shapes: Mapping[str, Mapping[str, Any] | ShapeRule] | None = None,
    workspace: int = 0,
    traits: Iterable[str] = (),
    prepack: Callable[[Any, Mapping[str, Any]], Any] | None = None,
    prepack_arg: str | None = None,
    prepack_with: Iterable[str] = (),
    reference: Callable[..., Any] | None = None,
    examples: Callable[[torch.dtype], Iterable[tuple[Any, ...]]] | None = None,
    backward: Callable[..., Any] | None = None,
    setup_context: Callable[..., Any] | None = None,
) -> Callable[[Callable[..., Any]], KernelDecl]:
    """Declare a kernel implementing the logical op ``op``.

    ``meta(*args)`` returns empty tensors with the output shapes and dtypes; ``dtypes`` maps
    parameter names to the dtypes the kernel accepts; ``requires`` lists ISA features
    (``"avx512_vnni"``, ...); higher ``priority`` wins when several kernels are eligible,
    then the higher ``version``. ``shapes`` maps parameters to :class:`ShapeRule` specs
    (checked at compile time where provable, else per call); ``traits`` from
    :data:`TRAITS`; ``prepack(weight, attrs)`` packs the constant tensor passed as
    ``prepack_arg`` once (the kernel then receives the packed tensor in its place), and
    ``prepack_with`` names further constant tensors the packed form is made from (passed
    to ``prepack`` in ``attrs`` under their names; an in-place update of any of them packs
    again);
    ``reference`` and ``examples(dtype)`` feed ``pdlkit abi-check``.
    ``backward(ctx, grad)`` returns one gradient (or None) per parameter and makes the
    kernel eligible in graphs that need gradients; ``setup_context(ctx, inputs, output)``
    saves what it needs (by default ``ctx.inputs`` and ``ctx.output`` are set).
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
            shapes=shapes,
            workspace=workspace,
            traits=traits,
            prepack=prepack,
            prepack_arg=prepack_arg,
            prepack_with=prepack_with,
            reference=reference,
            examples=examples,
            backward=backward,
            setup_context=setup_context,
        )

    return wrap

"""The kernel declaration: what a kernel is, checked when it is declared, never at first call.

A kernel is a plain function plus data; it implements a logical op (:mod:`pdlkit.runtime_abi.ops`)
whose parameters, schema, meta function and reference semantics it takes::

    @pdlkit.kernel(implements="linear_gelu", device="cpu",
                   dtypes={"x": [torch.float32], "weight": [torch.float32]})
    def linear_gelu_fused(x, weight, bias, approximate):
        ...

Patterns name the *logical op* (``pdlkit_call("linear_gelu", ...)``); the registry picks a
kernel implementing it and checks, when it loads, that the kernel's parameter names are the
op's (all of them, or a prefix and ``*rest``) and that any annotations agree with the op's
types. The older form, ``op="linear_gelu", meta=...`` over an annotated function (the
annotations are its schema, as with ``torch.library.custom_op``), still works.
"""

from __future__ import annotations

import hashlib
import inspect
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from pdlkit.runtime_abi.ops import (
    LogicalOp,
    lookup,
    schema_problem,
    signature_problem,
    source_of,
)

from pdlkit.errors import PdlkitError

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_OP = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")
DEVICES = ("cpu", "cuda")
FEATURES = frozenset(
    {
        "avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8",
        "amx_bf16",
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
    from_op: bool = False  # declared with implements=: params, schema and meta are the op's
    logical: LogicalOp | None = field(default=None, repr=False)  # the op it is bound to
    doc: str = field(default="", repr=False)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<pdlkit kernel {self.name} v{self.version} op={self.op} device={self.device} at {self.source}>"


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


def _declared_params(fn: Callable[..., Any]) -> tuple[tuple[str, ...], bool]:
    """The function's named parameters, and whether a ``*rest`` follows them."""
    sig = inspect.signature(fn).parameters.values()
    named = tuple(p.name for p in sig if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD))
    return named, any(p.kind is p.VAR_POSITIONAL for p in sig)


def _option_problems(name: str, op: str, o: Mapping[str, Any]) -> list[str]:
    """What is wrong with a declaration's options that does not depend on its parameters."""
    problems = []
    if not _NAME.match(name):
        problems.append(f"kernel name {name!r} is not an identifier")
    if not _OP.match(op):
        problems.append(f"logical op {op!r} must be an identifier (dots allowed)")
    if o["device"] not in DEVICES:
        problems.append(f"device {o['device']!r} is not one of {DEVICES}")
    version = o["version"]
    if not isinstance(version, int) or version < 1:
        problems.append(f"version must be a positive integer, got {version!r}")
    unknown = set(o["requires"]) - FEATURES
    if unknown:
        problems.append(
            f"unknown ISA feature(s) {sorted(unknown)}; known: {', '.join(sorted(FEATURES))}"
        )
    bad_traits = set(o["traits"]) - TRAITS
    if bad_traits:
        problems.append(
            f"unknown trait(s) {sorted(bad_traits)}; known: {', '.join(sorted(TRAITS))}"
        )
    workspace = o["workspace"]
    if not isinstance(workspace, int) or workspace < 0:
        problems.append(f"workspace must be a number of bytes >= 0, got {workspace!r}")
    if o["prepack"] is not None and not callable(o["prepack"]):
        problems.append("prepack must be a function (weight, attrs) -> packed weight")
    if o["prepack_with"] and o["prepack"] is None:
        problems.append("prepack_with names tensors a prepack reads, but there is no prepack")
    if o["backward"] is not None and not callable(o["backward"]):
        problems.append("backward must be a function (ctx, *grad_outputs) -> gradients")
    if o["setup_context"] is not None and (
        o["backward"] is None or not callable(o["setup_context"])
    ):
        problems.append(
            "setup_context must be a function (ctx, inputs, output), used with backward"
        )
    return problems


def _param_problems(
    decl: KernelDecl, params: tuple[str, ...], dtypes: Mapping[str, Any], shapes: Mapping[str, Any]
) -> list[str]:
    """What the options say about parameters the kernel does not have."""
    name, problems = decl.name, []
    for arg in dtypes:
        if arg not in params:
            problems.append(f"dtypes names {arg!r}, which is not a parameter of {name}{params}")
    for arg in shapes:
        if arg not in params:
            problems.append(f"shapes names {arg!r}, which is not a parameter of {name}{params}")
    if decl.prepack is not None and decl.prepack_arg not in params:
        problems.append(f"prepack_arg must name the packed parameter, got {decl.prepack_arg!r}")
    for arg in decl.prepack_with:
        if arg not in params or arg == decl.prepack_arg:
            problems.append(
                f"prepack_with must name other parameters of {name}{params}, got {arg!r}"
            )
    if "pdlkit_site" in params:
        problems.append("the parameter name 'pdlkit_site' is reserved")
    if callable(decl.meta):
        try:
            meta_params = list(inspect.signature(decl.meta).parameters.values())
        except (TypeError, ValueError):
            meta_params = []
        if meta_params and not any(p.kind is p.VAR_POSITIONAL for p in meta_params):
            if len(meta_params) != len(params):
                problems.append(
                    f"meta takes {len(meta_params)} arguments, the kernel {len(params)}"
                )
    return problems


def _rules(
    dtypes: Mapping[str, Any], shapes: Mapping[str, Any]
) -> tuple[dict[str, tuple[torch.dtype, ...]], dict[str, ShapeRule], list[str]]:
    problems, dts, rules = [], {}, {}
    for arg, allowed in dtypes.items():
        allowed = (allowed,) if isinstance(allowed, torch.dtype) else tuple(allowed)
        if not all(isinstance(d, torch.dtype) for d in allowed):
            problems.append(f"dtypes[{arg!r}] must list torch dtypes, got {allowed!r}")
        dts[arg] = allowed
    for arg, spec in shapes.items():
        try:
            rules[arg] = ShapeRule.parse(spec)
        except (ValueError, TypeError) as e:
            problems.append(f"shapes[{arg!r}]: {e}")
    return dts, rules, problems


_DEFAULTS: dict[str, Any] = {
    "name": None, "device": "cpu", "dtypes": None, "requires": (), "version": 1, "priority": 0,
    "shapes": None, "workspace": 0, "traits": (), "prepack": None, "prepack_arg": None,
    "prepack_with": (), "reference": None, "examples": None, "backward": None,
    "setup_context": None, "source": None, "digest": None,
}  # fmt: skip


def declare(
    fn: Callable[..., Any],
    *,
    op: str | None = None,
    implements: str | None = None,
    meta: Callable[..., Any] | None = None,
    **options: Any,
) -> KernelDecl:
    """Build and validate a :class:`KernelDecl` (the function form of :func:`kernel`).

    before: ``declare(fn, op="qlinear_q", meta=..., device="cpu")`` with fn's annotations as the
            schema; after: ``declare(fn, implements="qlinear_q", device="cpu")`` takes schema,
            parameter names, meta and reference from the op, bound when the registry loads
            (:func:`bind_op`). ``source`` and ``digest`` default to the defining file; a native
            loader passes the shared library's path and hash.
    """
    unknown = set(options) - set(_DEFAULTS)
    if unknown:
        raise TypeError(f"kernel(): unknown option(s) {sorted(unknown)}")
    o = {**_DEFAULTS, **options}
    where = o["source"] or source_of(fn)
    name = o["name"] or fn.__name__
    if (op is None) == (implements is None):
        raise KernelDeclarationError(
            f"{where}: kernel {name!r}: say implements=<op name> (or, the older form, op= with meta=)"
        )
    o["prepack_with"] = (
        (o["prepack_with"],) if isinstance(o["prepack_with"], str) else tuple(o["prepack_with"])
    )
    problems = _option_problems(name, str(op or implements), o)
    if implements is None and not callable(meta):
        problems.append(
            "meta must be a function returning empty tensors of the output shapes and dtypes"
        )
    problems += _default_problems(fn)
    dts, rules, more = _rules(o["dtypes"] or {}, o["shapes"] or {})
    problems += more
    if problems:
        raise KernelDeclarationError(f"{where}: kernel {name!r}: " + "; ".join(problems))
    decl = KernelDecl(
        name=name,
        op=str(op or implements),
        fn=fn,
        meta=meta if meta is not None else _unbound,
        device=o["device"],
        dtypes=dts,
        requires=frozenset(o["requires"]),
        version=o["version"],
        priority=o["priority"],
        schema="",
        params=_declared_params(fn)[0],
        source=where,
        digest=o["digest"] or _digest_of(fn),
        shapes=rules,
        workspace=o["workspace"],
        traits=frozenset(o["traits"]),
        prepack=o["prepack"],
        prepack_arg=o["prepack_arg"] if o["prepack"] is not None else None,
        prepack_with=o["prepack_with"],
        reference=o["reference"],
        examples=o["examples"],
        backward=o["backward"],
        setup_context=o["setup_context"],
        from_op=implements is not None,
        doc=inspect.getdoc(fn) or "",
    )
    if implements is not None:  # bound now where the op is loaded; a registry binds it again
        return bind_if_loaded(decl)  # to its own op, and reports a mismatch there
    problems = _param_problems(decl, decl.params, dts, rules)
    if problems:
        raise KernelDeclarationError(f"{where}: kernel {name!r}: " + "; ".join(problems))
    return replace(decl, schema=_infer_schema(fn, f"{where}: kernel {name!r}"))


def _own(value: Any, from_op: Any) -> Any:
    """A kernel's own ``value``, None where it is absent or was the op's (bound before)."""
    return value if value is not None and value is not from_op else None


def _default_problems(fn: Callable[..., Any]) -> list[str]:
    sig = inspect.signature(fn).parameters.items()
    defaults = [n for n, prm in sig if prm.default is not prm.empty]
    if not defaults:
        return []
    return [
        f"parameters {defaults} have defaults; patterns pass every argument, and pdlkit "
        "appends a call-site argument after them, so kernel parameters take no defaults"
    ]


def bind_if_loaded(decl: KernelDecl) -> KernelDecl:
    """``decl`` bound to the op of its name loaded last, where that works; else as it is (a
    registry binds it to its own op, and reports a mismatch there)."""
    known = lookup(decl.op)
    if known is None or not known.typed:
        return decl
    try:
        return bind_op(decl, known)
    except KernelDeclarationError:
        return decl


def _unbound(*args: Any) -> Any:
    raise KernelDeclarationError(
        "a kernel declared with implements= is used before its op is bound"
    )


def bind_op(decl: KernelDecl, the_op: LogicalOp | None) -> KernelDecl:
    """``decl`` checked against the op it implements, with the op's schema, parameter names,
    meta and reference; an older declaration (``op=``, its own schema) is checked for its
    parameter count. Raises :class:`KernelDeclarationError` naming both places."""
    where = f"{decl.source}: kernel {decl.name!r}"
    if the_op is None:
        if decl.from_op:
            raise KernelDeclarationError(
                f"{where}: implements op {decl.op!r}, which no op file declares (declare it with "
                "@pdlkit.op in a file of a kernel folder)"
            )
        return decl
    if not decl.from_op:
        if len(decl.params) != len(the_op.params) and the_op.typed:
            raise KernelDeclarationError(
                f"{where}: takes {len(decl.params)} parameters, op {decl.op!r} declared at "
                f"{the_op.source} takes {len(the_op.params)} ({', '.join(the_op.param_names)})"
            )
        return decl
    if not the_op.typed:
        raise KernelDeclarationError(
            f"{where}: op {decl.op!r} at {the_op.source} has no parameter types: declare it with "
            "@pdlkit.op (annotated), or give the kernel op= and meta="
        )
    named, variadic = _declared_params(decl.fn)
    why = signature_problem(named, variadic, the_op)
    if why is None and not variadic:
        try:
            why = schema_problem(_infer_schema(decl.fn, where), the_op)
        except KernelDeclarationError:
            why = None  # unannotated: the op's types apply
    params, was = the_op.param_names, decl.logical
    bound = replace(
        decl,
        params=params,
        schema=the_op.schema,
        meta=the_op.meta if decl.meta is _unbound or (was and decl.meta is was.meta) else decl.meta,
        reference=_own(decl.reference, was and was.reference) or the_op.reference,
        examples=_own(decl.examples, was and was.examples) or the_op.examples,
        logical=the_op,
    )
    problems = ([why] if why else []) + _param_problems(bound, params, decl.dtypes, decl.shapes)
    if problems:
        raise KernelDeclarationError(f"{where}: " + "; ".join(problems))
    return bound


def kernel(**options: Any) -> Callable[[Callable[..., Any]], KernelDecl]:
    """Declare a kernel: ``@pdlkit.kernel(implements="qlinear_q", device="cpu", ...)``.

    ``implements`` names the logical op (:func:`pdlkit.op`): the kernel's parameter names are
    the op's (all of them, or a prefix then ``*rest``), and its schema, meta function and
    reference come from the op. The older form ``op="name", meta=fn`` with an annotated
    function still works (its own schema; checked for its parameter count against a declared
    op). Options: ``dtypes`` maps parameter names to the dtypes the kernel accepts;
    ``requires`` lists ISA features (``"avx512_vnni"``, ...); higher ``priority`` wins when
    several kernels are eligible, then the higher ``version``; ``shapes`` maps parameters to
    :class:`ShapeRule` specs (checked at compile time where provable, else per call);
    ``traits`` from :data:`TRAITS`; ``workspace`` bytes; ``prepack(weight, attrs)`` packs the
    constant tensor passed as ``prepack_arg`` once (the kernel then receives the packed tensor
    in its place), and ``prepack_with`` names further constant tensors the packed form is made
    from (passed to ``prepack`` in ``attrs``; an in-place update of any of them packs again);
    ``backward(ctx, grad)`` returns one gradient (or None) per parameter and makes the kernel
    eligible in graphs that need gradients; ``setup_context(ctx, inputs, output)`` saves what
    it needs (by default ``ctx.inputs`` and ``ctx.output`` are set); ``name`` and ``version``.
    Raise :class:`KernelUnsupported` inside the kernel to decline one call.
    """
    return lambda fn: declare(fn, **options)

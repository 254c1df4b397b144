"""Logical ops: what a pattern's ``pdlkit_call("<op>", ...)`` means, declared once.

    before: each kernel of qlinear_q wrote out its 13 annotated parameters and a meta
            function, a separate @pdlkit.reference gave the semantics (the last file loaded
            won), and pdlkit_call arguments were checked only by count
    after:  @pdlkit.op(meta=..., examples=...)
            def qlinear_q(x_q: Tensor, x_scale: float, ...) -> Tensor:   # the reference
                ...
            @pdlkit.kernel(implements="qlinear_q", device="cpu", ...)
            def qlinear_q_mine(x_q, x_scale, *rest): ...                 # names checked

An op's parameter names and types (its annotations, as ``torch.library.custom_op`` reads
them) are the schema of every kernel that implements it; its body is the reference semantics
(``pdlkit abi-check``, per-call verification); ``meta`` gives output shapes and dtypes to fake
tensors; ``examples(dtype)`` gives abi-check its inputs. Op files are plug-ins found by path
like kernels (the shipped ones are ``kernels/ops/``); two ops of one name are an error naming
both places.
"""

from __future__ import annotations

import inspect
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from pdlkit.errors import PdlkitError

Examples = Callable[[torch.dtype], Iterable[tuple[Any, ...]]]
_OP = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")
UNTYPED = "Any"  # a parameter of an op declared without annotations (@pdlkit.reference)


class OpDeclarationError(PdlkitError, ValueError):
    """An op declaration, or a kernel's signature against its op, is invalid; the message
    names the file and line."""


@dataclass(frozen=True)
class Param:
    """One parameter: its name and schema type (``Tensor``, ``Tensor?``, ``float``, ``int``,
    ``str``, ``bool``, ``int[]``, ...; ``Any`` where the op gives none)."""

    name: str
    type: str

    @property
    def optional(self) -> bool:
        return self.type.endswith("?")

    @property
    def is_tensor(self) -> bool:
        return self.type.startswith("Tensor")


@dataclass(frozen=True, eq=False)
class LogicalOp:
    """A declared logical op; calling it runs its reference semantics."""

    name: str
    params: tuple[Param, ...]
    reference: Callable[..., Any]
    meta: Callable[..., Any] | None
    examples: Examples | None
    schema: str  # "(Tensor x, ...) -> Tensor"; "" for an untyped op
    source: str  # "file:line"
    doc: str = field(default="", repr=False)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.reference(*args, **kwargs)

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    @property
    def fn(self) -> Callable[..., Any]:
        """The reference function (what ``@pdlkit.reference``'s lookup gave as ``.fn``)."""
        return self.reference

    @property
    def typed(self) -> bool:
        return bool(self.schema)

    def __repr__(self) -> str:
        return f"<pdlkit op {self.name}{self.schema or str(self.param_names)} at {self.source}>"


def source_of(fn: Callable[..., Any]) -> str:
    """``file:line`` of a function's definition, for messages: the file and first line
    (its first decorator's) its code object was compiled from, as ``inspect.getsourcelines``
    gives them without reading the file back (it tokenized each kernel's file: 13 ms of a new
    process's plan); a callable without code, its source as ``inspect`` finds it, or its name."""
    code = getattr(inspect.unwrap(fn), "__code__", None)
    if code is not None:
        return f"{code.co_filename}:{code.co_firstlineno}"
    try:
        return f"{inspect.getsourcefile(fn)}:{inspect.getsourcelines(fn)[1]}"
    except (OSError, TypeError):
        return getattr(fn, "__qualname__", repr(fn))


def _params_of_schema(schema: str) -> tuple[Param, ...]:
    parsed = torch._C.parse_schema(f"op{schema}")
    return tuple(Param(a.name, _type_name(a.type)) for a in parsed.arguments)


def _type_name(t: Any) -> str:
    s = str(t)
    if s.startswith("Optional[") or isinstance(t, torch._C.OptionalType):
        return f"{_type_name(t.getElementType())}?"
    if isinstance(t, torch._C.ListType):
        return f"{_type_name(t.getElementType())}[]"
    return s


def declare_op(
    fn: Callable[..., Any],
    *,
    name: str | None = None,
    meta: Callable[..., Any] | None = None,
    examples: Examples | None = None,
    typed: bool = True,
) -> LogicalOp:
    """Build a :class:`LogicalOp` from its reference function. A fully annotated function gives
    a typed op (kernels take their schema from it; ``meta`` is then required); one without
    annotations, or ``typed=False``, gives an untyped op (the ``@pdlkit.reference`` form:
    names only)."""
    where = source_of(fn)
    name = name or fn.__name__
    if not _OP.match(name):
        raise OpDeclarationError(f"{where}: op name {name!r} must be an identifier (dots allowed)")
    sig = inspect.signature(fn)
    kinds = [p.kind for p in sig.parameters.values()]
    if any(k in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD) for k in kinds):
        raise OpDeclarationError(f"{where}: op {name!r}: list every parameter (no *args, **kwargs)")
    annotated = [typed and p.annotation is not p.empty for p in sig.parameters.values()]
    if typed and all(annotated) and annotated and sig.return_annotation is not sig.empty:
        from torch._library.infer_schema import infer_schema

        try:
            schema = infer_schema(fn, mutates_args=())
        except Exception as e:  # torch says which annotation it could not map
            raise OpDeclarationError(f"{where}: op {name!r}: {e}") from None
        if meta is None or not callable(meta):
            raise OpDeclarationError(
                f"{where}: op {name!r}: meta must be a function returning empty tensors of the "
                "output shapes and dtypes"
            )
        params = _params_of_schema(schema)
    elif any(annotated):
        raise OpDeclarationError(
            f"{where}: op {name!r}: annotate every parameter and the return type, or none"
        )
    else:
        schema, params = "", tuple(Param(n, UNTYPED) for n in sig.parameters)
    the_op = LogicalOp(name, params, fn, meta, examples, schema, where, inspect.getdoc(fn) or "")
    with _LOCK:
        _LAST_LOADED[name] = the_op
    return the_op


# what pdlkit.reference's lookup() has always read: the op of that name that was loaded last
# (registries hold their own OpTable; this serves callers that hold no registry)
_LAST_LOADED: dict[str, LogicalOp] = {}
_LOCK = threading.Lock()


def lookup(name: str) -> LogicalOp | None:
    """The op of that name that was loaded last, from any folder (prefer a registry's
    :meth:`~pdlkit.runtime_abi.registry.KernelRegistry.op`)."""
    return _LAST_LOADED.get(name)


def op(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    meta: Callable[..., Any] | None = None,
    examples: Examples | None = None,
) -> Any:
    """Declare a logical op: ``@pdlkit.op(meta=..., examples=...)`` over its reference function
    (see the module's docstring). Put it in an op file of a kernel folder."""
    if fn is not None:
        return declare_op(fn, name=name, meta=meta, examples=examples)
    return lambda f: declare_op(f, name=name, meta=meta, examples=examples)


class OpTable:
    """The ops of one registry, by name; a second op of a name is an error naming both."""

    def __init__(self) -> None:
        self.ops: dict[str, LogicalOp] = {}

    def add(self, new: LogicalOp) -> None:
        old = self.ops.get(new.name)
        if old is None or old is new or old.source == new.source:  # one file, loaded again
            self.ops[new.name] = new
            return
        raise OpDeclarationError(
            f"{new.source}: op {new.name!r} is declared twice: here and at {old.source}; "
            "an op is declared once (rename one, or implement the existing one)"
        )

    def get(self, name: str) -> LogicalOp | None:
        return self.ops.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self.ops

    def names(self) -> list[str]:
        return sorted(self.ops)


def signature_problem(params: Sequence[str], variadic: bool, the_op: LogicalOp) -> str | None:
    """Why a kernel whose Python parameters are ``params`` (then ``*rest`` when ``variadic``)
    cannot implement ``the_op``, or None: the names must be the op's, in its order."""
    want = the_op.param_names
    if variadic and tuple(params) == want[: len(params)]:
        return None
    if not variadic and tuple(params) == want:
        return None
    got = f"({', '.join(params)}{', *rest' if variadic else ''})"
    return (
        f"its parameters {got} are not those of op {the_op.name!r} ({', '.join(want)}) declared "
        f"at {the_op.source}; name them as the op does (a prefix then *rest is fine)"
    )


def schema_problem(kernel_schema: str, the_op: LogicalOp) -> str | None:
    """Why a kernel's own (annotated) schema disagrees with its op's types, or None."""
    if not the_op.typed or not kernel_schema:
        return None
    mine = _params_of_schema(kernel_schema)
    diff = [
        f"{a.name}: {a.type} (op: {b.type})"
        for a, b in zip(mine, the_op.params, strict=False)
        if a.type != b.type
    ]
    if len(mine) != len(the_op.params):
        diff.append(f"{len(mine)} parameters (op: {len(the_op.params)})")
    if not diff:
        return None
    return (
        f"its annotations disagree with op {the_op.name!r} declared at {the_op.source}: "
        + "; ".join(diff)
    )


# -- what a pattern may pass: pdlkit_call's attribute arguments against the op's types --------

_ATTR_FITS = {  # attribute kind -> parameter types it can stand for
    "str": {"str"},
    "int": {"int", "float", "SymInt", "bool"},
    "float": {"float"},
    "bool": {"bool", "int"},
    "list": None,  # any list type
    "unit": None,  # None: an optional parameter
}


def argument_problem(param: Param, attr_kind: str | None) -> str | None:
    """Why a ``pdlkit_call`` argument cannot bind ``param``, or None. ``attr_kind`` is the kind
    of a constant ``pdl.attribute`` (``str``, ``int``, ``float``, ``bool``, ``list``,
    ``unit``), or None for a ``pdl.value`` (checked when the call runs)."""
    if attr_kind is None or param.type == UNTYPED:
        return None
    base = param.type.rstrip("?")
    if attr_kind == "unit":
        return None if param.optional else f"{param.name} ({param.type}) cannot be None"
    if param.is_tensor:
        return f"{param.name} is a {param.type}, the pattern passes a constant {attr_kind}"
    if attr_kind == "list":
        return None if base.endswith("[]") else f"{param.name} is {param.type}, not a list"
    fits = _ATTR_FITS.get(attr_kind) or set()
    if base in fits:
        return None
    return f"{param.name} is {param.type}, the pattern passes a {attr_kind} attribute"

"""Checks on pattern text and PDL ops that MLIR's parser and verifier do not make.

- :func:`nesting_problem`: brackets nested deeper than :data:`MAX_NESTING` levels, aliases
  (``#a1 = [#a0]``) expanded. MLIR's parser recurses once per level and overflows the host's
  stack (SIGSEGV) at a few thousand, so the text is scanned before MLIR sees it.
- :class:`AttributeBounds`: an attribute that aliases make huge or deep when printed.
- :func:`op_name_problem`: an op name the Torch dialect does not register can never match an
  imported graph; the message suggests the closest registered name.

Each returns a message without the ``file:line:col:`` prefix (the caller knows the file and
raises its own error type), or None when all is well.
"""

from __future__ import annotations

import difflib
import functools
import re
import threading
from typing import Any

# the Torch dialect's compile-time constants (natives' is_constant, gen-pattern's literals)
CONSTANT_OPS = frozenset(
    {
        "torch.constant.int", "torch.constant.float", "torch.constant.str", "torch.constant.bool",
        "torch.constant.none", "torch.constant.device", "torch.constant.number",
    }
)  # fmt: skip
MAX_NESTING = 128  # shipped patterns nest at most 5 deep; MLIR crashes at about 8,000

# an alias name (``#a``, ``!t``; a definition when ``=`` follows), a line end, "->", a bracket
_COMMON = r"[#!][A-Za-z_][\w$.]*(?:[ \t]*=(?!=))?|\n|->|[\[\]{}()<>]"
_TOKENS = re.compile(r'"(?:[^"\\\n]|\\.)*"?|//[^\n]*|' + _COMMON)  # strings and comments skipped
_TOKENS_IN_STRINGS = re.compile(r"//[^\n]*|" + _COMMON)  # PDLL: attr<"[...]"> is parsed too
_OPENS = {")": "(", "]": "[", "}": "{"}


def _at(text: str, pos: int, message: str) -> tuple[int, int, str]:
    line = text.count("\n", 0, pos) + 1
    return line, pos - (text.rfind("\n", 0, pos) + 1) + 1, message


def nesting_problem(
    text: str, limit: int = MAX_NESTING, in_strings: bool = False
) -> tuple[int, int, str] | None:
    """``(line, col, message)`` where ``text`` first nests deeper than ``limit``, else None.

    Aliases count as what they stand for: ``#a1 = [#a0]`` nests one level deeper than ``#a0``
    (a chain of 100,000 such aliases crashes MLIR's parser too). Brackets inside ``//``
    comments do not count, nor inside strings unless ``in_strings`` (PDLL's ``attr<"...">``
    holds MLIR text); ``<`` counts until a ``>`` closes it (a ``<`` that is a comparison is
    dropped when an enclosing bracket closes).
    """
    stack: list[str] = []
    depth_of: dict[str, int] = {}  # alias -> how deep its value nests, aliases expanded
    defining, value_at = "", 0  # the alias whose value is being read, where that value starts
    why = "pdlkit refuses such text before parsing it (MLIR's parser would overflow the stack)"
    for m in (_TOKENS_IN_STRINGS if in_strings else _TOKENS).finditer(text):
        tok = m.group()
        if tok[0] in "#!":
            if tok.endswith("=") and not stack:  # a definition starts
                defining, value_at = tok.rstrip(" \t="), m.end()
                depth_of[defining] = 0
                continue
            reach = len(stack) + depth_of.get(tok, -limit)
            if tok != defining and reach > 0:
                if defining:
                    depth_of[defining] = max(depth_of[defining], reach)
                if reach > limit:
                    return _at(
                        text,
                        m.start(),
                        f"alias {tok} nests deeper than {limit} levels once expanded; {why}",
                    )
        elif tok == "\n":
            if defining and not stack and text[value_at : m.start()].strip():
                defining = ""  # the value is complete
        elif tok in ("(", "[", "{", "<"):
            stack.append(tok)
            depth_of[defining] = max(depth_of.get(defining, 0), len(stack))  # "": no alias
            if len(stack) > limit:
                return _at(text, m.start(), f"brackets nest deeper than {limit} levels; {why}")
        elif tok == ">" and stack and stack[-1] == "<":
            stack.pop()
        elif tok in _OPENS and _OPENS[tok] in stack:
            while stack.pop() != _OPENS[tok]:
                pass
    return None


# -- attributes after alias expansion -----------------------------------------------------------

MAX_ATTRIBUTE_VALUES = 100_000


def _children(x: Any) -> list[Any]:
    """The attributes and types an attribute (or type) is printed with."""
    from torch_mlir import ir

    if isinstance(x, ir.ArrayAttr):
        return list(x)
    if isinstance(x, ir.DictAttr):
        return [named.attr for named in x]
    if isinstance(x, ir.TypeAttr):
        return [x.value]
    if isinstance(x, ir.TupleType):
        return [x.get_type(i) for i in range(x.num_types)]
    if isinstance(x, ir.FunctionType):
        return [*x.inputs, *x.results]
    return []


class AttributeBounds:
    """Values and nesting depth of attributes once aliases are expanded.

    MLIR stores an alias (``#a1 = [#a0, #a0]``) once, but prints it in full wherever it is
    used (errors, ``explain``, ``lint``): nine levels of nine-fold aliases print as 387 million
    values, and a chain of 10,000 one-element aliases prints recursively 10,000 deep. Measured
    without recursion, each distinct attribute once (attributes are uniqued)."""

    def __init__(self) -> None:
        self._memo: dict[Any, tuple[int, int]] = {}  # attribute or type -> (values, depth)

    def problem(self, op: Any) -> str | None:
        """Why one of ``op``'s attributes is too large to print, or None."""
        attrs = op.attributes
        for i in range(len(attrs)):
            named = attrs[i]
            values, depth = self._measure(named.attr)
            if values > MAX_ATTRIBUTE_VALUES:
                return (
                    f"attribute {named.name!r} holds more than {MAX_ATTRIBUTE_VALUES:,} values "
                    "once its aliases are expanded"
                )
            if depth > MAX_NESTING:
                return (
                    f"attribute {named.name!r} nests deeper than {MAX_NESTING} levels once its "
                    "aliases are expanded"
                )
        return None

    def _measure(self, root: Any) -> tuple[int, int]:
        memo = self._memo
        stack = [(root, False)]
        while stack:
            node, expanded = stack.pop()
            if node in memo:
                continue
            kids = _children(node)
            if not expanded:
                stack.append((node, True))
                stack.extend((k, False) for k in kids if k not in memo)
                continue
            values = min(1 + sum(memo[k][0] for k in kids), MAX_ATTRIBUTE_VALUES + 1)
            memo[node] = (values, 1 + max((memo[k][1] for k in kids), default=0))
        return memo[root]


# -- op names -----------------------------------------------------------------------------------

_LOCK = threading.Lock()


def register_torch_dialect(ctx: Any) -> None:
    """The Torch dialect in ``ctx``. ``torch_mlir.dialects.torch`` re-exports this C function
    beside its 1,700 generated op classes, whose import costs 0.04-0.1 s of a process's first
    compile (the 2-core Xeon); neither pattern checks nor the FX import use those classes."""
    try:
        from torch_mlir._mlir_libs._torchMlir import register_dialect
    except ImportError:  # a torch-mlir laid out otherwise: the public module
        from torch_mlir.dialects.torch import register_dialect
    register_dialect(ctx)


@functools.cache
def _torch_context() -> Any:
    from torch_mlir import ir

    ctx = ir.Context()
    register_torch_dialect(ctx)
    return ctx


@functools.cache
def _registered(name: str) -> bool:
    with _LOCK:
        return bool(_torch_context().is_registered_operation(name))


@functools.cache
def torch_op_names() -> tuple[str, ...]:
    """Every operation the Torch dialect defines (``torch.aten.linear``, ...), sorted."""
    from torch_mlir.dialects import torch as torch_d

    names = {
        getattr(c, "OPERATION_NAME", None) for c in vars(torch_d).values() if isinstance(c, type)
    }
    return tuple(sorted(n for n in names if isinstance(n, str)))


def _namespace(name: str) -> str:
    """``torch.aten.`` for ``torch.aten.mul.Tensor``; '' for names outside ``torch.<ns>.``."""
    parts = name.split(".")
    return f"{parts[0]}.{parts[1]}." if len(parts) > 2 and parts[0] == "torch" else ""


def closest_op_names(name: str, n: int = 3) -> list[str]:
    """Registered Torch-dialect names closest to ``name``, best first."""
    names = torch_op_names()
    by_lower = {x.lower(): x for x in names}
    out = [by_lower[name.lower()]] if name.lower() in by_lower else []
    base = name.rsplit(".", 1)[0]
    if base != name and _namespace(base) and _registered(base):
        out.append(base)  # an overload the op does not have
    if _registered(f"torch.{name}"):
        out.append(f"torch.{name}")  # the dialect prefix left out
    ns = _namespace(name)
    pool = [x[len(ns) :].lower() for x in names if x.startswith(ns)]
    for rest in difflib.get_close_matches(name[len(ns) :].lower(), pool, n=n, cutoff=0.6):
        out.append(by_lower[ns + rest])
    return list(dict.fromkeys(out))[:n]


def _aten_schema(qualified: str, overload: str) -> Any:
    import torch

    try:
        return torch._C._get_schema(qualified, overload)
    except (RuntimeError, ValueError):  # no such op or overload
        return None


def _scalar_only(name: str) -> str | None:
    """``torch.aten.mul`` is ``aten::mul(Scalar a, Scalar b) -> Scalar``: numbers, not tensors.
    The schema's text when ``name`` is such an op and ``name.Tensor`` exists, else None."""
    parts = name.split(".")
    if len(parts) != 3 or parts[:2] != ["torch", "aten"] or not _registered(f"{name}.Tensor"):
        return None
    schema = _aten_schema(f"aten::{parts[2]}", "")
    if schema is None:
        return None
    types = [str(a.type) for a in [*schema.arguments, *schema.returns]]
    return None if any("Tensor" in t for t in types) else str(schema)


def _outside_dialect(name: str) -> str | None:
    """``aten.X.overload`` when ``name`` is ``torch.aten.X.overload``, an op PyTorch has and the
    Torch dialect does not (such ops import as ``torch.operator``)."""
    parts = name.split(".")
    if len(parts) not in (3, 4) or parts[0] != "torch":
        return None
    overload = parts[3] if len(parts) == 4 else ""
    if _aten_schema(f"{parts[1]}::{parts[2]}", overload) is None:
        return None
    return ".".join(parts[1:])


@functools.cache
def op_name_problem(name: str) -> str | None:
    """Why a ``pdl.operation`` naming ``name`` can never match an imported graph, or None."""
    if _registered(name):
        schema = _scalar_only(name)
        if schema is None:
            return None
        return (
            f"op {name!r} is {schema}, which works on Python numbers, not tensors; "
            f"did you mean {name + '.Tensor'!r}?"
        )
    msg = f"unknown op {name!r}: the Torch dialect registers no such operation"
    generic = _outside_dialect(name)
    if generic is not None:
        return (
            f"{msg}; PyTorch's {generic} imports as the generic op: "
            f'pdl.operation "torch.operator" {{"name" = %n}} with %n = pdl.attribute = "{generic}"'
        )
    close = closest_op_names(name)
    if close:
        return f"{msg}; did you mean {' or '.join(repr(c) for c in close)}?"
    return (
        f"{msg} (and none is close); ops the dialect does not define import as "
        '"torch.operator" with a "name" attribute'
    )


def nested_ops(op: Any) -> Any:
    """Every operation inside ``op``'s regions, depth first (a pattern's ops, its rewrite's)."""
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                yield inner.operation
                yield from nested_ops(inner.operation)

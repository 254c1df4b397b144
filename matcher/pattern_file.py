"""One pattern file (``*.pdl.mlir``, or ``*.pdll`` compiled to PDL) -> its :class:`Pattern` records.

    before: patterns/x86/qlinear.pdl.mlir, with `pdl.pattern @qlinear_relu : benefit(3) {...}`
    after:  [Pattern(name="qlinear_relu", file=..., line=12, col=1, benefit=3,
            root="torch.aten.relu", calls=("qlinear_q",), op_names=frozenset({...}))]

Every error names ``file:line:col``; besides MLIR's own parse and verify errors, loading
refuses text nested too deep for MLIR's parser, op names the Torch dialect does not register,
and natives pdlkit does not define (:mod:`pdlkit.matcher.pdl_checks`). Manifests
(matcher/manifest.py) and folders (matcher/patterns.py) build on this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdlkit.matcher.pdl_checks import AttributeBounds, nested_ops, nesting_problem, op_name_problem
from pdlkit.matcher.pdll import PdllError, compile_pdll

from pdlkit.errors import PdlkitError


class PatternError(PdlkitError, ValueError):
    """A pattern file or manifest is invalid; the message starts with ``file:line:col:``."""


@dataclass(frozen=True)
class CallSite:
    """One ``pdlkit_call``: the op it names, each argument's kind (a constant attribute's:
    str, int, float, bool, list, unit; None for a ``pdl.value``), and where it stands."""

    op: str
    kinds: tuple[str | None, ...]
    line: int
    col: int


@dataclass(frozen=True)
class Pattern:
    """One ``pdl.pattern`` with the settings its manifest gave it."""

    name: str
    file: Path
    line: int
    col: int
    benefit: int
    root: str | None  # the root op's name ("torch.aten.gelu"), None if the root is not named
    enabled: bool = True
    targets: tuple[str, ...] = ()
    calls: tuple[str, ...] = ()  # logical ops its pdlkit_call rewrites name
    call_sites: tuple[CallSite, ...] = ()  # those calls, with their arguments' kinds
    # op names the matcher part can match; None if some pdl.operation names no op (matches any)
    op_names: frozenset[str] | None = None
    kernel: str | None = None  # kernel pin
    pin_source: str = ""  # "manifest.yaml:7" where the pin was written
    # verification (verify="first_call"): (rtol, atol) overriding the per-dtype defaults, and
    # seconds a kernel may take on its verified call
    tolerance: tuple[float | None, float | None] | None = None
    timeout: float | None = None

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    def active_on(self, target: Any) -> bool:
        return self.enabled and (not self.targets or any(target.matches(t) for t in self.targets))


# -- PDL files ----------------------------------------------------------------------------------


def _diag_text(err: Exception, path: Path) -> str:
    diags = getattr(err, "error_diagnostics", None) or []
    out = []
    for d in diags:
        loc = str(d.location)  # loc("file":4:8)
        pos = loc[loc.rfind('":') + 2 : -1] if '":' in loc else "1:1"
        out.append(f"{path}:{pos}: {d.message}")
    return "\n".join(out) or f"{path}:1:1: {err}"


def check_utf8(path: Path) -> bytes:
    data = path.read_bytes()
    try:
        data.decode()
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise PatternError(
            f"{path}:{line}:{col}: not UTF-8 text: {e.reason} at byte {e.start}"
        ) from e
    return data


def _position(op: Any) -> tuple[int, int]:
    loc = op.location
    return (loc.start_line, loc.start_col) if hasattr(loc, "start_line") else (1, 1)


def read_pdl_module(path: Path, ctx: Any) -> Any:
    """The PDL module of a pattern file: parsed ``*.pdl.mlir``, or ``*.pdll`` compiled to PDL."""
    from torch_mlir import ir

    if not path.is_file():
        raise PatternError(f"{path}:1:1: pattern file does not exist")
    # MLIR accepts other bytes in strings, which Python cannot read back
    text = check_utf8(path).decode()
    try:
        if path.suffix == ".pdll":
            try:
                return ir.Module.parse(compile_pdll(path), ctx)
            except PdllError as e:
                raise PatternError(str(e)) from e
        deep = nesting_problem(text)
        if deep is not None:
            raise PatternError(f"{path}:{deep[0]}:{deep[1]}: {deep[2]}")
        return ir.Module.parseFile(str(path), ctx)
    except ir.MLIRError as e:
        raise PatternError(_diag_text(e, path)) from e


def parse_pdl_file(path: Path, ctx: Any | None = None) -> list[Pattern]:
    """Parse and verify one ``*.pdl.mlir`` (or ``*.pdll``) file; one :class:`Pattern` per ``pdl.pattern``."""
    from torch_mlir import ir

    ctx = ctx or ir.Context()
    module = read_pdl_module(path, ctx)
    patterns = []
    bounds = AttributeBounds()
    for i, op in enumerate(module.body.operations):
        op = op.operation
        line, col = _position(op)
        if op.name != "pdl.pattern":
            raise PatternError(
                f"{path}:{line}:{col}: expected pdl.pattern at top level, found {op.name}"
            )
        _check_ops(path, op, bounds)
        attrs = op.attributes
        name = attrs["sym_name"].value if "sym_name" in attrs else f"{path.name.split('.')[0]}_{i}"
        sites = call_sites(path, op)
        patterns.append(
            Pattern(
                name=name,
                file=path,
                line=line,
                col=col,
                benefit=attrs["benefit"].value,
                root=_root_name(op),
                call_sites=sites,
                calls=tuple(c.op for c in sites),
                op_names=_matched_op_names(op),
            )
        )
    if not patterns:
        raise PatternError(f"{path}:1:1: no pdl.pattern in file")
    return patterns


def _check_ops(path: Path, pattern_op: Any, bounds: AttributeBounds) -> None:
    """Every native a pattern calls must exist, and every op it names: MLIR would only find out
    while matching (a pattern that names no registered op never matches). No attribute may be
    too large to print."""
    from pdlkit.matcher.natives import CONSTRAINTS

    for op in nested_ops(pattern_op):
        too_large = bounds.problem(op)
        if too_large is not None:
            line, col = _position(op)
            raise PatternError(f"{path}:{line}:{col}: {too_large}")
        if op.name == "pdl.operation" and "opName" in op.attributes:
            problem = op_name_problem(str(op.attributes["opName"].value))
            if problem is not None:
                line, col = _position(op)
                raise PatternError(f"{path}:{line}:{col}: {problem}")
            continue
        if op.name == "pdl.apply_native_constraint":
            known, kind = set(CONSTRAINTS), "constraint"
        elif op.name == "pdl.apply_native_rewrite" or (
            op.name == "pdl.rewrite" and "name" in op.attributes
        ):
            known, kind = {"pdlkit_call"}, "rewrite"
        else:
            continue
        name = op.attributes["name"].value
        if name not in known:
            line, col = _position(op)
            raise PatternError(
                f"{path}:{line}:{col}: unknown native {kind} {name!r}; known: {', '.join(sorted(known))}"
            )


def _matched_op_names(pattern_op: Any) -> frozenset[str] | None:
    body = [o.operation for o in pattern_op.regions[0].blocks[0].operations]
    names = set()
    for op in body:
        if op.name == "pdl.operation":
            if "opName" not in op.attributes:
                return None
            names.add(str(op.attributes["opName"].value))
    return frozenset(names)


def call_sites(path: Path, pattern_op: Any) -> tuple[CallSite, ...]:
    """The pattern's ``pdlkit_call`` sites: the logical op each names (a constant string
    ``pdl.attribute``), the kind of each argument, where it stands."""
    from torch_mlir import ir

    out = []
    for op in nested_ops(pattern_op):
        if op.name == "pdl.apply_native_rewrite":
            first = 0
        elif op.name == "pdl.rewrite":
            first = 1  # after the root
        else:
            continue
        if "name" not in op.attributes or op.attributes["name"].value != "pdlkit_call":
            continue
        operands = list(op.operands)[first:]
        if not operands:
            continue
        owner = operands[0].owner.operation
        if owner.name != "pdl.attribute" or "value" not in owner.attributes:
            continue
        value = owner.attributes["value"]
        if not isinstance(value, ir.StringAttr):
            line, col = _position(owner)
            raise PatternError(
                f"{path}:{line}:{col}: pdlkit_call's first argument names the logical "
                f'op and must be a string, e.g. pdl.attribute = "linear_relu"; got {value}'
            )
        args = operands[1:]
        while args and str(args[-1].type) == "!pdl.operation":
            args = args[:-1]  # the ops the call replaces (one per result)
        line, col = _position(op)
        out.append(CallSite(value.value, tuple(_arg_kind(a) for a in args), line, col))
    return tuple(out)


def _arg_kind(v: Any) -> str | None:
    """A constant ``pdl.attribute`` argument's kind (str, int, float, bool, list, unit); None
    for a ``pdl.value``."""
    from torch_mlir import ir

    owner = v.owner.operation
    if owner.name != "pdl.attribute" or "value" not in owner.attributes:
        return None
    value = owner.attributes["value"]
    kinds = (
        (ir.StringAttr, "str"), (ir.BoolAttr, "bool"), (ir.IntegerAttr, "int"),
        (ir.FloatAttr, "float"), (ir.ArrayAttr, "list"), (ir.UnitAttr, "unit"),
    )  # fmt: skip
    return next((kind for cls, kind in kinds if isinstance(value, cls)), "attribute")


def _root_name(pattern_op: Any) -> str | None:
    ops = [o.operation for o in pattern_op.regions[0].blocks[0].operations]
    rewrite = next((o for o in ops if o.name == "pdl.rewrite"), None)
    if rewrite is None or len(rewrite.operands) == 0:
        return None
    root = rewrite.operands[0].owner.operation
    if "opName" not in root.attributes:
        return None
    return str(root.attributes["opName"].value)

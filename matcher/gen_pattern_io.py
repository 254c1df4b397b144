"""``pdlkit gen-pattern``'s files: the pattern, and the reference function beside it.

    pdlkit gen-pattern refs.py:linear_relu --example-shapes 4x8,6x8,6 --op linear_relu \\
        -o my/patterns/linear_relu.pdl.mlir

writes ``my/patterns/linear_relu.pdl.mlir`` (the pattern, :mod:`pdlkit.matcher.gen_pattern`)
and ``my/patterns/linear_relu.reference.py`` (the function as ``@pdlkit.reference`` of the
logical op: the semantics ``pdlkit abi-check`` verifies kernels against). Missing folders
of ``-o`` are created.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from pdlkit.matcher.gen_pattern import GenPatternError, pattern_from_function
from pdlkit.matcher.op_calls import text_problems
from pdlkit.runtime_abi.dtypes import DTYPES, dtype_named
from pdlkit.runtime_abi.ops import LogicalOp, OpTable
from pdlkit.runtime_abi.registry import KernelLoadError, KernelRegistry

from pdlkit import config
from pdlkit.targets import TargetError, load_target

# -- the reference stored beside the pattern ----------------------------------------------------


def reference_source(fn: Callable[..., Any], example_inputs: Sequence[Any], *, op: str) -> str:
    """A Python file registering ``fn`` as ``@pdlkit.reference(op)``, with example inputs of
    the traced shapes: self-contained (the function's module imports come along)."""
    try:
        src = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        raise GenPatternError(
            f"cannot read the source of {fn.__qualname__}: define it in a .py file"
        ) from None
    imports: list[str] = []
    module = inspect.getmodule(fn)
    try:
        tree = ast.parse(inspect.getsource(module)) if module is not None else None
    except (OSError, TypeError):
        tree = None
    if tree is not None:
        for stmt in tree.body:
            if isinstance(stmt, ast.Import | ast.ImportFrom) and not (
                isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__"
            ):
                imports.append(ast.unparse(stmt))
            elif isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Attribute):
                imports.append(ast.unparse(stmt))  # aliases such as F = torch.nn.functional
    shapes = []
    for x in example_inputs:
        if not isinstance(x, torch.Tensor):
            shapes.append(repr(x))
        elif x.dtype.is_floating_point:
            shapes.append(f"torch.randn({tuple(x.shape)}, generator=g).to(dtype or {x.dtype})")
        elif x.dtype == torch.bool:
            shapes.append(f"torch.rand({tuple(x.shape)}, generator=g) > 0.5")
        else:
            lo, hi = (0, 256) if x.dtype == torch.uint8 else (-128, 128)
            shapes.append(
                f"torch.randint({lo}, {hi}, {tuple(x.shape)}, generator=g, dtype={x.dtype})"
            )
    lines = [
        f'"""Reference semantics of logical op {op!r}: kernels for it are verified against',
        f"{fn.__name__} (written by pdlkit gen-pattern next to the pattern it generated).",
        '"""',
        "",
        *dict.fromkeys(["import torch", "import pdlkit", *imports]),
        "",
        "",
        "def _examples(dtype):",
        "    g = torch.Generator().manual_seed(0)",
        f"    return [({', '.join(shapes)},)]",
        "",
        "",
        f"@pdlkit.reference({op!r}, examples=_examples)",
        src.rstrip(),
        "",
    ]
    return "\n".join(lines)


def reference_path(pattern_path: Path) -> Path:
    """``linear_relu.pdl.mlir`` -> ``linear_relu.reference.py`` (same folder)."""
    stem = pattern_path.name.removesuffix(".pdl.mlir").removesuffix(".pdll")
    return pattern_path.with_name(f"{stem}.reference.py")


def _check_against_op(text: str, path: Path, op: str, given: LogicalOp | None) -> str:
    """Where op ``op`` is declared (the op file the function came from, else the configured
    kernel folders; "" where it is not); a :class:`GenPatternError` naming the pattern's line
    and the op's when the generated ``pdlkit_call`` does not fit it (count and kinds)."""
    table = OpTable()
    if given is not None and given.name == op:
        table.add(given)
    else:
        try:
            table = KernelRegistry.from_folders(config.kernel_paths(None)).op_table
        except (KernelLoadError, config.PathError):
            return ""  # check and lint report broken folders; the pattern is still written
    the_op = table.get(op)
    if the_op is None:
        return ""
    problems = text_problems(text, path, table)
    if problems:
        raise GenPatternError("; ".join(problems))
    return the_op.source


# -- command line helpers -----------------------------------------------------------------------


def load_function(spec: str) -> Callable[..., Any]:
    """``package.module:function`` (the current directory first) or ``file.py:function``."""
    try:
        fn, where = load_target(spec)
    except TargetError as e:
        raise GenPatternError(str(e)) from None
    if not callable(fn):
        raise GenPatternError(f"{where} is not a function")
    return fn


def write_pattern(
    function: str,
    example_shapes: str,
    *,
    op: str,
    out: str | Path | None = None,
    name: str | None = None,
    benefit: int = 1,
    dtype: str = "float32",
    commutative: bool = False,
) -> list[Path]:
    """``pdlkit gen-pattern``: the pattern to ``out`` (and its reference beside it), or to stdout."""
    fn = load_function(function)
    given = fn if isinstance(fn, LogicalOp) else None  # an op file's @pdlkit.op
    fn = given.reference if given is not None else fn
    inputs = parse_shapes(example_shapes, dtype)
    text = pattern_from_function(
        fn,
        inputs,
        op=op,
        name=name,
        benefit=benefit,
        source=function.rsplit("/", 1)[-1],
        commutative=commutative,
    )
    path = Path(out) if out is not None else Path("<stdout>")
    declared = _check_against_op(text, path, op, given)
    if out is None:
        print(text, end="")
        return []
    if not path.name.endswith(".pdl.mlir"):
        raise GenPatternError(f"{out}: the output file's name must end in .pdl.mlir")
    ref = reference_path(path)
    semantics = (
        f"op {op!r} declared at {declared}"
        if declared
        else f"{ref.name} (@pdlkit.reference({op!r}))"
    )
    text = text.replace("\npdl.pattern", f"\n// Reference semantics: {semantics}.\npdl.pattern", 1)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if declared:  # the op's own declaration is the reference: a second one would clash
            return [path]
        ref.write_text(reference_source(fn, inputs, op=op))
    except OSError as e:
        raise GenPatternError(f"{out}: cannot write: {e.strerror or e}") from None
    return [path, ref]


_KNOWN = ", ".join(d.names[0] for d in DTYPES)


_SCALARS: dict[str, Callable[[str], Any]] = {
    "int": int,
    "float": float,
    "str": str,
    "bool": lambda t: _bool(t),
}


def _bool(text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise ValueError(text)
    return text.lower() == "true"


_SCALAR_DEFAULTS: dict[str, Any] = {"int": 0, "float": 1.0, "str": "", "bool": False}


def parse_shapes(text: str, default_dtype: str = "float32") -> list[Any]:
    """``"4x8,6x8,6"`` (one shape per parameter, ``x`` between dims, ``:int8`` for a dtype)
    -> example tensors; ``float``, ``int``, ``str=tanh``, ``bool=true`` give Python scalars."""
    out: list[Any] = []
    for item in [t.strip() for t in text.split(",") if t.strip()]:
        kind, eq, literal = item.partition("=")
        if kind in _SCALARS:
            try:
                out.append(_SCALARS[kind](literal) if eq else _SCALAR_DEFAULTS[kind])
            except ValueError:
                raise GenPatternError(f"example {item!r}: {literal!r} is not a {kind}") from None
            continue
        dims, _, dt = item.partition(":")
        dtype = dtype_named(dt or default_dtype)
        if dtype is None:
            raise GenPatternError(f"example shape {item!r}: unknown dtype {dt!r} (known: {_KNOWN})")
        try:
            shape = [int(d) for d in dims.split("x")] if dims not in ("", "scalar") else []
        except ValueError:
            raise GenPatternError(
                f"example shape {item!r}: expected dims like 4x8, e.g. --example-shapes 4x8,6x8,6"
            ) from None
        if dtype.is_floating_point:
            out.append(torch.randn(shape).to(dtype))
        else:
            out.append(torch.zeros(shape, dtype=dtype))
    return out

"""A pattern's ``pdlkit_call`` sites against the logical ops they name.

    before: patterns/x86/qlinear.pdl.mlir:57 passed 13 arguments to "qlinear_q" and nothing
            compared them with the op until a model matched (then only by count)
    after:  call_problems(pattern, ops) -> [("…qlinear.pdl.mlir:57:5", "pattern
            'qlinear_relu_q' passes 12 arguments to op 'qlinear_q' (…:150), which takes 13: …")]

Checked without a model (``pdlkit check``, ``lint``, ``gen-pattern``): the number of
arguments, and each constant ``pdl.attribute`` against the op's parameter type (a string where
a ``str`` goes, no constant where a tensor goes, ``unit`` only for an optional parameter).
Values (``pdl.value``) are checked when a call runs. Ops declared without types
(``@pdlkit.reference``) are checked by count only.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdlkit.matcher.pattern_file import Pattern, read_pdl_module
from pdlkit.matcher.pdl_checks import nested_ops
from pdlkit.runtime_abi.ops import OpTable, argument_problem


@dataclass(frozen=True)
class CallSite:
    """One ``pdlkit_call``: the op it names, each argument's attribute kind (None for a
    ``pdl.value``), and where it stands."""

    op: str
    kinds: tuple[str | None, ...]
    line: int
    col: int


def _attr_kind(value: Any) -> str:
    from torch_mlir import ir

    for cls, kind in (
        (ir.StringAttr, "str"),
        (ir.BoolAttr, "bool"),
        (ir.IntegerAttr, "int"),
        (ir.FloatAttr, "float"),
        (ir.ArrayAttr, "list"),
        (ir.UnitAttr, "unit"),
    ):
        if isinstance(value, cls):
            return kind
    return "attribute"


def _kind(v: Any) -> str | None:
    owner = v.owner.operation
    if owner.name == "pdl.attribute" and "value" in owner.attributes:
        return _attr_kind(owner.attributes["value"])
    return None


def call_sites(pattern_op: Any) -> list[CallSite]:
    """The ``pdlkit_call`` sites of one ``pdl.pattern`` op, in order."""
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
        name_attr = operands[0].owner.operation
        if name_attr.name != "pdl.attribute" or "value" not in name_attr.attributes:
            continue
        value = name_attr.attributes["value"]
        if not isinstance(value, ir.StringAttr):
            continue  # the loader reports it
        args = operands[1:]
        while args and str(args[-1].type) == "!pdl.operation":
            args = args[:-1]  # the ops the call replaces (one per result)
        loc = op.location
        line, col = (loc.start_line, loc.start_col) if hasattr(loc, "start_line") else (1, 1)
        out.append(CallSite(value.value, tuple(_kind(a) for a in args), line, col))
    return out


def sites_by_pattern(file: Path) -> dict[str, list[CallSite]]:
    """Every pattern of ``file`` by name, with its call sites (read once per file version)."""
    st = file.stat()
    return _sites(file, st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=256)
def _sites(file: Path, mtime_ns: int, size: int) -> dict[str, list[CallSite]]:
    from torch_mlir import ir

    module = read_pdl_module(file, ir.Context())
    out = {}
    for op in module.body.operations:
        op = op.operation
        if op.name == "pdl.pattern" and "sym_name" in op.attributes:
            out[ir.StringAttr(op.attributes["sym_name"]).value] = call_sites(op)
    return out


def site_problems(
    file: Path, name: str, sites: list[CallSite], ops: OpTable
) -> list[tuple[str, str]]:
    """``(file:line:col, message)`` for each call of pattern ``name`` that its op refuses."""
    out = []
    for s in sites:
        the_op = ops.get(s.op)
        if the_op is None:
            continue  # an unknown op is reported by the caller (no kernel, no op)
        where = f"{file}:{s.line}:{s.col}"
        if len(s.kinds) != len(the_op.params):
            out.append(
                (
                    where,
                    f"pattern {name!r} passes {len(s.kinds)} arguments to op {s.op!r} "
                    f"({the_op.source}), which takes {len(the_op.params)}: "
                    f"{', '.join(the_op.param_names)}",
                )
            )
            continue
        for param, kind in zip(the_op.params, s.kinds, strict=True):
            why = argument_problem(param, kind)
            if why:
                out.append(
                    (where, f"pattern {name!r} calls op {s.op!r} ({the_op.source}) wrongly: {why}")
                )
    return out


def text_problems(text: str, file: Path, ops: OpTable) -> list[str]:
    """``file:line:col: message`` for each call in PDL ``text`` (not written yet: gen-pattern)
    that its op refuses."""
    from torch_mlir import ir

    module = ir.Module.parse(text, ir.Context())
    out = []
    for op in module.body.operations:
        op = op.operation
        if op.name == "pdl.pattern" and "sym_name" in op.attributes:
            name = ir.StringAttr(op.attributes["sym_name"]).value
            out += [f"{w}: {m}" for w, m in site_problems(file, name, call_sites(op), ops)]
    return out


def call_problems(pattern: Pattern, ops: OpTable) -> list[tuple[str, str]]:
    """The problems of one loaded pattern's calls (its file is read again)."""
    if not pattern.calls:
        return []
    sites = sites_by_pattern(pattern.file).get(pattern.name, [])
    return site_problems(pattern.file, pattern.name, sites, ops)

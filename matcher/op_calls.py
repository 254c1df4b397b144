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

from pathlib import Path

from pdlkit.matcher.pattern_file import CallSite, Pattern, call_sites
from pdlkit.runtime_abi.ops import OpTable, argument_problem


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
            sites = list(call_sites(file, op))
            out += [f"{w}: {m}" for w, m in site_problems(file, name, sites, ops)]
    return out


def call_problems(pattern: Pattern, ops: OpTable) -> list[tuple[str, str]]:
    """The problems of one loaded pattern's calls."""
    return site_problems(pattern.file, pattern.name, list(pattern.call_sites), ops)

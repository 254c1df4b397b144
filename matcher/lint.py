"""``pdlkit lint``: static checks over a pattern set, before any model runs.

    $ pdlkit lint patterns/ kernels/
    patterns/a.pdl.mlir:3: error: linear_relu and lr2 (patterns/b.pdl.mlir:1) can claim the same torch.aten.relu with equal benefit 2; load order decides [equal-benefit]
    patterns/a.pdl.mlir:9: error: plain is shadowed by fused (a.pdl.mlir:3, benefit 3): every match of plain is a match of fused [shadowed]
    1 error(s), 0 warning(s)

Checks (each finding names ``file:line``):

- ``equal-benefit``: two enabled patterns can claim the same root op with equal benefit (their
  ops along every shared operand path agree, no constraint contradicts, and their targets meet
  on the host or a named target): load order decides.
- ``shadowed``: a higher-benefit pattern matches wherever a lower one does (same root, its ops
  and constraints a subset of the lower one's), so the lower one never fires.
- ``unknown-op``: a ``pdlkit_call`` names a logical op that no kernel implements and no op
  file declares.
- ``op-call``: a ``pdlkit_call`` passes a number of arguments its op does not take, or a
  constant of the wrong kind (a string for a tensor, None for a required parameter).
- ``unused-native``: a native declared in a ``.pdll`` file, or a ``pdl.attribute`` in a PDL file,
  that nothing uses (warning).
- ``duplicate-name``: two files define a pattern of the same name (loading both fails).
- ``missing-file``: a manifest lists a file that does not exist.
- ``load``: a file that does not load at all (the loader's own message).

Structure is compared on operand paths from the root (``relu <-0- linear <-1- dequantize``):
an approximation that never misses a real overlap of two patterns' op trees.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pdlkit.matcher.manifest import entry_file, yaml_with_lines
from pdlkit.matcher.op_calls import call_problems
from pdlkit.matcher.patterns import (
    Pattern,
    PatternError,
    load_patterns,
    nested_ops,
    pattern_roots,
    pattern_sources,
    read_pdl_module,
    selected_twice,
)
from pdlkit.runtime_abi.capability import NAMED, host
from pdlkit.runtime_abi.walk import load_paths

from pdlkit import config


@dataclass(frozen=True)
class Finding:
    file: Path
    line: int
    severity: str  # "error" or "warning"
    check: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.severity}: {self.message} [{self.check}]"


# -- the shape of one pattern -------------------------------------------------------------------

Path_ = tuple[Any, ...]


@dataclass
class Shape:
    """Op names by operand path from the root, and constraints over those paths."""

    ops: dict[Path_, str] = field(default_factory=dict)
    constraints: set[tuple[str, tuple[Any, ...]]] = field(default_factory=set)


_EXCLUSIVE = {"has_dtype", "has_rank", "constant_equals", "dim_equals"}


def _key(v: Any) -> tuple[int, int]:
    owner = v.owner
    return hash(owner.operation if hasattr(owner, "operation") else owner), getattr(
        v, "result_number", 0
    )


def shape_of(pattern_op: Any) -> Shape:
    """Walk a ``pdl.pattern`` from its rewrite root along operand edges."""
    body = [o.operation for o in pattern_op.regions[0].blocks[0].operations]
    rewrite = next((o for o in body if o.name == "pdl.rewrite"), None)
    shape = Shape()
    if rewrite is None or len(rewrite.operands) == 0:
        return shape
    where: dict[tuple[int, int], Path_] = {}  # value -> the first path it was reached at

    def visit(op: Any, path: Path_) -> None:
        if path in shape.ops:
            return
        name = str(op.attributes["opName"].value) if "opName" in op.attributes else "*"
        shape.ops[path] = name
        where.setdefault((hash(op), 0), path)
        for j, v in enumerate(op.operands):
            src = v.owner.operation
            if src.name in ("pdl.result", "pdl.results"):
                idx = src.attributes["index"].value if "index" in src.attributes else "all"
                parent = src.operands[0].owner.operation
                where.setdefault(_key(v), (*path, (j, idx)))
                visit(parent, (*path, (j, idx)))
            elif src.name == "pdl.operation":  # an op used as a value range (PDLL)
                visit(src, (*path, (j, "all")))
            else:
                where.setdefault(_key(v), (*path, (j,)))

    visit(rewrite.operands[0].owner.operation, ())
    for o in body:
        if o.name != "pdl.apply_native_constraint":
            continue
        args: list[Any] = []
        for v in o.operands:
            src = v.owner.operation
            if src.name == "pdl.attribute" and "value" in src.attributes:
                args.append(("=", str(src.attributes["value"])))
            else:
                args.append(where.get(_key(v), ("?", _key(v))))
        shape.constraints.add((str(o.attributes["name"].value), tuple(args)))
    return shape


def _contradict(a: Shape, b: Shape) -> bool:
    for path in a.ops.keys() & b.ops.keys():
        x, y = a.ops[path], b.ops[path]
        if "*" not in (x, y) and x != y:
            return True
    for name, args in a.constraints:
        operands = tuple(x for x in args if not (isinstance(x, tuple) and x[:1] == ("=",)))
        for name2, args2 in b.constraints:
            if {name, name2} == {"is_none", "is_not_none"} and args == args2:
                return True
            if name2 != name or name not in _EXCLUSIVE or args == args2:
                continue
            operands2 = tuple(x for x in args2 if not (isinstance(x, tuple) and x[:1] == ("=",)))
            if operands == operands2:
                return True
    return False


def _covers(general: Shape, specific: Shape) -> bool:
    """Every match of ``specific`` is a match of ``general``."""
    for path, name in general.ops.items():
        if name != "*" and specific.ops.get(path) != name:
            return False
    return general.constraints <= specific.constraints


# -- loading, tolerant of broken files ----------------------------------------------------------


def _manifest_findings(manifest: Path, roots: Sequence[Path]) -> list[Finding]:
    try:
        data = yaml_with_lines(manifest)
    except PatternError:
        return []  # the loader reports it
    out = []
    entries = data.get("patterns") if isinstance(data, dict) else None
    for e in entries if isinstance(entries, list) else []:
        if isinstance(e, dict) and isinstance(e.get("file"), str):
            try:
                f = entry_file(manifest, e["__line__"], e["file"], roots)
            except PatternError:
                continue  # outside the manifest's folder: the loader reports it
            if not f.is_file():
                out.append(
                    Finding(
                        manifest,
                        e["__line__"],
                        "error",
                        "missing-file",
                        f"manifest lists {e['file']!r}, which does not exist ({f})",
                    )
                )
    return out


def _load_finding(e: PatternError) -> Finding:
    text = str(e)
    m = re.match(r"^(.*?):(\d+):(\d+): (.*)$", text.splitlines()[0])
    if m is None:
        return Finding(Path("?"), 1, "error", "load", text)
    return Finding(Path(m.group(1)), int(m.group(2)), "error", "load", m.group(4))


def lint_paths(paths: Sequence[Path], kernels: Sequence[str] | None = None) -> list[Finding]:
    """All findings for the pattern files, manifests and kernel files under ``paths``.

    Kernels are those under ``paths`` plus the configured kernel folders (``kernels``,
    ``PDLKIT_KERNEL_PATH`` or the shipped ones).
    """
    from torch_mlir import ir

    paths = [Path(p).resolve() for p in paths] or config.pattern_paths()
    findings: list[Finding] = []
    registry, pattern_paths = _kernels(paths, kernels, findings)
    ops = registry.ops()
    try:
        roots = pattern_roots(pattern_paths)
        patterns = _patterns(pattern_sources(pattern_paths), findings, roots)
    except PatternError as e:
        return [*findings, _load_finding(e)]

    ctx = ir.Context()
    shapes: dict[str, Shape] = {}
    modules = []  # alive while the shapes' ops are read
    by_file: dict[Path, list[Pattern]] = {}
    for pat in patterns.values():
        by_file.setdefault(pat.file, []).append(pat)
    for file, pats in by_file.items():
        module = read_pdl_module(file, ctx)
        modules.append(module)
        by_name = {}
        for op in module.body.operations:
            op = op.operation
            if "sym_name" in op.attributes:
                by_name[op.attributes["sym_name"].value] = op
        for pat in pats:
            if pat.name in by_name:
                shapes[pat.name] = shape_of(by_name[pat.name])
        findings.extend(_unused_natives(file, module))

    for pat in patterns.values():
        findings.extend(_call_findings(pat, registry.op_table))
        for op in pat.calls:
            # a declared op with no kernel yet is a slot for vendors: its matches are near
            # misses ("no kernel implements logical op ...") by design
            if op not in ops and registry.op(op) is None:
                findings.append(
                    Finding(
                        pat.file,
                        pat.line,
                        "error",
                        "unknown-op",
                        f"{pat.name} calls logical op {op!r}, which no kernel implements "
                        f"(known: {', '.join(sorted(ops)) or 'none'})",
                    )
                )
    by_root: dict[str, list[Pattern]] = {}
    for p in patterns.values():
        if p.enabled and p.root is not None and p.name in shapes:
            by_root.setdefault(p.root, []).append(p)
    for same_root in by_root.values():
        findings.extend(_pair_findings(same_root, shapes))
    return sorted(set(findings), key=lambda f: (str(f.file), f.line, f.check, f.message))


def _kernels(
    paths: list[Path], kernels: Sequence[str] | None, findings: list[Finding]
) -> tuple[Any, list[Path]]:
    """The registry of the kernels and ops under ``paths`` and the configured kernel folders
    (one walk, :func:`pdlkit.runtime_abi.walk.load_paths`), and the paths that hold patterns."""
    walked = load_paths([p for p in paths if p.exists()], kernels)
    for p in paths:
        if not p.exists():
            findings.append(Finding(p, 1, "error", "load", "no such file or folder"))
    for f, message in walked.problems:
        findings.append(Finding(f, 1, "error", "load", message))
    pattern_paths = [
        p for p in paths if p.exists() and (p.is_dir() or not p.name.endswith((".py", ".so")))
    ]
    return walked.registry, pattern_paths


def _call_findings(pat: Pattern, ops: Any) -> list[Finding]:
    """``op-call``: a pdlkit_call whose arguments the op it names does not take."""
    out = []
    for where, message in call_problems(pat, ops):
        line = int(where.rsplit(":", 2)[1])
        out.append(Finding(pat.file, line, "error", "op-call", message))
    return out


def _patterns(
    sources: list[Path], findings: list[Finding], roots: Sequence[Path]
) -> dict[str, Pattern]:
    """Every pattern that loads, by name; each source file on its own (its manifest's entries
    within ``roots``, the pattern folders linted), so that one broken file hides nothing else.
    A name defined twice is a finding (loading them together fails)."""
    patterns: dict[str, Pattern] = {}
    for src in sources:
        if src.suffix in (".yaml", ".yml"):
            missing = _manifest_findings(src, roots)
            if missing:
                findings.extend(missing)
                continue
        elif not src.name.endswith((".pdl.mlir", ".pdll")):
            continue
        try:
            loaded = load_patterns([src], roots).patterns
        except PatternError as e:
            findings.append(_load_finding(e))
            continue
        for pat in loaded:
            first = patterns.setdefault(pat.name, pat)
            if first is pat:
                continue
            try:  # two manifests may select one pattern; two patterns of one name clash
                patterns[pat.name] = selected_twice(first, pat)
            except PatternError as e:
                findings.append(replace(_load_finding(e), check="duplicate-name"))
    return patterns


def _pair_findings(same_root: list[Pattern], shapes: dict[str, Shape]) -> list[Finding]:
    """equal-benefit and shadowed findings among enabled patterns of one root op."""
    out = []
    for i, a in enumerate(same_root):
        for b in same_root[i + 1 :]:
            if not _share_a_target(a, b):
                continue
            sa, sb = shapes[a.name], shapes[b.name]
            if a.benefit == b.benefit:
                if not _contradict(sa, sb):
                    out.append(
                        Finding(
                            b.file,
                            b.line,
                            "error",
                            "equal-benefit",
                            f"{b.name} and {a.name} ({a.where}) can claim the same {a.root} with "
                            f"equal benefit {a.benefit}; load order decides",
                        )
                    )
                continue
            hi, lo = (a, b) if a.benefit > b.benefit else (b, a)
            if _covers(shapes[hi.name], shapes[lo.name]):
                out.append(
                    Finding(
                        lo.file,
                        lo.line,
                        "error",
                        "shadowed",
                        f"{lo.name} is shadowed by {hi.name} ({hi.where}, benefit {hi.benefit}): "
                        f"every match of {lo.name} is a match of {hi.name}",
                    )
                )
    return out


def _share_a_target(a: Pattern, b: Pattern) -> bool:
    """Both can be active on one machine: the host or one of the named targets."""
    return any(a.active_on(t) and b.active_on(t) for t in [host(), *NAMED.values()])


_DECL = re.compile(r"^\s*(Constraint|Rewrite)\s+(\w+)\s*\([^)]*\)\s*(->[^;{]*)?;", re.M)


def _unused_natives(file: Path, module: Any) -> list[Finding]:
    out = []
    if file.suffix == ".pdll":
        text = file.read_text()
        for m in _DECL.finditer(text):
            name = m.group(2)
            rest = text[: m.start()] + text[m.end() :]
            if not re.search(rf"\b{name}\s*\(", rest):
                line = text.count("\n", 0, m.start(2)) + 1
                what = f"native {m.group(1).lower()} {name} is declared but never used"
                out.append(Finding(file, line, "warning", "unused-native", what))
        return out
    for pattern_op in module.body.operations:
        for op in nested_ops(pattern_op.operation):
            if op.name == "pdl.attribute" and not any(True for _ in op.results[0].uses):
                loc = op.location
                line = loc.start_line if hasattr(loc, "start_line") else 1
                value = op.attributes["value"] if "value" in op.attributes else "?"
                what = f"pdl.attribute {value} is declared but no constraint or rewrite uses it"
                out.append(Finding(file, line, "warning", "unused-native", what))
    return out

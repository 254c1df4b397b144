"""Pattern files (``*.pdl.mlir``, ``*.pdll``) and manifests (``*.yaml``) -> one :class:`PatternSet`.

A pattern folder without a manifest loads every ``*.pdl.mlir`` and ``*.pdll`` in it (sorted). A
folder with manifests loads what they list, in their order, with per-pattern settings::

    # patterns/cpu/default.yaml
    version: 1
    patterns:
      - file: linear_gelu.pdl.mlir       # every pattern in the file, default settings
      - file: linear_relu.pdl.mlir
        pattern: linear_relu             # settings for one named pattern of the file
        benefit: 3                       # overrides the file's benefit(...)
        targets: [x86_64, aarch64]       # arch, named target, device or ISA feature
        kernel: linear_relu_torch        # pin a kernel by name
        enabled: false

A manifest lists only files in its own folder or below (see :mod:`pdlkit.matcher.manifest`).
Pattern names are unique across everything loaded together. Patterns are applied in priority
order: higher benefit first, then load order. Every error names ``file:line:col``; besides
MLIR's own parse and verify errors, loading refuses text nested too deep for MLIR's parser,
op names the Torch dialect does not register, and natives pdlkit does not define
(:mod:`pdlkit.matcher.pdl_checks`).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdlkit.matcher.pdl_checks import AttributeBounds, nesting_problem, op_name_problem

from pdlkit.errors import PdlkitError


class PatternError(PdlkitError, ValueError):
    """A pattern file or manifest is invalid; the message starts with ``file:line:col:``."""


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


@dataclass
class PatternSet:
    """Patterns in load order, plus the files they came from (for fingerprints)."""

    patterns: tuple[Pattern, ...]
    files: tuple[Path, ...]
    digest: str
    # match contexts are built lazily and cached per pattern set (see substitute.MatchContext)
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def ordered(self) -> list[Pattern]:
        """Priority order: higher benefit first, then load order."""
        return sorted(self.patterns, key=lambda p: -p.benefit)

    def __len__(self) -> int:
        return len(self.patterns)

    def __iter__(self) -> Iterator[Pattern]:
        return iter(self.patterns)


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
            from pdlkit.matcher.pdll import PdllError, compile_pdll

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
        patterns.append(
            Pattern(
                name=name,
                file=path,
                line=line,
                col=col,
                benefit=attrs["benefit"].value,
                root=_root_name(op),
                calls=_called_ops(path, op),
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


def nested_ops(op: Any) -> Any:
    """Every operation inside ``op``'s regions, depth first (a pattern's ops, its rewrite's)."""
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                yield inner.operation
                yield from nested_ops(inner.operation)


def _called_ops(path: Path, pattern_op: Any) -> tuple[str, ...]:
    """The logical op names passed to pdlkit_call (as a constant pdl.attribute)."""
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
        if len(op.operands) > first:
            owner = op.operands[first].owner.operation
            if owner.name == "pdl.attribute" and "value" in owner.attributes:
                value = owner.attributes["value"]
                if not isinstance(value, ir.StringAttr):
                    line, col = _position(owner)
                    raise PatternError(
                        f"{path}:{line}:{col}: pdlkit_call's first argument names the logical "
                        f'op and must be a string, e.g. pdl.attribute = "linear_relu"; got {value}'
                    )
                out.append(value.value)
    return tuple(out)


def _root_name(pattern_op: Any) -> str | None:
    ops = [o.operation for o in pattern_op.regions[0].blocks[0].operations]
    rewrite = next((o for o in ops if o.name == "pdl.rewrite"), None)
    if rewrite is None or len(rewrite.operands) == 0:
        return None
    root = rewrite.operands[0].owner.operation
    if "opName" not in root.attributes:
        return None
    return str(root.attributes["opName"].value)


# -- folders ------------------------------------------------------------------------------------


def pattern_sources(paths: Sequence[Path]) -> list[Path]:
    """The files a list of pattern paths loads: manifests where a folder has them, else PDL files."""
    out: list[Path] = []
    for p in paths:
        if p.is_file():
            out.append(p)
            continue
        if not p.is_dir():
            raise PatternError(f"{p}:1:1: pattern path does not exist")
        for folder in [
            p,
            *sorted(d for d in p.rglob("*") if d.is_dir() and not d.name.startswith((".", "_"))),
        ]:
            manifests = sorted(folder.glob("*.yaml")) + sorted(folder.glob("*.yml"))
            out.extend(manifests or sorted([*folder.glob("*.pdl.mlir"), *folder.glob("*.pdll")]))
    return out


def _fingerprint(files: Iterable[Path]) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(str(f).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def name_clash(first: Pattern, second: Pattern) -> str:
    """The error for two patterns of one name: both places, the second's first."""
    return (
        f"{second.where}:{second.col}: pattern name {second.name!r} is defined twice: here and "
        f"at {first.where}:{first.col}; names must be unique across all loaded pattern files "
        "and folders: rename one"
    )


def name_clashes(paths: Sequence[Path], sets: Sequence[PatternSet]) -> list[str]:
    """Pattern names defined twice across pattern sets that were loaded one source at a time
    (as ``pdlkit check`` and ``lint`` do), counting only sets that ``paths`` load together: a
    file that no manifest of its folder lists is checked alone, and loads only alone."""
    together: set[Path] = set()
    for p in paths:
        try:
            together.update(s.resolve() for s in pattern_sources([Path(p)]))
        except PatternError:
            continue  # reported where the path is loaded
    seen: dict[str, Pattern] = {}
    out = []
    for ps in sets:
        if together.isdisjoint(ps.files):
            continue
        for pat in ps.patterns:
            first = seen.setdefault(pat.name, pat)
            if first is not pat:
                out.append(name_clash(first, pat))
    return out


def load_patterns(paths: Sequence[Path | str]) -> PatternSet:
    """Load pattern files, manifests and folders into one :class:`PatternSet`.

    A pattern name may appear once in all of them: a second definition is an error naming both.
    """
    from pdlkit.matcher.manifest import load_manifest
    from torch_mlir import ir

    ctx = ir.Context()
    seen: dict[str, Pattern] = {}
    files: list[Path] = []
    loaded: set[Path] = set()
    for src in pattern_sources([Path(p) for p in paths]):
        src = src.resolve()
        if src in loaded:
            continue
        if src.suffix in (".yaml", ".yml"):
            found = load_manifest(src, ctx)
            files.append(src)
            loaded.update(p.file for p in found)
        elif src.name.endswith((".pdl.mlir", ".pdll")):
            found = parse_pdl_file(src, ctx)
        else:
            raise PatternError(
                f"{src}:1:1: not a pattern file (*.pdl.mlir, *.pdll) or manifest (*.yaml)"
            )
        for p in found:
            files.append(p.file)
            loaded.add(p.file)
            other = seen.get(p.name)
            if other is not None:
                raise PatternError(name_clash(other, p))
            seen[p.name] = p
    uniq = list(dict.fromkeys(files))
    return PatternSet(tuple(seen.values()), tuple(uniq), _fingerprint(uniq))

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

Patterns are applied in priority order: higher benefit first, then load order. Every
error names ``file:line:col``.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

MANIFEST_VERSION = 1
_ENTRY_KEYS = {"file", "pattern", "enabled", "benefit", "targets", "kernel", "tolerance", "timeout"}


class PatternError(ValueError):
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
    asm: str = field(repr=False)  # the pattern op, with locations, to re-parse in a match context
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


def _check_utf8(path: Path) -> bytes:
    data = path.read_bytes()
    try:
        data.decode()
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise PatternError(
            f"{path}:{line}:{col}: not UTF-8 text: {e.reason} at byte {e.start}"
        ) from None
    return data


def read_pdl_module(path: Path, ctx: Any) -> Any:
    """The PDL module of a pattern file: parsed ``*.pdl.mlir``, or ``*.pdll`` compiled to PDL."""
    from torch_mlir import ir

    if not path.is_file():
        raise PatternError(f"{path}:1:1: pattern file does not exist")
    _check_utf8(path)  # MLIR accepts other bytes in strings, which Python cannot read back
    try:
        if path.suffix == ".pdll":
            from pdlkit.matcher.pdll import PdllError, compile_pdll

            try:
                text = compile_pdll(path)
            except PdllError as e:
                raise PatternError(str(e)) from None
            return ir.Module.parse(text, ctx)
        return ir.Module.parseFile(str(path), ctx)
    except ir.MLIRError as e:
        raise PatternError(_diag_text(e, path)) from None


def parse_pdl_file(path: Path, ctx: Any | None = None) -> list[Pattern]:
    """Parse and verify one ``*.pdl.mlir`` (or ``*.pdll``) file; one :class:`Pattern` per ``pdl.pattern``."""
    from torch_mlir import ir

    ctx = ctx or ir.Context()
    module = read_pdl_module(path, ctx)
    patterns = []
    for i, op in enumerate(module.body.operations):
        op = op.operation
        loc = op.location
        line, col = (loc.start_line, loc.start_col) if hasattr(loc, "start_line") else (1, 1)
        if op.name != "pdl.pattern":
            raise PatternError(
                f"{path}:{line}:{col}: expected pdl.pattern at top level, found {op.name}"
            )
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
                calls=_called_ops(op),
                op_names=_matched_op_names(op),
                asm=op.get_asm(enable_debug_info=True),
            )
        )
    if not patterns:
        raise PatternError(f"{path}:1:1: no pdl.pattern in file")
    for op in module.body.operations:
        _check_natives(path, op.operation)
    return patterns


def _check_natives(path: Path, pattern_op: Any) -> None:
    """Every native a pattern calls must exist: MLIR would only find out while matching."""
    from pdlkit.matcher.natives import CONSTRAINTS

    for op in nested_ops(pattern_op):
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
            loc = op.location
            where = f"{loc.start_line}:{loc.start_col}" if hasattr(loc, "start_line") else "1:1"
            raise PatternError(
                f"{path}:{where}: unknown native {kind} {name!r}; known: {', '.join(sorted(known))}"
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


def _called_ops(pattern_op: Any) -> tuple[str, ...]:
    """The logical op names passed to pdlkit_call (as a constant pdl.attribute)."""
    out = []
    for op in nested_ops(pattern_op):
        if "name" not in op.attributes or op.attributes["name"].value != "pdlkit_call":
            continue
        if op.name == "pdl.apply_native_rewrite":
            first = 0
        elif op.name == "pdl.rewrite":
            first = 1  # after the root
        else:
            continue
        if len(op.operands) > first:
            owner = op.operands[first].owner.operation
            if owner.name == "pdl.attribute" and "value" in owner.attributes:
                out.append(str(owner.attributes["value"].value))
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


# -- manifests ----------------------------------------------------------------------------------


def _yaml_with_lines(path: Path) -> Any:
    """YAML -> Python, where every mapping carries ``__line__`` (1-based) for messages."""
    data = _check_utf8(path)
    try:
        node = yaml.compose(data.decode())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{mark.line + 1}:{mark.column + 1}" if mark else "1:1"
        raise PatternError(f"{path}:{where}: invalid YAML: {getattr(e, 'problem', e)}") from None

    def conv(n: Any) -> Any:
        if isinstance(n, yaml.MappingNode):
            d = {conv(k): conv(v) for k, v in n.value}
            d["__line__"] = n.start_mark.line + 1
            return d
        if isinstance(n, yaml.SequenceNode):
            return [conv(v) for v in n.value]
        try:
            return yaml.safe_load(yaml.serialize(n)) if n is not None else None
        except yaml.YAMLError as e:  # e.g. a tag safe_load refuses
            raise PatternError(
                f"{path}:{n.start_mark.line + 1}:{n.start_mark.column + 1}: invalid YAML value: "
                f"{getattr(e, 'problem', e)}"
            ) from None

    try:
        return conv(node) if node is not None else None
    except TypeError as e:  # a mapping or list used as a key
        raise PatternError(f"{path}:1:1: invalid manifest structure: {e}") from None


def _check_type(path: Path, line: int, key: str, value: Any, kind: type | tuple[type, ...]) -> None:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise PatternError(f"{path}:{line}:1: {key!r} must be {names}, got {value!r}")


def load_manifest(path: Path, ctx: Any | None = None) -> list[Pattern]:
    """The patterns a manifest selects, with its settings applied, in manifest order."""
    data = _yaml_with_lines(path)
    if not isinstance(data, dict):
        raise PatternError(f"{path}:1:1: a manifest is a mapping with 'version' and 'patterns'")
    top = data["__line__"]
    unknown = set(data) - {"version", "patterns", "__line__"}
    if unknown:
        raise PatternError(
            f"{path}:{top}:1: unknown key(s) {sorted(unknown)}; allowed: version, patterns"
        )
    if data.get("version") != MANIFEST_VERSION:
        raise PatternError(
            f"{path}:{top}:1: manifest version {data.get('version')!r} is not supported "
            f"(this pdlkit reads version {MANIFEST_VERSION})"
        )
    entries = data.get("patterns")
    if not isinstance(entries, list) or not entries:
        raise PatternError(f"{path}:{top}:1: 'patterns' must be a non-empty list of entries")
    by_file: dict[Path, list[Pattern]] = {}
    order: list[Path] = []
    for entry in entries:
        if not isinstance(entry, dict):
            raise PatternError(f"{path}:{top}:1: each entry of 'patterns' is a mapping with 'file'")
        line = entry["__line__"]
        bad = set(entry) - _ENTRY_KEYS - {"__line__"}
        if bad:
            raise PatternError(
                f"{path}:{line}:1: unknown key(s) {sorted(bad)}; allowed: {', '.join(sorted(_ENTRY_KEYS))}"
            )
        if "file" not in entry:
            raise PatternError(f"{path}:{line}:1: entry has no 'file'")
        _check_type(path, line, "file", entry["file"], str)
        file = (path.parent / entry["file"]).resolve()
        if not file.is_file():
            raise PatternError(
                f"{path}:{line}:1: pattern file {entry['file']!r} does not exist ({file})"
            )
        if file not in by_file:
            by_file[file] = parse_pdl_file(file, ctx)
            order.append(file)
        changes: dict[str, Any] = {}
        if "enabled" in entry:
            _check_type(path, line, "enabled", entry["enabled"], bool)
            changes["enabled"] = entry["enabled"]
        if "benefit" in entry:
            _check_type(path, line, "benefit", entry["benefit"], int)
            if not 0 <= entry["benefit"] < 65535:
                raise PatternError(f"{path}:{line}:1: 'benefit' must be in [0, 65534]")
            changes["benefit"] = entry["benefit"]
        if "targets" in entry:
            t = entry["targets"]
            if isinstance(t, str):
                t = [t]
            if not isinstance(t, list) or not all(isinstance(x, str) for x in t):
                raise PatternError(f"{path}:{line}:1: 'targets' must be a list of names")
            changes["targets"] = tuple(t)
        if "kernel" in entry:
            _check_type(path, line, "kernel", entry["kernel"], str)
            changes["kernel"] = entry["kernel"]
            changes["pin_source"] = f"{path}:{line}"
        if "tolerance" in entry:
            changes["tolerance"] = _tolerance(path, line, entry["tolerance"])
        if "timeout" in entry:
            t = entry["timeout"]
            if isinstance(t, bool) or not isinstance(t, int | float) or t <= 0:
                raise PatternError(
                    f"{path}:{line}:1: 'timeout' must be a positive number of seconds"
                )
            changes["timeout"] = float(t)
        names = [p.name for p in by_file[file]]
        only = entry.get("pattern")
        if only is not None:
            _check_type(path, line, "pattern", only, str)
            if only not in names:
                raise PatternError(
                    f"{path}:{line}:1: {entry['file']} has no pattern named {only!r} (it has {', '.join(names)})"
                )
        by_file[file] = [
            replace(p, **changes) if only is None or p.name == only else p for p in by_file[file]
        ]
    return [p for f in order for p in by_file[f]]


def _tolerance(path: Path, line: int, t: Any) -> tuple[float | None, float | None]:
    """``tolerance: 1e-3`` (rtol) or ``tolerance: {rtol: 1e-3, atol: 1e-5}``; unset parts keep
    the per-dtype defaults of :mod:`pdlkit.runtime_abi.verify`."""
    num = (int, float)
    if isinstance(t, num) and not isinstance(t, bool) and t >= 0:
        return (float(t), None)
    if isinstance(t, dict):
        bad = set(t) - {"rtol", "atol", "__line__"}
        vals = {k: v for k, v in t.items() if k != "__line__"}
        if (
            not bad
            and vals
            and all(
                isinstance(v, num) and not isinstance(v, bool) and v >= 0 for v in vals.values()
            )
        ):
            r, a = vals.get("rtol"), vals.get("atol")
            return (None if r is None else float(r), None if a is None else float(a))
    raise PatternError(
        f"{path}:{line}:1: 'tolerance' must be a non-negative number or {{rtol: ..., atol: ...}}, got {t!r}"
    )


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


def load_patterns(paths: Sequence[Path | str]) -> PatternSet:
    """Load pattern files, manifests and folders into one :class:`PatternSet`.

    A pattern name may appear once; an earlier path shadows a later one (like ``PATH``).
    """
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
            if other is not None and other.file != p.file:
                continue  # shadowed by an earlier path
            if other is not None:
                raise PatternError(
                    f"{p.where}:{p.col}: pattern name {p.name!r} repeats (first at {other.where})"
                )
            seen[p.name] = p
    uniq = list(dict.fromkeys(files))
    return PatternSet(tuple(seen.values()), tuple(uniq), _fingerprint(uniq))

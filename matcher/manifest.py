"""Manifests (``*.yaml``): which pattern files to load, with per-pattern settings.

The schema is described in :mod:`pdlkit.matcher.patterns`. A manifest is read with a YAML
loader that bounds what a small file can cost: nesting depth, values after alias expansion,
and recursive aliases are refused with ``file:line:col``. Every file a manifest lists must lie
in the manifest's folder or below it, or in the pattern folder it is loaded from (a folder
given as ``patterns=`` or in ``PDLKIT_PATTERN_PATH``, which holds it), after symbolic links
are resolved: those folders are what the permission checks and the change fingerprint cover.
A per-target manifest can so select the target-neutral files beside it (``../pt2e/...``)
in the shipped folder and in a copy of it alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml
from pdlkit.matcher.pattern_file import Pattern, PatternError, check_utf8, parse_pdl_file

from pdlkit.config import SHIPPED, shipped_patterns

MANIFEST_VERSION = 1
ENTRY_KEYS = {"file", "pattern", "enabled", "benefit", "targets", "kernel", "tolerance", "timeout"}
MAX_YAML_DEPTH = 32  # a manifest nests 4 deep
# values after alias expansion: this many, or twice the document's own, whichever is more
MAX_YAML_VALUES = 100_000


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's composer recurses once per nesting level: refuse deep documents early."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0
        self.nodes = 0  # composed, each alias counted once

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        self.nodes += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise yaml.composer.ComposerError(
                    None,
                    None,
                    f"nested deeper than {MAX_YAML_DEPTH} levels",
                    self.peek_event().start_mark,
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _where(path: Path, node: Any) -> str:
    return f"{path}:{node.start_mark.line + 1}:{node.start_mark.column + 1}"


class _Converter:
    """Composed YAML nodes -> Python values; every mapping carries ``__line__`` (1-based)."""

    def __init__(self, path: Path, loader: _BoundedLoader):
        self.path = path
        self.loader = loader
        self.budget = self.limit = max(MAX_YAML_VALUES, 2 * loader.nodes)
        self.open: set[int] = set()  # ids of the collections being converted (cycle check)
        self.scalars: dict[int, Any] = {}

    def convert(self, n: Any, depth: int = 0) -> Any:
        self.budget -= 1
        if self.budget < 0:
            raise PatternError(
                f"{_where(self.path, n)}: aliases expand this manifest to more than "
                f"{self.limit:,} values; write the entries out"
            )
        if depth > MAX_YAML_DEPTH:  # reachable through aliases of nested values
            raise PatternError(
                f"{_where(self.path, n)}: nested deeper than {MAX_YAML_DEPTH} levels"
            )
        if isinstance(n, yaml.ScalarNode):
            return self._scalar(n)
        if id(n) in self.open:
            raise PatternError(
                f"{_where(self.path, n)}: recursive alias: this value contains itself"
            )
        self.open.add(id(n))
        try:
            if isinstance(n, yaml.SequenceNode):
                return [self.convert(v, depth + 1) for v in n.value]
            d = {}
            for k, v in n.value:
                if not isinstance(k, yaml.ScalarNode):
                    raise PatternError(
                        f"{_where(self.path, k)}: a mapping key must be a plain value"
                    )
                if k.tag == "tag:yaml.org,2002:merge":
                    raise PatternError(
                        f"{_where(self.path, k)}: merge keys (<<) are not supported in a "
                        "manifest; write each entry's settings out"
                    )
                d[self._scalar(k)] = self.convert(v, depth + 1)
            d["__line__"] = n.start_mark.line + 1
            return d
        finally:
            self.open.discard(id(n))

    def _scalar(self, n: Any) -> Any:
        if id(n) not in self.scalars:
            try:
                self.scalars[id(n)] = self.loader.construct_object(n)
            except yaml.YAMLError as e:  # e.g. a tag safe_load refuses
                raise PatternError(
                    f"{_where(self.path, n)}: invalid YAML value: {getattr(e, 'problem', e)}"
                ) from e
        return self.scalars[id(n)]


def yaml_with_lines(path: Path) -> Any:
    """YAML -> Python, where every mapping carries ``__line__`` (1-based) for messages."""
    text = check_utf8(path).decode()
    try:
        loader = _BoundedLoader(text)  # its reader refuses control characters at once
        node = loader.get_single_node()
    except yaml.reader.ReaderError as e:
        line = text.count("\n", 0, e.position) + 1
        col = e.position - (text.rfind("\n", 0, e.position) + 1) + 1
        raise PatternError(
            f"{path}:{line}:{col}: invalid YAML: unacceptable character #x{e.character:04x}"
        ) from e
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{mark.line + 1}:{mark.column + 1}" if mark else "1:1"
        raise PatternError(f"{path}:{where}: invalid YAML: {getattr(e, 'problem', e)}") from e
    try:
        return _Converter(path, loader).convert(node) if node is not None else None
    finally:
        loader.dispose()


def _check_type(path: Path, line: int, key: str, value: Any, kind: type | tuple[type, ...]) -> None:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise PatternError(f"{path}:{line}:1: {key!r} must be {names}, got {value!r}")


def entry_file(manifest: Path, line: int, name: str, roots: Sequence[Path] = ()) -> Path:
    """The pattern file an entry names, resolved; refused unless inside the manifest's folder,
    inside one of the pattern folders ``roots`` that holds the manifest (the folders being
    loaded), or inside pdlkit's shipped pattern folder (whose target-neutral files, ``pt2e/``,
    the per-target manifests select; any manifest may name them as ``@shipped/pt2e/...``)."""
    folder = manifest.resolve().parent
    shipped = shipped_patterns().resolve()
    if name.startswith(f"{SHIPPED}/"):
        file = (shipped / name.removeprefix(f"{SHIPPED}/")).resolve()
    else:
        file = (folder / name).resolve()
    inside = [folder, shipped, *(r for r in roots if folder.is_relative_to(r))]
    if not any(file.is_relative_to(f) for f in inside):
        link = ""
        if Path(folder / name).absolute().parent.resolve().is_relative_to(folder):
            link = f" (a symbolic link to {file})"
        raise PatternError(
            f"{manifest}:{line}:1: pattern file {name!r} is outside the manifest's folder "
            f"{folder}{link}; a manifest lists only files in its folder or below, or in the "
            "pattern folder it is loaded from"
        )
    return file


def listed_files(path: Path, roots: Sequence[Path] = ()) -> set[Path]:
    """The pattern files a manifest lists (empty where it does not load: the loader reports it)."""
    try:
        entries = _entries(path, yaml_with_lines(path))
        return {entry_file(path, e["__line__"], e["file"], roots) for e in entries}
    except PatternError:
        return set()


def _settings(path: Path, line: int, entry: dict[str, Any]) -> dict[str, Any]:
    """The Pattern fields one manifest entry sets."""
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
            raise PatternError(f"{path}:{line}:1: 'timeout' must be a positive number of seconds")
        changes["timeout"] = float(t)
    return changes


def _entries(path: Path, data: Any) -> list[dict[str, Any]]:
    """The manifest's entries, after the top level is checked."""
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
    for entry in entries:
        if not isinstance(entry, dict):
            raise PatternError(f"{path}:{top}:1: each entry of 'patterns' is a mapping with 'file'")
        line = entry["__line__"]
        bad = set(entry) - ENTRY_KEYS - {"__line__"}
        if bad:
            raise PatternError(
                f"{path}:{line}:1: unknown key(s) {sorted(bad)}; allowed: {', '.join(sorted(ENTRY_KEYS))}"
            )
        if "file" not in entry:
            raise PatternError(f"{path}:{line}:1: entry has no 'file'")
        _check_type(path, line, "file", entry["file"], str)
    return entries


def load_manifest(path: Path, ctx: Any | None = None, roots: Sequence[Path] = ()) -> list[Pattern]:
    """The patterns a manifest selects, with its settings applied, in manifest order
    (``roots``: the pattern folders being loaded, see :func:`entry_file`)."""
    by_file: dict[Path, list[Pattern]] = {}  # in first-listed order
    index: dict[Path, dict[str, int]] = {}  # pattern name -> position in by_file[file]
    for entry in _entries(path, yaml_with_lines(path)):
        line = entry["__line__"]
        file = entry_file(path, line, entry["file"], roots)
        if not file.is_file():
            raise PatternError(
                f"{path}:{line}:1: pattern file {entry['file']!r} does not exist ({file})"
            )
        if file not in by_file:
            by_file[file] = parse_pdl_file(file, ctx)
            index[file] = {p.name: i for i, p in enumerate(by_file[file])}
        changes = _settings(path, line, entry)
        pats, only = by_file[file], entry.get("pattern")
        if only is None:
            pats[:] = [replace(p, **changes) for p in pats]
            continue
        _check_type(path, line, "pattern", only, str)
        if only not in index[file]:
            raise PatternError(
                f"{path}:{line}:1: {entry['file']} has no pattern named {only!r} "
                f"(it has {', '.join(p.name for p in pats)})"
            )
        i = index[file][only]
        pats[i] = replace(pats[i], **changes)
    return [p for pats in by_file.values() for p in pats]


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

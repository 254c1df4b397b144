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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pdlkit.matcher.manifest import listed_files, load_manifest
from pdlkit.matcher.pattern_file import (
    Pattern,
    PatternError,
    check_utf8,
    parse_pdl_file,
    read_pdl_module,
)
from pdlkit.matcher.pdl_checks import nested_ops

# what other modules read from here (the one file's parts live in matcher/pattern_file.py)
__all__ = [
    "Pattern",
    "PatternError",
    "PatternSet",
    "check_utf8",
    "load_patterns",
    "name_clash",
    "name_clashes",
    "nested_ops",
    "parse_pdl_file",
    "pattern_sources",
    "read_pdl_module",
    "same_pattern",
    "selected_twice",
]


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
            if first is not pat and not same_pattern(first, pat):
                out.append(name_clash(first, pat))
    return out


def pattern_roots(paths: Sequence[Path | str]) -> list[Path]:
    """The folders among ``paths``, resolved: where a manifest found under one may list files
    (:func:`pdlkit.matcher.manifest.entry_file`)."""
    return [Path(p).resolve() for p in paths if Path(p).is_dir()]


def load_patterns(paths: Sequence[Path | str], roots: Sequence[Path] | None = None) -> PatternSet:
    """Load pattern files, manifests and folders into one :class:`PatternSet`.

    A pattern name may appear once in all of them: a second definition is an error naming both.
    A file that manifests list is loaded through them, never on its own (a folder of
    target-neutral patterns, ``patterns/pt2e/``, loads only what the per-target manifests
    select); a pattern two manifests select with the same settings is active on both their
    targets. A manifest may list files anywhere in the folder of ``paths`` that holds it
    (``roots``: those folders, by default the folders among ``paths``).
    """
    from torch_mlir import ir

    ctx = ir.Context()
    seen: dict[str, Pattern] = {}
    files: list[Path] = []
    loaded: set[Path] = set()
    if roots is None:
        roots = pattern_roots(paths)
    sources = [s.resolve() for s in pattern_sources([Path(p) for p in paths])]
    manifests = [s for s in sources if s.suffix in (".yaml", ".yml")]
    listed = {f for s in manifests for f in listed_files(s, roots)}
    for src in sources:
        if src in loaded:
            continue
        if src.suffix in (".yaml", ".yml"):
            found = load_manifest(src, ctx, roots)
            files.append(src)
        elif src in listed:
            continue  # a manifest of this set selects (and configures) it
        elif src.name.endswith((".pdl.mlir", ".pdll")):
            found = parse_pdl_file(src, ctx)
        else:
            raise PatternError(
                f"{src}:1:1: not a pattern file (*.pdl.mlir, *.pdll) or manifest (*.yaml)"
            )
        for p in found:
            files.append(p.file)
            if src.suffix not in (".yaml", ".yml"):
                loaded.add(p.file)
            other = seen.get(p.name)
            seen[p.name] = p if other is None else selected_twice(other, p)
    uniq = list(dict.fromkeys(files))
    return PatternSet(tuple(seen.values()), tuple(uniq), _fingerprint(uniq))


def same_pattern(a: Pattern, b: Pattern) -> bool:
    """``a`` and ``b`` are one pattern of one file (selected by two manifests)."""
    return a.file == b.file and a.line == b.line and a.name == b.name


def selected_twice(first: Pattern, second: Pattern) -> Pattern:
    """One pattern that two manifests select: its targets joined where every other setting
    agrees; else (or two patterns of one name) a :class:`PatternError` naming both."""
    if not same_pattern(first, second):
        raise PatternError(name_clash(first, second))
    if replace(second, targets=first.targets, pin_source=first.pin_source) != first:
        raise PatternError(
            f"{second.where}:{second.col}: pattern {second.name!r} is selected by two manifests "
            "with different settings (enabled, benefit, kernel, tolerance or timeout); select "
            "it with the same settings, or copy it under another name"
        )
    targets = () if not first.targets or not second.targets else first.targets + second.targets
    return replace(first, targets=tuple(dict.fromkeys(targets)))

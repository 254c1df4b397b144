"""``pdlkit check``: validate pattern files, manifests and kernel files without a model."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pdlkit import config
from pdlkit.matcher.op_calls import call_problems
from pdlkit.matcher.patterns import PatternError, load_patterns, name_clashes, pattern_roots
from pdlkit.matcher.pdll import INSTALL_HINT, find_mlir_pdll
from pdlkit.optional import MissingDependency, require_matcher
from pdlkit.runtime_abi.native_build import cache_dir
from pdlkit.runtime_abi.walk import load_paths


def check_paths(
    paths: Sequence[Path], kernels: Sequence[str] | None = None
) -> tuple[list[str], str]:
    """Problems as ``file:line:col: message`` lines, and a one-line summary.

    before: its own walk (pins, kernel files, a registry of its own); after: the walk that
    lint and abi-check share (:func:`pdlkit.runtime_abi.walk.load_paths`), then the pattern
    files it leaves over, loaded one source at a time.
    """
    problems: list[str] = []
    notes: list[str] = []  # what could not be checked here, and why
    for env_paths in (config.pattern_paths, config.kernel_paths, cache_dir):
        try:
            env_paths()
        except config.PathError as e:
            problems.append(str(e))
    walked = load_paths(paths, kernels)
    problems.extend(msg for _, msg in walked.problems)
    pattern_sets = _pattern_sets(walked.other_files, problems, notes, pattern_roots(paths))
    problems.extend(name_clashes(paths, pattern_sets))  # loaded one by one above
    registry = walked.registry
    for ps in pattern_sets:
        for pat in ps.patterns:
            if pat.kernel is not None and registry.get(pat.kernel) is None:
                problems.append(
                    f"{pat.pin_source}:1: pattern {pat.name!r} pins unknown kernel {pat.kernel!r}"
                )
            problems.extend(_call_problems(pat, registry, notes))
    problems = list(dict.fromkeys(problems))
    n_patterns = sum(len(ps) for ps in pattern_sets)
    summary = (
        f"ok: {n_patterns} pattern(s), {len(walked.kernel_files)} kernel file(s) "
        f"({len(registry.kernels)} kernels known)"
    )
    return problems, "\n".join([summary, *notes])


def _pattern_sets(
    files: list[Path], problems: list[str], notes: list[str], roots: list[Path]
) -> list[Any]:
    """Each manifest, then each pattern file no manifest listed, loaded on its own (a
    manifest's entries within ``roots``, the folders checked)."""
    try:
        require_matcher()
    except MissingDependency as e:
        problems.append(f"{e}; pattern files cannot be checked")
        return []
    out = []
    manifests = [f for f in files if f.suffix in (".yaml", ".yml")]
    listed: set[Path] = set()
    for f in manifests + [f for f in files if f not in manifests]:
        if f in listed:
            continue
        if f.suffix == ".pdll" and find_mlir_pdll() is None:
            notes.append(f"{f}: not checked: {INSTALL_HINT}")
            continue
        try:
            ps = load_patterns([f], roots)
        except PatternError as e:
            problems.append(str(e))
            continue
        listed.update(ps.files)
        out.append(ps)
    return out


def _call_problems(pat: Any, registry: Any, notes: list[str]) -> list[str]:
    """A pattern's pdlkit_call against the op it names: declared, its arguments fit, and some
    kernel implements it (an op with no kernel yet is a note: its matches are near misses)."""
    out = [f"{where}: {msg}" for where, msg in call_problems(pat, registry.op_table)]
    ops = registry.ops()
    for op in pat.calls:
        if op in ops:
            continue
        if registry.op(op) is not None:  # declared, no kernel yet: near misses
            notes.append(
                f"{pat.where}:{pat.col}: pattern {pat.name!r} calls logical op {op!r}, "
                "which has reference semantics but no kernel: its matches are near misses"
            )
        else:
            out.append(
                f"{pat.where}:{pat.col}: pattern {pat.name!r} calls logical op "
                f"{op!r}, which no known kernel implements"
            )
    return out

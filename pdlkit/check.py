"""``pdlkit check``: validate pattern files, manifests and kernel files without a model."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pdlkit import config
from pdlkit.runtime_abi import reference


def check_paths(
    paths: Sequence[Path], kernels: Sequence[str] | None = None
) -> tuple[list[str], str]:
    """Problems as ``file:line:col: message`` lines, and a one-line summary."""
    from pdlkit.matcher.patterns import PatternError, load_patterns, name_clashes
    from pdlkit.matcher.pdll import INSTALL_HINT, find_mlir_pdll
    from pdlkit.runtime_abi.kernel import KernelDeclarationError
    from pdlkit.runtime_abi.registry import KernelLoadError, KernelRegistry, load_kernel_file
    from pdlkit.runtime_abi.trust import (
        PINS_FILE,
        TrustError,
        check_writable,
        missing_pinned,
        pin_problems,
        pins_folder,
        read_pins,
    )

    problems: list[str] = []
    notes: list[str] = []  # what could not be checked here, and why
    pattern_srcs: list[Path] = []
    kernel_files: list[tuple[Path, dict[Path, str] | None, Path]] = []  # file, pins, folder
    from pdlkit.runtime_abi.native_build import cache_dir

    for env_paths in (config.pattern_paths, config.kernel_paths, cache_dir):
        try:
            env_paths()
        except config.PathError as e:
            problems.append(str(e))
    for p in paths:
        p = p.resolve()
        if not p.exists():
            problems.append(f"{p}:1:1: no such file or folder")
            continue
        try:
            check_writable([p], "patterns or kernels")
        except TrustError as e:
            problems.append(str(e))
            continue  # its files could change under us: do not run them
        try:
            pins = read_pins(p)
        except TrustError as e:
            problems.append(str(e))
            pins = None
        refused: list[str] = []  # code that differs from its pins: none of the folder runs
        if pins is not None:  # every file that can become code, C sources included
            refused = pin_problems(pins_folder(p), pins)
            problems.extend(refused + missing_pinned(pins, pins_folder(p)))
        for f in config.files_under([p]):
            if f.name.startswith("_") or f.name == PINS_FILE:
                continue
            if f.suffix in (".py", ".so"):
                if not refused:
                    kernel_files.append((f, pins, pins_folder(p)))
            else:
                pattern_srcs.append(f)
    registry = KernelRegistry()
    for f, pins, folder in kernel_files:
        try:
            for k in load_kernel_file(f, pins, folder):
                registry.add(k)
        except (KernelLoadError, KernelDeclarationError) as e:
            problems.append(str(e))
    from pdlkit.optional import MissingDependency, require_matcher

    try:
        require_matcher()
    except MissingDependency as e:
        problems.append(f"{e}; pattern files cannot be checked")
        pattern_srcs = []
    n_patterns = 0
    pattern_sets = []
    manifests = [f for f in pattern_srcs if f.suffix in (".yaml", ".yml")]
    listed: set[Path] = set()
    for f in manifests + [f for f in pattern_srcs if f not in manifests]:
        if f in listed:
            continue
        if f.suffix == ".pdll" and find_mlir_pdll() is None:
            notes.append(f"{f}: not checked: {INSTALL_HINT}")
            continue
        try:
            ps = load_patterns([f])
        except PatternError as e:
            problems.append(str(e))
            continue
        listed.update(ps.files)
        n_patterns += len(ps)
        pattern_sets.append(ps)
    problems.extend(name_clashes(paths, pattern_sets))  # loaded one by one above
    # kernel pins resolve against the kernels given here plus the configured kernel folders
    try:
        known = KernelRegistry.from_folders(config.kernel_paths(kernels))
        for key, k in known.kernels.items():
            registry.kernels.setdefault(key, k)
    except (KernelLoadError, KernelDeclarationError, config.PathError) as e:
        problems.append(str(e))
    ops = registry.ops()
    for ps in pattern_sets:
        for pat in ps.patterns:
            if pat.kernel is not None and registry.get(pat.kernel) is None:
                problems.append(
                    f"{pat.pin_source}:1: pattern {pat.name!r} pins unknown kernel {pat.kernel!r}"
                )
            for op in pat.calls:
                if op in ops:
                    continue
                if reference.lookup(op) is not None:  # defined, no kernel yet: near misses
                    notes.append(
                        f"{pat.where}:{pat.col}: pattern {pat.name!r} calls logical op {op!r}, "
                        "which has reference semantics but no kernel: its matches are near misses"
                    )
                else:
                    problems.append(
                        f"{pat.where}:{pat.col}: pattern {pat.name!r} calls logical op "
                        f"{op!r}, which no known kernel implements"
                    )
    problems = list(dict.fromkeys(problems))
    summary = f"ok: {n_patterns} pattern(s), {len(kernel_files)} kernel file(s) ({len(registry.kernels)} kernels known)"
    return problems, "\n".join([summary, *notes])

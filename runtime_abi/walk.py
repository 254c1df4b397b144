"""One folder walker for ``pdlkit check``, ``lint`` and ``abi-check``.

    before: check, lint and abi-check each walked the paths they were given their own way
            (check read pins, lint did not; abi-check loaded the configured folders only for
            their references) and each kept its own registry of what it found
    after:  load_paths(paths, kernels) walks them once: permissions and pins, kernel and op
            files loaded (each broken file one problem, the others still load), the kernels
            checked against their ops, the configured kernel folders loaded beside them, and
            the files left over (patterns, manifests) handed back

Problems are ``(file, message)`` pairs; each message starts with ``file:line:`` where the
error knows the line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pdlkit.runtime_abi.kernel import KernelDecl
from pdlkit.runtime_abi.registry import (
    KernelDependencyMissing,
    KernelLoadError,
    KernelRegistry,
    kernel_files,
    load_plugin_file,
)
from pdlkit.runtime_abi.trust import (
    PINS_FILE,
    TrustError,
    check_writable,
    missing_pinned,
    pin_problems,
    pins_folder,
    read_pins,
)

from pdlkit import config


@dataclass
class Walked:
    """What the given paths hold, loaded, with the configured kernel folders beside them."""

    registry: KernelRegistry  # the given paths' kernels and ops, then the configured folders'
    given: list[KernelDecl] = field(default_factory=list)  # kernels of the given paths, bound
    kernel_files: list[Path] = field(default_factory=list)  # of the given paths
    other_files: list[Path] = field(default_factory=list)  # patterns, manifests
    problems: list[tuple[Path, str]] = field(default_factory=list)
    refused: set[Path] = field(default_factory=set)  # folders whose code differs from its pins


def _folder_files(p: Path, walked: Walked) -> tuple[list[Path], dict[Path, str] | None]:
    """The kernel files of one given path (none where its pins refuse it), and its pins."""
    try:
        check_writable([p], "patterns or kernels")
    except TrustError as e:
        walked.problems.append((p, str(e)))
        walked.refused.add(p)
        return [], None  # its files could change under us: do not run them
    try:
        pins = read_pins(p)
    except TrustError as e:
        walked.problems.append((p, str(e)))
        pins = None
    refused: list[str] = []
    if pins is not None:  # every file that can become code, C sources included
        refused = pin_problems(pins_folder(p), pins)
        walked.problems.extend((p, m) for m in refused + missing_pinned(pins, pins_folder(p)))
    code = {f for f in kernel_files([p]) if f.suffix in (".py", ".so")}
    for f in config.files_under([p]):
        if f.name.startswith("_") or f.name == PINS_FILE or f.suffix in (".py", ".so"):
            continue
        walked.other_files.append(f)
    if refused:
        walked.refused.add(p)
        return [], pins
    return sorted(code), pins


def load_paths(
    paths: Sequence[Path], kernels: Sequence[str] | None = None, *, configured: bool = True
) -> Walked:
    """Walk ``paths`` (files or folders) and, with ``configured``, the kernel folders that
    ``kernels`` / ``PDLKIT_KERNEL_PATH`` / the shipped default name (their ops serve the given
    kernels; their kernels resolve pins)."""
    walked = Walked(KernelRegistry())
    loaded: list[tuple[Path, tuple[KernelDecl, ...]]] = []
    for p in [Path(p).resolve() for p in paths]:
        if not p.exists():
            walked.problems.append((p, f"{p}:1:1: no such file or folder"))
            continue
        files, pins = _folder_files(p, walked)
        for f in files:
            walked.kernel_files.append(f)
            try:
                decls, ops = load_plugin_file(f, pins, pins_folder(p))
            except (KernelLoadError, ValueError) as e:
                if not isinstance(e, KernelDependencyMissing):
                    walked.problems.append((f, str(e)))
                continue
            try:
                for o in ops:
                    walked.registry.add_op(o)
            except KernelLoadError as e:
                walked.problems.append((f, str(e)))
            loaded.append((f, decls))
    if configured:
        _add_configured(walked, kernels)
    for f, decls in loaded:
        for d in decls:
            try:
                walked.registry.add(d)
            except KernelLoadError as e:
                walked.problems.append((f, str(e)))
    for d, message in walked.registry.unbound():
        walked.problems.append((Path(d.source.rsplit(":", 1)[0]), message))
    walked.registry.pending = []
    names = {(d.name, d.source) for _, decls in loaded for d in decls}
    walked.given = [k for k in walked.registry.kernels.values() if (k.name, k.source) in names]
    return walked


def _add_configured(walked: Walked, kernels: Sequence[str] | None) -> None:
    """The configured folders' ops and kernels beside the given paths' (a given file that lies
    in a configured folder is the same file, loaded once; another file's op of a name the
    given paths declare is a problem naming both)."""
    try:
        folders = config.kernel_paths(kernels)
    except config.PathError as e:
        walked.problems.append((Path("?"), str(e)))
        return
    try:
        known = KernelRegistry.from_folders(folders)
    except KernelLoadError as e:
        walked.problems.append((Path(str(e).split(":")[0]), str(e)))
        return
    for o in known.op_table.ops.values():
        try:
            walked.registry.add_op(o)  # the same op (one file) is no clash; another file's is
        except KernelLoadError as e:
            walked.problems.append((Path(o.source.rsplit(":", 1)[0]), str(e)))
    for key, k in known.kernels.items():
        walked.registry.kernels.setdefault(key, k)

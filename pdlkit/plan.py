"""What one compilation uses: options, the pattern set, the kernel registry, the target.

    before: Options(patterns="my/patterns", kernels="my/kernels")
    after:  Plan(patterns=<PatternSet>, registry=<KernelRegistry>, target=<Target host>)

``load_plan`` reuses a pattern set while its files are unchanged. Two tables here are
process-wide on purpose (see pdlkit/session.py for the rest): the loaded pattern sets, keyed
by their files' paths and stamps (immutable once loaded, and parsing them again is what a
second ``optimize`` of the same folders would otherwise pay), and which kernels each set of
pattern / kernel folders used, so that the pre-pack cache, one per process, releases their
packed weights when those files change. A whole plan is reused only by the backend that
loaded it (``PdlkitBackend.plan``), while :func:`plan_stamp` says nothing it read changed.
"""

from __future__ import annotations

import hashlib
import os
import stat
import threading
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from pdlkit import config, inductor_options
from pdlkit.errors import ConfigError
from pdlkit.matcher.op_calls import call_problems
from pdlkit.matcher.patterns import PatternError, load_patterns
from pdlkit.matcher.report import PatternInfo
from pdlkit.optional import require_matcher
from pdlkit.runtime_abi.autotune import resolve_mode as autotune_mode
from pdlkit.runtime_abi.capability import Target, resolve
from pdlkit.runtime_abi.prepack import CACHE
from pdlkit.runtime_abi.registry import KernelLoadError, KernelRegistry
from pdlkit.runtime_abi.trust import ALLOW_ENV, TrustError, check_writable
from pdlkit.runtime_abi.verify import resolve_mode

_CODEGENS = ("inductor", "eager")


@dataclass(frozen=True)
class Options:
    patterns: config.PathArg = None
    kernels: config.PathArg = None
    target: Any = None
    default_codegen: str = "inductor"
    verify: bool | str = False
    allow_world_writable: bool | None = None  # None: PDLKIT_ALLOW_WORLD_WRITABLE decides
    autotune: str | None = None  # None: PDLKIT_AUTOTUNE, else "cached"
    mode: str | None = None  # Inductor's mode ("reduce-overhead": CUDA graphs, ...)
    inductor_config: Mapping[str, Any] | None = None  # Inductor config patches

    def __post_init__(self) -> None:
        if self.default_codegen not in _CODEGENS:
            raise ValueError(
                f"default_codegen must be one of {_CODEGENS}, got {self.default_codegen!r}"
            )
        resolve_mode(self.verify)  # a bad value fails here, not at the first compile
        autotune_mode(self.autotune)
        inductor_options.check_mode(self.mode)

    def with_(self, extra: Mapping[str, Any] | None) -> Options:
        """These options with ``extra``'s: pdlkit's own keys, and Inductor config keys
        (``torch.compile(..., options={"triton.cudagraphs": True})``) added to
        ``inductor_config``."""
        if not extra:
            return self
        ours, theirs = inductor_options.split(extra, OPTION_NAMES)
        if theirs:
            ours["inductor_config"] = {**(self.inductor_config or {}), **theirs}
        return replace(self, **ours)

    def config_patches(self) -> dict[str, Any]:
        """What every ``compile_fx`` of this compilation gets as ``config_patches``."""
        return inductor_options.patches(self.mode, self.inductor_config)


OPTION_NAMES = frozenset(f.name for f in fields(Options))  # pdlkit's own options


def options_in(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The ``Options`` among a function's arguments (its ``locals()``), by name."""
    return {k: v for k, v in arguments.items() if k in OPTION_NAMES}


@dataclass
class Plan:
    """What one compilation uses: patterns, kernels and the target."""

    patterns: Any  # PatternSet
    registry: Any  # KernelRegistry
    target: Target

    def pattern_infos(self) -> list[PatternInfo]:
        infos = []
        for p in self.patterns.ordered():
            note = "disabled" if not p.enabled else f"targets {list(p.targets)}"
            infos.append(
                PatternInfo(p.name, p.where, p.benefit, p.root, p.active_on(self.target), note)
            )
        return infos


_PLAN_LOCK = threading.Lock()


_PATTERN_CACHE: dict[str, Any] = {}


def load_plan(opts: Options) -> Plan:
    """Load (or reuse, when no file changed) the pattern set and kernel registry."""
    require_matcher()  # MissingDependency: the backend degrades to Inductor, saying why
    target = resolve(opts.target)
    try:
        ppaths = config.pattern_paths(opts.patterns)
        kpaths = config.kernel_paths(opts.kernels)
        check_writable(ppaths, "patterns", opts.allow_world_writable)
        key = "|".join(map(str, ppaths)) + "|" + config.stat_fingerprint(ppaths)
        with _PLAN_LOCK:
            patterns = _PATTERN_CACHE.get(key)
            if patterns is None:
                patterns = load_patterns(ppaths)
                if len(_PATTERN_CACHE) > 32:
                    _PATTERN_CACHE.clear()
                _PATTERN_CACHE[key] = patterns
        registry = KernelRegistry.from_folders(
            kpaths, allow_world_writable=opts.allow_world_writable
        )
    except (PatternError, KernelLoadError, TrustError, config.PathError) as e:
        raise ConfigError(str(e)) from e
    for p in patterns.patterns:
        if p.kernel is not None and registry.get(p.kernel) is None:
            known = ", ".join(registry.names()) or "none"
            raise ConfigError(
                f"{p.pin_source}: pattern {p.name!r} pins kernel {p.kernel!r}, which no kernel folder "
                f"declares (known: {known})"
            )
    _check_calls(patterns.patterns, registry)
    return Plan(patterns, registry, target)


def plan_stamp(opts: Options) -> str | None:
    """What ``load_plan(opts)`` reads besides the options, as one digest: the environment that
    names folders or allows world-writable ones, and the ``lstat`` of every file and folder
    under the pattern and kernel paths (mode, owner, inode, size, mtime, ctime: any write,
    ``chmod``, ``chown`` or replacement changes it), of what a symbolic link in them points
    to, and of the folders above them (mode, owner, inode). Equal digests mean a new load
    would read the same bytes under the same permissions; None: the paths are not valid
    (load to get the error). A backend reuses its last plan while this is unchanged
    (``PdlkitBackend.plan``); nothing reuses a plan across backends or processes."""
    try:
        paths = config.pattern_paths(opts.patterns) + config.kernel_paths(opts.kernels)
    except config.PathError:
        return None
    h = hashlib.sha1()
    for env in (config.PATTERN_ENV, config.KERNEL_ENV, ALLOW_ENV):
        h.update(f"{env}={os.environ.get(env)!r}\n".encode())
    seen: set[str] = set()
    for root in paths:
        _stamp_tree(str(root), h, seen)
    return h.hexdigest()


def _stat_line(path: str, st: os.stat_result) -> bytes:
    return (
        f"{path}\0{st.st_mode}\0{st.st_uid}\0{st.st_ino}\0{st.st_size}\0"
        f"{st.st_mtime_ns}\0{st.st_ctime_ns}\n"
    ).encode()


def _stamp_tree(root: str, h: Any, seen: set[str]) -> None:
    """``root``, everything under it (links followed once) and its parents into ``h``."""
    root = os.path.realpath(root)
    if root in seen:
        return
    seen.add(root)
    for parent in Path(root).parents:  # a parent anyone may write to could replace root
        try:
            st = os.stat(parent)
        except OSError:
            continue
        h.update(f"{parent}\0{st.st_mode}\0{st.st_uid}\0{st.st_ino}\n".encode())
    links: list[str] = []
    try:
        st = os.lstat(root)
    except OSError:
        h.update(f"{root}\0gone\n".encode())
        return
    h.update(_stat_line(root, st))
    if stat.S_ISDIR(st.st_mode):
        _stamp_folder(root, h, links)
    for link in links:
        target = os.path.realpath(link)
        h.update(f"{link}\0->{target}\n".encode())
        if os.path.exists(target):
            _stamp_tree(target, h, seen)


def _stamp_folder(folder: str, h: Any, links: list[str]) -> None:
    """Every entry under ``folder`` (``lstat``, in name order) into ``h``; links noted."""
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError as e:
        h.update(f"{folder}\0unreadable {e.errno}\n".encode())
        return
    for entry in entries:
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            h.update(f"{entry.path}\0gone\n".encode())
            continue
        h.update(_stat_line(entry.path, st))
        if stat.S_ISLNK(st.st_mode):
            links.append(entry.path)
        elif stat.S_ISDIR(st.st_mode):
            _stamp_folder(entry.path, h, links)


_IN_USE: dict[str, tuple[str, set[str]]] = {}  # folders -> (their fingerprint, kernels used)


def kernels_in_use(opts: Options, fingerprint: str) -> set[str]:
    """The set to record this compilation's kernels in. When the files of the same folders
    changed since the last compilation (``fingerprint``: their ``config.stat_fingerprint``,
    which the backend took for this compilation), the kernels used before lose their packed
    weights: the next compilation is the one that matters, and a graph from before packs
    again."""
    paths = config.pattern_paths(opts.patterns) + config.kernel_paths(opts.kernels)
    folders = "|".join(map(str, paths))
    with _PLAN_LOCK:
        last = _IN_USE.get(folders)
        if last is not None and last[0] == fingerprint:
            return last[1]
        if last is not None:
            CACHE.release(last[1])
        used: set[str] = set()
        _IN_USE[folders] = (fingerprint, used)
        return used


def _check_calls(patterns: Any, registry: Any) -> None:
    """Each pattern's ``pdlkit_call`` against the logical op it names (argument count and
    constant kinds), at load: a ConfigError naming file:line:col, not a near miss later."""
    problems = [f"{w}: {m}" for p in patterns for w, m in call_problems(p, registry.op_table)]
    if problems:
        raise ConfigError("\n".join(problems))

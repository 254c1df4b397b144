"""Kernel folders -> a registry that picks a kernel for a logical op.

Kernel files are plug-ins found by path: every ``*.py`` under a kernel folder (files and
folders starting with ``_`` are skipped) is executed as its own module and every
:class:`KernelDecl` and :class:`~pdlkit.runtime_abi.ops.LogicalOp` in its namespace is
registered (ops first; each kernel declared with ``implements=`` is bound to its op, and
checked against it, once both are loaded); every ``*.so`` is a native library
loaded through the C ABI (:mod:`pdlkit.runtime_abi.native`). A file is loaded again only
when its contents change, so an edited kernel takes effect in the next compilation.

Before anything in a pinned folder runs, every file in it that can become code (its C
sources and headers too) must match its pin (:mod:`pdlkit.runtime_abi.trust`); a native build
a kernel file starts checks the sources it compiles against the same pins.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import threading
import traceback
import warnings
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
from pdlkit.runtime_abi.autograd import needs_backward
from pdlkit.runtime_abi.capability import FEATURE_ARCH, FEATURES_OFF_ENV, Target
from pdlkit.runtime_abi.kernel import (
    KernelDecl,
    KernelDeclarationError,
    bind_if_loaded,
    bind_op,
)
from pdlkit.runtime_abi.native_load import load_native_library
from pdlkit.runtime_abi.ops import LogicalOp, OpDeclarationError, OpTable
from pdlkit.runtime_abi.trust import (
    Loading,
    TrustError,
    check_pin,
    check_writable,
    loading,
    pin_problems,
    pins_folder,
    read_pins,
)

from pdlkit.config import PathError
from pdlkit.errors import KernelDependencyMissing, KernelLoadError
from pdlkit.optional import MissingDependency, missing_module


@dataclass
class _LoadedFile:
    digest: str
    kernels: tuple[KernelDecl, ...]
    missing: str = ""  # why the file was skipped: an optional dependency is not installed
    ops: tuple[LogicalOp, ...] = ()


_FILE_CACHE: dict[Path, _LoadedFile] = {}
_FILE_LOCKS: dict[Path, threading.Lock] = {}
_LOCK = threading.Lock()  # the two tables above


def _kernel_files(folder: Path) -> list[Path]:
    if folder.is_file():
        return [folder]
    return sorted(
        p
        for pattern in ("*.py", "*.so")
        for p in folder.rglob(pattern)
        if not any(part.startswith(("_", ".")) for part in p.relative_to(folder).parts)
    )


def _exec_file(
    path: Path, digest: str, data: bytes
) -> tuple[tuple[KernelDecl, ...], tuple[LogicalOp, ...]]:
    mod_name = f"pdlkit_plugin_{digest[:12]}_{path.stem}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise KernelLoadError(f"{path}:1: not a loadable Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        # run the bytes that were hashed (and checked against a pin), not a second read
        exec(compile(data, str(path), "exec"), module.__dict__)
    except KeyboardInterrupt:
        sys.modules.pop(mod_name, None)
        raise
    except BaseException as e:  # SystemExit and the like must not end the host
        sys.modules.pop(mod_name, None)
        raise _load_error(path, e)  # noqa: B904 (the cause is set there)
    found = list(vars(module).values())
    return (
        tuple(v for v in found if isinstance(v, KernelDecl)),
        tuple(v for v in found if isinstance(v, LogicalOp)),
    )


def _bind_known(kernels: tuple[KernelDecl, ...]) -> tuple[KernelDecl, ...]:
    """Kernels declared with ``implements=`` bound to ops loaded since (a registry binds the
    rest against its own ops)."""
    return tuple(bind_if_loaded(k) if k.from_op and not k.schema else k for k in kernels)


def _load_error(path: Path, e: BaseException) -> KernelLoadError:
    """What running kernel file ``path`` raised, as a ``file:line:`` error. A plain error in
    the kernel's own code keeps its traceback as the cause; the others say all there is."""
    err: KernelLoadError
    frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == str(path)]
    line = frames[-1].lineno if frames else 1
    missing = _missing_dependency(e)
    if isinstance(e, SyntaxError):
        err = KernelLoadError(f"{path}:{e.lineno}:{e.offset or 0}: syntax error: {e.msg}")
    elif missing is not None:
        err = KernelDependencyMissing(f"{path}:{line}: skipped: {missing}")
    elif isinstance(e, TrustError | PathError):  # a refused source or build cache: it names it
        err = KernelLoadError(f"{e} (while loading {path}:{line})")
    elif not isinstance(e, Exception):  # SystemExit and the like
        err = KernelLoadError(
            f"{path}:{line}: {type(e).__name__}({e}) raised while loading the kernel file; "
            "refusing to exit the host"
        )
    else:
        err = KernelLoadError(f"{path}:{line}: {type(e).__name__}: {e}")
        err.__cause__ = e
    err.__suppress_context__ = True
    return err


def _missing_dependency(e: BaseException) -> str | None:
    """Why an optional package the kernel file imports is missing, if that is what ``e`` is."""
    if not isinstance(e, ImportError):
        return None

    top = missing_module(e)
    return None if top is None else str(MissingDependency(top, "its kernels"))


def load_kernel_file(
    path: Path,
    pins: dict[Path, str] | None = None,
    folder: Path | None = None,
    *,
    allow_world_writable: bool | None = None,
) -> tuple[KernelDecl, ...]:
    """The kernels declared in one file (executed again only if its bytes changed).

    ``pins`` (a folder's ``kernels.yaml``, see :mod:`pdlkit.runtime_abi.trust`) must
    allow the file's bytes before anything in it runs; a native build the file starts checks
    its sources against them too, and ``allow_world_writable`` (None: the environment decides)
    is the permission rule for the sources of an unpinned folder."""
    return load_plugin_file(path, pins, folder, allow_world_writable=allow_world_writable)[0]


def load_plugin_file(
    path: Path,
    pins: dict[Path, str] | None = None,
    folder: Path | None = None,
    *,
    allow_world_writable: bool | None = None,
) -> tuple[tuple[KernelDecl, ...], tuple[LogicalOp, ...]]:
    """The kernels and the logical ops one file declares (see :func:`load_kernel_file`)."""
    path = path.resolve()
    data = path.read_bytes()
    folder = folder or path.parent
    try:
        check_pin(path, data, pins, folder)
    except TrustError as e:
        raise KernelLoadError(str(e)) from None
    digest = hashlib.sha256(data).hexdigest()
    with _LOCK:
        this_file = _FILE_LOCKS.setdefault(path, threading.Lock())
    with this_file:  # one load of a file at a time; other files load alongside (load_files)
        found = _cached(path, digest)
        if found is not None:
            return found
        ops: tuple[LogicalOp, ...] = ()
        if path.suffix == ".so":
            kernels = load_native_library(path, digest, data)
        else:
            try:
                with loading(Loading(path, pins, folder, allow_world_writable)):
                    kernels, ops = _exec_file(path, digest, data)
            except KernelDependencyMissing as e:
                with _LOCK:
                    _FILE_CACHE[path] = _LoadedFile(digest, (), str(e))
                warnings.warn(f"pdlkit: {e}", stacklevel=2)  # once per file version
                raise
        with _LOCK:
            _FILE_CACHE[path] = _LoadedFile(digest, kernels, ops=ops)
        return kernels, ops


def _cached(path: Path, digest: str) -> tuple[tuple[KernelDecl, ...], tuple[LogicalOp, ...]] | None:
    """The kernels and ops of ``path`` loaded before from these bytes, or None."""
    with _LOCK:
        cached = _FILE_CACHE.get(path)
        if cached is None or cached.digest != digest:
            return None
        if cached.missing:
            raise KernelDependencyMissing(cached.missing)
        if any(k.from_op and not k.schema for k in cached.kernels):
            cached.kernels = _bind_known(cached.kernels)  # ops loaded since
        return cached.kernels, cached.ops


def load_files(paths: Sequence[Path], load: Callable[[Path], Any]) -> list[Any]:
    """``load(path)`` of every path, several at once, in the paths' order: each result, or
    the exception it raised. A kernel file that builds native code waits for its compiler
    (a subprocess), so a folder's builds run side by side: on a 2-core AMD EPYC with an empty
    build cache the shipped folders took 9.4 s one file after another, 9.2 s of it in three C
    builds (``qgemm_vnni.c`` 5.5 s alone), each of which a machine pays once. Where fewer than
    two of the files are new to this process, one after another: starting the threads took
    7.5 ms of a warm load's 11 ms (the shipped folders, every compilation)."""
    with _LOCK:
        new = [p for p in paths if p.resolve() not in _FILE_CACHE]
    if len(new) < 2:
        return [_outcome(load, p) for p in paths]
    workers = min(len(paths), max(2, os.cpu_count() or 1), 8)
    with ThreadPoolExecutor(workers, thread_name_prefix="pdlkit-load") as pool:
        return list(pool.map(partial(_outcome, load), paths))


def _outcome(load: Callable[[Path], Any], path: Path) -> Any:
    try:
        return load(path)
    except Exception as e:  # noqa: BLE001 - handed to the caller, raised there in file order
        return e


@dataclass
class Selection:
    """The outcome of choosing a kernel for one candidate call."""

    kernel: KernelDecl | None
    reasons: list[str] = field(default_factory=list)  # why each other kernel was not eligible


@dataclass
class KernelRegistry:
    """All kernels loaded from a list of folders, by logical op, in load order, and the logical
    ops those folders declare (each kernel is checked against its op when both are known)."""

    kernels: dict[tuple[str, int], KernelDecl] = field(default_factory=dict)  # (name, version)
    folders: tuple[Path, ...] = ()
    skipped: list[str] = field(default_factory=list)  # files whose optional deps are missing
    op_table: OpTable = field(default_factory=OpTable)
    pending: list[KernelDecl] = field(default_factory=list)  # implements= ops not loaded yet

    @classmethod
    def from_folders(
        cls, folders: Sequence[Path], *, allow_world_writable: bool | None = None
    ) -> KernelRegistry:
        """Load every kernel and op file; a folder's ``kernels.yaml`` pins must match, and a
        world-writable folder is refused unless allowed (see :mod:`pdlkit.runtime_abi.trust`).
        A kernel whose op no file declares, or whose signature disagrees with it, and two ops
        of one name, are a :class:`KernelLoadError` naming the files and lines."""
        reg = cls(folders=tuple(folders))
        try:
            check_writable(folders, "kernels", allow_world_writable)
        except TrustError as e:
            raise KernelLoadError(str(e)) from None
        for folder in folders:
            if not folder.exists():
                raise KernelLoadError(f"{folder}: kernel folder does not exist")
            try:
                pins = read_pins(folder)
            except TrustError as e:
                raise KernelLoadError(str(e)) from None
            # nothing of a pinned folder runs while any of its code differs from its pins
            problems = pin_problems(pins_folder(folder), pins) if pins is not None else []
            if problems:
                raise KernelLoadError(problems[0])
            load = partial(
                load_plugin_file,
                pins=pins,
                folder=pins_folder(folder),
                allow_world_writable=allow_world_writable,
            )
            for loaded in load_files(_kernel_files(folder), load):
                if isinstance(loaded, KernelDependencyMissing):
                    reg.skipped.append(str(loaded))
                elif isinstance(loaded, Exception):
                    raise loaded
                else:
                    reg.add_all(*loaded)
        reg.finish()
        return reg

    def add_all(self, decls: Iterable[KernelDecl], ops: Iterable[LogicalOp] = ()) -> None:
        """One file's ops, then its kernels."""
        for o in ops:
            self.add_op(o)
        for decl in decls:
            self.add(decl)

    def add_op(self, the_op: LogicalOp) -> None:
        """Declare an op; kernels that were waiting for it are bound now."""
        try:
            self.op_table.add(the_op)
        except OpDeclarationError as e:
            raise KernelLoadError(str(e)) from None
        waiting = [d for d in self.pending if d.op == the_op.name]
        self.pending = [d for d in self.pending if d.op != the_op.name]
        for decl in waiting:
            self.add(decl)

    def add(self, decl: KernelDecl) -> None:
        the_op = self.op_table.get(decl.op)
        if decl.from_op and the_op is None:
            self.pending.append(decl)  # its op may come from a file loaded later
            return
        try:  # bound to this registry's op, whatever it was bound to when declared
            if the_op is not None and decl.logical is not the_op or not decl.schema:
                decl = bind_op(decl, the_op)
        except KernelDeclarationError as e:
            raise KernelLoadError(str(e)) from None
        key = (decl.name, decl.version)
        other = self.kernels.get(key)
        if other is not None and other is not decl and other.source != decl.source:
            raise KernelLoadError(
                f"{decl.source}: kernel {decl.name!r} version {decl.version} is already declared "
                f"at {other.source}"
            )
        self.kernels[key] = decl

    def unbound(self) -> list[tuple[KernelDecl, str]]:
        """Kernels that implement an op no loaded file declares, each with its error."""
        known = ", ".join(self.op_table.names()) or "none"
        return [
            (d, f"{d.source}: kernel {d.name!r} implements op {d.op!r}, which no op file "
                f"declares (the shipped ops, kernels/ops/, load with the shipped kernel folder, @shipped "
                f"in PDLKIT_KERNEL_PATH; or declare it with @pdlkit.op in a file of a kernel "
                f"folder; known: {known})")
            for d in self.pending
        ]  # fmt: skip

    def finish(self) -> None:
        """Every kernel is bound: one that implements an op no file declares is an error."""
        problems = self.unbound()
        if problems:
            raise KernelLoadError(problems[0][1])

    def op(self, name: str) -> LogicalOp | None:
        """The logical op of that name, if a loaded file declares it."""
        return self.op_table.get(name)

    def get(self, name: str) -> KernelDecl | None:
        """The highest version of the kernel called ``name``."""
        found = [k for (n, _), k in self.kernels.items() if n == name]
        return max(found, key=lambda k: k.version) if found else None

    def offers(self, k: KernelDecl) -> bool:
        """Whether ``k`` is one of this registry's kernels that it may choose (matcher/record_memo.py
        asks it of a kept record's kernel: a restricted view refuses some)."""
        return self.kernels.get((k.name, k.version)) is k

    def names(self) -> list[str]:
        return sorted({n for n, _ in self.kernels})

    def for_op(self, op: str) -> list[KernelDecl]:
        """Candidates in choice order: priority, then version, then load order."""
        found = [k for k in self.kernels.values() if k.op == op]
        return sorted(found, key=lambda k: (-k.priority, -k.version))

    def ops(self) -> set[str]:
        return {k.op for k in self.kernels.values()}

    def select(
        self, op: str, args: Sequence[Any], target: Target, pin: str | None = None
    ) -> Selection:
        """Pick the highest-priority kernel for ``op`` that accepts ``args`` (fake tensors / constants)."""
        eligible, reasons = self.candidates(op, args, target, pin)
        return Selection(eligible[0] if eligible else None, reasons)

    def candidates(
        self, op: str, args: Sequence[Any], target: Target, pin: str | None = None
    ) -> tuple[list[KernelDecl], list[str]]:
        """Every kernel for ``op`` that accepts ``args``, in priority order, and why each
        higher-ranked one does not (a kernel for another CPU architecture is not news when
        one was found)."""
        found = self.for_op(op)
        if not found:
            return [], [f"no kernel implements logical op {op!r}"]
        eligible: list[KernelDecl] = []
        skipped: list[tuple[KernelDecl, str]] = []
        for k in found:
            why = _ineligible(k, args, target, pin)
            if why is None:
                eligible.append(k)
            elif not eligible:
                skipped.append((k, f"{k.name}: {why}"))
        if eligible:
            return eligible, [r for o, r in skipped if not _for_other_arch(o, target)]
        return [], [r for _, r in skipped]


class Restricted:
    """A kernel registry that offers only the kernels ``refuse`` finds no reason against; the
    others are passed over with the reason (near misses in ``explain``): every one, or with
    ``ranked_only`` those ranked above the first kernel offered."""

    def __init__(
        self, registry: Any, refuse: Callable[[KernelDecl], str | None], ranked_only: bool = False
    ):
        self._registry, self._refuse, self._ranked_only = registry, refuse, ranked_only

    def __getattr__(self, name: str) -> Any:
        return getattr(self._registry, name)

    def candidates(
        self, op: str, args: Sequence[Any], target: Target, pin: str | None = None
    ) -> tuple[list[KernelDecl], list[str]]:
        eligible, reasons = self._registry.candidates(op, args, target, pin)
        kept: list[KernelDecl] = []
        reasons = list(reasons)
        for k in eligible:
            why = self._refuse(k)
            if why is None:
                kept.append(k)
            elif not (kept and self._ranked_only):
                reasons.append(f"{k.name}: {why}")
        return kept, reasons

    def offers(self, k: KernelDecl) -> bool:
        return self._refuse(k) is None and bool(self._registry.offers(k))

    select = KernelRegistry.select


def _for_other_arch(k: KernelDecl, target: Target) -> bool:
    """``k`` requires ISA features of another CPU architecture than the target's (an AArch64
    kernel on an x86 target, or the reverse)."""
    arches = {FEATURE_ARCH[f] for f in k.requires if f in FEATURE_ARCH}
    return bool(arches) and target.arch not in arches


def _missing_features(k: KernelDecl, target: Target) -> str | None:
    """Why ``target`` cannot run ``k``'s ISA, or None: what the host lacks, or what
    :data:`~pdlkit.runtime_abi.capability.FEATURES_OFF_ENV` turned off there."""
    missing = k.requires - target.features
    off = sorted(missing & target.turned_off)
    if off:
        return f"needs {', '.join(off)}, turned off by {FEATURES_OFF_ENV}"
    if missing:
        return f"needs {', '.join(sorted(missing))}, which target {target.name} lacks"
    return None


def _ineligible(k: KernelDecl, args: Sequence[Any], target: Target, pin: str | None) -> str | None:
    if pin is not None and k.name != pin:
        return f"the manifest pins kernel {pin!r}"
    if len(args) != len(k.params):
        return f"takes {len(k.params)} arguments {k.params}, the pattern passes {len(args)}"
    devices = {a.device.type for a in args if isinstance(a, torch.Tensor)}
    if target.models_on and devices == {"cpu"}:
        devices = {target.models_on}  # planning for a GPU machine from a CPU-only one
    if devices and devices != {k.device}:
        return f"runs on {k.device}, the operands are on {', '.join(sorted(devices))}"
    if k.device not in target.devices:
        return f"runs on {k.device}, target {target.name} has no such device"
    missing = _missing_features(k, target)
    if missing:
        return missing
    no_grad = needs_backward(k, args, k.params)
    if no_grad:
        return no_grad
    for name, arg in zip(k.params, args, strict=True):
        rule = k.shapes.get(name)
        if rule is not None and isinstance(arg, torch.Tensor):
            why = rule.violation(arg, static=True)
            if why:
                return f"{name} {why}"
        allowed = k.dtypes.get(name)
        if allowed is None:
            continue
        if not isinstance(arg, torch.Tensor):
            if arg is not None:
                return f"{name} must be a tensor, got {type(arg).__name__}"
            continue
        if arg.dtype not in allowed:
            names = ", ".join(str(d).removeprefix("torch.") for d in allowed)
            return f"{name} is {str(arg.dtype).removeprefix('torch.')}, the kernel takes {names}"
    return None


def kernel_files(folders: Iterable[Path]) -> list[Path]:
    """Every kernel file the folders hold, for fingerprints and ``pdlkit check``."""
    return [p for f in folders if f.exists() for p in _kernel_files(f)]

"""Where patterns and kernels come from.

Precedence, first that is set wins: the ``patterns=`` / ``kernels=`` arguments (a path, a
list of paths, or one string of ``os.pathsep``-separated paths), then
``PDLKIT_PATTERN_PATH`` / ``PDLKIT_KERNEL_PATH`` (``os.pathsep``-separated), then the
shipped folders. In any list the entry ``@shipped`` stands for the shipped folder, so a
user folder can be added to the shipped one: ``PDLKIT_PATTERN_PATH=/my/patterns:@shipped``.
Relative paths are resolved against the current directory only when given explicitly as
arguments: a relative entry in the environment is refused, since loading a kernel runs it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from pdlkit.errors import PdlkitError

PATTERN_ENV = "PDLKIT_PATTERN_PATH"
KERNEL_ENV = "PDLKIT_KERNEL_PATH"
SHIPPED = "@shipped"

PathArg = str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None


class PathError(PdlkitError, ValueError):
    """A configured pattern or kernel path is not acceptable (e.g. relative in the environment)."""


def _shipped(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.submodule_search_locations, package
    return Path(next(iter(spec.submodule_search_locations)))


def shipped_patterns() -> Path:
    return _shipped("pdlkit.patterns")


def shipped_kernels() -> Path:
    return _shipped("pdlkit.kernels")


def _paths(arg: PathArg, env: str, shipped: Path) -> list[Path]:
    if arg is None:
        raw = os.environ.get(env, "")
        entries: Iterable[str | os.PathLike[str]] = [e for e in raw.split(os.pathsep) if e] or [
            SHIPPED
        ]
        for e in entries:
            if str(e) != SHIPPED and not Path(e).expanduser().is_absolute():
                raise PathError(
                    f"{env} entry {str(e)!r} is a relative path; pdlkit loads nothing from the "
                    "current directory implicitly: give an absolute path"
                )
    else:  # a path, "/mine:@shipped" as in the environment, or a list of either
        items = [arg] if isinstance(arg, str | os.PathLike) else list(arg)
        entries = [
            e
            for item in items
            for e in (item.split(os.pathsep) if isinstance(item, str) else [item])
            if e != ""
        ]
    resolved = (shipped if str(e) == SHIPPED else Path(e).expanduser().resolve() for e in entries)
    return list(dict.fromkeys(resolved))


def pattern_paths(arg: PathArg = None) -> list[Path]:
    return _paths(arg, PATTERN_ENV, shipped_patterns())


def kernel_paths(arg: PathArg = None) -> list[Path]:
    return _paths(arg, KERNEL_ENV, shipped_kernels())


_SUFFIXES = (".pdl.mlir", ".pdll", ".yaml", ".yml", ".py", ".so")


def files_under(paths: Iterable[Path], suffixes: tuple[str, ...] = _SUFFIXES) -> list[Path]:
    """The paths that are files, and the files named ``*suffixes`` (pattern / kernel /
    manifest files by default) under those that are folders (links followed, each folder
    once), sorted per folder. ``os.walk`` on ``scandir``: a third of ``Path.rglob``'s cost,
    and every compilation stamps the folders."""
    out = []
    for p in paths:
        if p.is_file():
            out.append(p)
        elif p.is_dir():
            found, seen = [], set()
            for folder, dirs, files in os.walk(p, followlinks=True):
                real = os.path.realpath(folder)
                if real in seen:  # a link back up the tree
                    dirs.clear()
                    continue
                seen.add(real)
                found += [Path(folder, f) for f in files if f.endswith(suffixes)]
            out.extend(sorted(f for f in found if f.is_file()))
    return out


def stat_fingerprint(paths: Iterable[Path]) -> str:
    """Cheap change detection: every file's path, inode, size, mtime and ctime under the given
    paths (ctime: an edit that puts size and mtime back still changes it)."""
    h = hashlib.sha1()
    for f in files_under(paths):
        try:
            st = f.stat()
        except OSError:
            continue
        h.update(f"{f}\0{st.st_ino}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}\n".encode())
    return h.hexdigest()

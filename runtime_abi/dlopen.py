"""``dlopen`` the bytes that were checked, not a path that could have changed since.

A library's bytes are read once, hashed and checked (against a pin, or the record of the
build cache) by the caller; :func:`open_library` then loads exactly those bytes: they go into
a sealed anonymous file (``memfd_create``) that ``dlopen`` reads through ``/proc/self/fd``,
or, where there is none, into a new file of a private (0700) folder, removed once mapped. So
a file swapped between the check and the load is not what runs, and a library rebuilt at a
path already loaded is the new one (``dlopen`` of the same path would return the old mapping).
Libraries are never closed.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import tempfile
import threading
from pathlib import Path

from pdlkit.errors import KernelLoadError

_LOCK = threading.Lock()
_HANDLES: dict[str, ctypes.CDLL] = {}  # digest -> library, never closed
# The memfds libraries were opened from stay open: glibc knows a library by the name it was
# opened under, so a /proc/self/fd/N reused for other bytes would hand back the old library.
_MEMFDS: list[int] = []
_COPIES: Path | None = None  # the private folder, made on first need
_COPY_NUMBER = itertools.count()
_SEALS = ("F_SEAL_SEAL", "F_SEAL_SHRINK", "F_SEAL_GROW", "F_SEAL_WRITE")


def opened(digest: str) -> ctypes.CDLL | None:
    """The library opened from the bytes whose sha256 is ``digest``, if this process has one
    (a native kernel's ``digest``): what tests and benchmarks ask a library about itself."""
    with _LOCK:
        return _HANDLES.get(digest)


def open_library(path: Path, data: bytes, digest: str) -> ctypes.CDLL:
    """``dlopen`` exactly ``data``: the bytes read once from ``path``, whose sha256 is
    ``digest`` (checked by the caller), never ``path`` itself again. One handle per digest."""
    with _LOCK:
        lib = _HANDLES.get(digest)
        if lib is None:
            lib = _HANDLES[digest] = _dlopen_bytes(path, data, digest)
        return lib


def _sealed_memfd(name: str, data: bytes) -> int | None:
    """An anonymous file holding ``data``, sealed against change; None where the system has none."""
    import fcntl

    if not hasattr(os, "memfd_create") or not os.path.isdir("/proc/self/fd"):
        return None
    try:
        fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    except OSError:
        return None
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        seals = 0
        for seal in _SEALS:
            seals |= getattr(fcntl, seal, 0)
        if hasattr(fcntl, "F_ADD_SEALS"):
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    except OSError:
        os.close(fd)
        return None
    return fd


def _private_copy(path: Path, data: bytes, digest: str) -> Path:
    """``data`` in a new file of a private (0700) folder, under a name never used before."""
    global _COPIES
    _COPIES = _COPIES or Path(tempfile.mkdtemp(prefix="pdlkit-native-"))
    target = _COPIES / f"{next(_COPY_NUMBER)}-{path.stem}-{digest[:16]}.so"
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o500)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return target


def _dlopen_bytes(path: Path, data: bytes, digest: str) -> ctypes.CDLL:
    fd = _sealed_memfd(path.name, data)
    copy = _private_copy(path, data, digest) if fd is None else None
    target = f"/proc/self/fd/{fd}" if copy is None else str(copy)
    try:
        lib = ctypes.CDLL(target)
    except OSError as e:
        if fd is not None:
            os.close(fd)  # never opened: glibc does not know this name
        why = str(e).replace(target, str(path))
        raise KernelLoadError(f"{path}: cannot load the shared library: {why}") from None
    finally:
        if copy is not None:
            with contextlib.suppress(OSError):
                copy.unlink()  # the mapping outlives the name
    if fd is not None:
        _MEMFDS.append(fd)
    return lib

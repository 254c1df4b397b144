"""Kernel folders are code: pinned hashes and folder permissions.

Loading a kernel file runs it, so pdlkit refuses what it cannot trust:

* **Pins.** A kernel folder may hold ``kernels.yaml`` pinning each kernel file's sha256::

      # my_kernels/kernels.yaml          (write it with: pdlkit.runtime_abi.trust.write_pins)
      version: 1
      sha256:
        linear_epilogue.py: 3b1f...e9   # path relative to this folder
        x86/libvnni.so: 77c0...41

  Once a folder has one, every kernel file in it must be listed and match; a file that
  differs, or is not listed, is refused with its name and both hashes. The bytes that were
  hashed are the bytes that run (Python kernels are compiled from them).
  Pins cover every file that can become code (:func:`code_files`): Python files (helpers
  starting with ``_`` included), shared libraries, and what a native build reads or could be
  made to read: C / C++ / assembly sources and headers, build scripts. A native build in a
  pinned folder compiles a private copy of the pinned bytes (:mod:`.native_build`).
* **Permissions.** A pattern or kernel folder that anyone may write to (the folder, a
  folder or file inside it, the folder a symbolic link inside it points into, or a parent
  without the sticky bit) is refused unless ``PDLKIT_ALLOW_WORLD_WRITABLE=1`` or
  ``allow_world_writable=True`` says otherwise.
* **No implicit paths.** Relative entries in ``PDLKIT_PATTERN_PATH`` / ``PDLKIT_KERNEL_PATH``
  are refused (see :mod:`pdlkit.config`); only explicit arguments resolve against the
  current directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

from pdlkit.errors import PdlkitError

PINS_FILE = "kernels.yaml"
PINS_VERSION = 1
ALLOW_ENV = "PDLKIT_ALLOW_WORLD_WRITABLE"

# What can become code: what the registry runs, and what a native build reads or could be
# made to read (sources, headers, files a source may #include, build and linker scripts).
CODE_SUFFIXES = frozenset(
    ".py .pyx .pxd .so .dylib .dll "  # Python, Cython, shared libraries
    ".c .cc .cpp .cxx .c++ .cu .m .mm .s .asm "  # translation units (.S, .C: compared lower-case)
    ".h .hh .hpp .hxx .h++ .cuh .inc .inl .ipp .tcc "  # headers and included fragments
    ".ld .lds .map .mk .cmake .sh".split()  # linker scripts, version maps, build scripts
)
BUILD_FILE_NAMES = frozenset(
    {"Makefile", "makefile", "GNUmakefile", "CMakeLists.txt", "meson.build", "build.ninja"}
)


class TrustError(PdlkitError, RuntimeError):
    """A kernel or pattern file or folder is refused; the message names it."""


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- pins --------------------------------------------------------------------------------------


def is_code_file(path: Path) -> bool:
    """Whether ``path`` is a file that can become code (see :data:`CODE_SUFFIXES`)."""
    return (
        path.name in BUILD_FILE_NAMES
        or path.suffix.lower() in CODE_SUFFIXES
        or ".so" in path.suffixes  # versioned shared libraries: libx.so.1
    )


def code_files(folder: Path) -> list[Path]:
    """Every file under ``folder`` that can become code: what ``pdlkit pin`` pins and what a
    pinned folder must pin. Hidden files and folders and ``__pycache__`` are not looked at."""
    if folder.is_file():
        return [folder]
    return sorted(
        p
        for p in folder.rglob("*")
        if not any(
            part.startswith(".") or part == "__pycache__" for part in p.relative_to(folder).parts
        )
        and is_code_file(p)
        and p.is_file()
    )


def pins_folder(path: Path) -> Path:
    """The folder whose ``kernels.yaml`` governs ``path`` (a kernel folder or a single file)."""
    return path if path.is_dir() else path.parent


def read_pins(folder: Path) -> dict[Path, str] | None:
    """``{absolute file: sha256}`` from ``kernels.yaml`` in ``folder`` (or in a file's
    folder), or None when there is none."""
    import yaml

    folder = pins_folder(folder)
    path = folder / PINS_FILE
    if not path.is_file():
        return None
    try:
        data = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError, ValueError) as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{mark.line + 1}:{mark.column + 1}" if mark else "1:1"
        raise TrustError(f"{path}:{where}: invalid YAML: {getattr(e, 'problem', e)}") from e
    if not isinstance(data, dict) or data.get("version") != PINS_VERSION:
        raise TrustError(
            f"{path}:1:1: a kernel pin file is a mapping with 'version: {PINS_VERSION}' and 'sha256'"
        )
    unknown = set(data) - {"version", "sha256"}
    if unknown:
        raise TrustError(f"{path}:1:1: unknown key(s) {sorted(map(str, unknown))}")
    pins = data.get("sha256")
    if not isinstance(pins, dict) or not pins:
        raise TrustError(f"{path}:1:1: 'sha256' must map kernel files to their sha256")
    out: dict[Path, str] = {}
    for name, digest in pins.items():
        if not isinstance(name, str) or not isinstance(digest, str):
            raise TrustError(f"{path}:1:1: sha256 entry {name!r}: {digest!r} is not file: hex")
        digest = digest.lower().removeprefix("sha256:")
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise TrustError(f"{path}:1:1: sha256 of {name!r} is not 64 hex digits: {digest!r}")
        file = (folder / name).resolve()
        if not file.is_relative_to(folder.resolve()):
            raise TrustError(f"{path}:1:1: pinned file {name!r} is outside the folder")
        out[file] = digest
    return out


def check_pin(path: Path, data: bytes, pins: dict[Path, str] | None, folder: Path) -> None:
    """Refuse ``path`` (whose bytes are ``data``) unless the folder's pins allow it."""
    if pins is None:
        return
    want = pins.get(path.resolve())
    got = sha256_of(data)
    if want is None:
        raise TrustError(
            f"{path}:1: kernel file is not pinned in {folder / PINS_FILE} (its sha256 is {got}); "
            "pin it or remove it"
        )
    if want != got:
        raise TrustError(
            f"{path}:1: kernel file does not match its pin in {folder / PINS_FILE}: "
            f"sha256 {got}, pinned {want}"
        )


def pin_problems(folder: Path, pins: dict[Path, str]) -> list[str]:
    """Why each code file under ``folder`` (see :func:`code_files`) is refused by ``pins``."""
    problems = []
    for f in code_files(folder):
        try:
            check_pin(f, f.read_bytes(), pins, folder)
        except TrustError as e:
            problems.append(str(e))
        except OSError as e:
            problems.append(f"{f}:1: cannot read kernel file: {e.strerror}")
    return problems


def missing_pinned(pins: dict[Path, str], folder: Path) -> list[str]:
    return [
        f"{folder / PINS_FILE}:1: pinned kernel file {f} does not exist"
        for f in pins
        if not f.is_file()
    ]


def write_pins(folder: Path, files: Iterable[Path]) -> Path:
    """Write ``folder/kernels.yaml`` pinning ``files`` at their current contents."""
    import yaml

    folder = folder.resolve()
    pins = {str(f.resolve().relative_to(folder)): sha256_of(f.read_bytes()) for f in sorted(files)}
    path = folder / PINS_FILE
    path.write_text(yaml.safe_dump({"version": PINS_VERSION, "sha256": pins}, sort_keys=False))
    return path


@dataclass(frozen=True)
class Loading:
    """The kernel file being run, and the pins and permission rule it was loaded under:
    what a native build started by that file (:mod:`.native_build`) checks its sources by."""

    file: Path
    pins: dict[Path, str] | None
    folder: Path
    allow_world_writable: bool | None


_LOADING: ContextVar[Loading | None] = ContextVar("pdlkit_loading", default=None)


@contextlib.contextmanager
def loading(state: Loading) -> Iterator[None]:
    token = _LOADING.set(state)
    try:
        yield
    finally:
        _LOADING.reset(token)


def current_loading() -> Loading | None:
    """The kernel file being loaded in this thread, or None outside a load."""
    return _LOADING.get()


# -- permissions -------------------------------------------------------------------------------


def allowed_by_env() -> bool:
    return os.environ.get(ALLOW_ENV, "") == "1"


def _world_writable(st: os.stat_result) -> bool:
    return bool(st.st_mode & stat.S_IWOTH)


def world_writable(path: Path) -> str | None:
    """Why anyone could change what is loaded from ``path``, or None."""
    return _writable_by_anyone(path, set())


def _writable_by_anyone(path: Path, seen: set[Path]) -> str | None:
    try:
        path = path.resolve()
    except (OSError, RuntimeError):  # a symlink loop: nothing can be loaded through it
        return None
    if path in seen or not path.exists():
        return None
    seen.add(path)
    inside = [path]
    if path.is_dir():
        inside += sorted(path.rglob("*"))
    for p in inside:
        try:
            st = p.lstat()
        except OSError:
            continue
        if stat.S_ISLNK(st.st_mode):
            why = _link_target_writable(p, seen)
            if why:
                return why
        elif _world_writable(st):
            what = "folder" if stat.S_ISDIR(st.st_mode) else "file"
            return f"{p}: {what} is world-writable (mode {stat.S_IMODE(st.st_mode):o})"
    return _parent_writable(path)


def _parent_writable(path: Path) -> str | None:
    for parent in path.parents:
        try:
            st = parent.stat()
        except OSError:
            continue
        # a sticky world-writable parent (/tmp) lets others add entries, not replace ours
        if _world_writable(st) and not st.st_mode & stat.S_ISVTX:
            return f"{parent}: parent folder of {path} is world-writable without the sticky bit"
    return None


def _link_target_writable(link: Path, seen: set[Path]) -> str | None:
    """A symbolic link inside a checked folder: its target, and the folder the target sits
    in, must be no more open than the checked folder itself (a world-writable folder, sticky
    or not, lets anyone put the file there)."""
    try:
        target = link.resolve(strict=True)
    except (OSError, RuntimeError):  # dangling, or a loop: nothing is loaded through it
        return None
    folder = target if target.is_dir() else target.parent
    st = folder.stat()
    if _world_writable(st):
        return (
            f"{link}: symbolic link to {target}, in the world-writable folder {folder} "
            f"(mode {stat.S_IMODE(st.st_mode):o})"
        )
    why = _writable_by_anyone(target, seen)
    return f"{link}: symbolic link to {target}: {why}" if why else None


def check_writable(paths: Iterable[Path], kind: str, allow: bool | None = None) -> None:
    """Refuse world-writable pattern or kernel paths unless allowed."""
    if allow or (allow is None and allowed_by_env()):
        return
    for p in paths:
        why = world_writable(p)
        if why:
            raise TrustError(
                f"{why}; refusing to load {kind} from it (anyone could change the code pdlkit "
                f"runs). Fix the permissions, or set {ALLOW_ENV}=1 / allow_world_writable=True"
            )


# -- private folders (the native build cache) -------------------------------------------------


def _owner_ok(st: os.stat_result) -> bool:
    return st.st_uid in (os.geteuid(), 0)


def private_folder_problem(folder: Path) -> str | None:
    """Why ``folder`` cannot hold code pdlkit loads by a predictable name (the build cache):
    it is world-writable (sticky or not: others could add a library under the expected
    name), owned by someone other than you or root, or has a parent anyone may replace it in."""
    folder = folder.resolve()
    st = folder.stat()
    if not stat.S_ISDIR(st.st_mode):
        return f"{folder}: not a folder"
    if not _owner_ok(st):
        return (
            f"{folder}: folder is owned by uid {st.st_uid}, not by you (uid {os.geteuid()}) or root"
        )
    if _world_writable(st):
        return f"{folder}: folder is world-writable (mode {stat.S_IMODE(st.st_mode):o})"
    return _parent_writable(folder)


def read_private_file(path: Path) -> bytes | None:
    """The bytes of ``path`` in a private folder, read through one descriptor whose owner and
    mode are checked (not a symbolic link, owned by you or root, not world-writable); None
    when there is no such file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise TrustError(f"{path}: cannot open it safely (a symbolic link?): {e.strerror}") from e
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise TrustError(f"{path}: not a regular file")
        if not _owner_ok(st):
            raise TrustError(
                f"{path}: file is owned by uid {st.st_uid}, not by you (uid {os.geteuid()}) or root"
            )
        if _world_writable(st):
            raise TrustError(f"{path}: file is world-writable (mode {stat.S_IMODE(st.st_mode):o})")
        return f.read()

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
* **Permissions.** A pattern or kernel folder that anyone may write to (the folder, a
  folder or file inside it, or a parent without the sticky bit) is refused unless
  ``PDLKIT_ALLOW_WORLD_WRITABLE=1`` or ``allow_world_writable=True`` says otherwise.
* **No implicit paths.** Relative entries in ``PDLKIT_PATTERN_PATH`` / ``PDLKIT_KERNEL_PATH``
  are refused (see :mod:`pdlkit.config`); only explicit arguments resolve against the
  current directory.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterable
from pathlib import Path

PINS_FILE = "kernels.yaml"
PINS_VERSION = 1
ALLOW_ENV = "PDLKIT_ALLOW_WORLD_WRITABLE"


class TrustError(RuntimeError):
    """A kernel or pattern file or folder is refused; the message names it."""


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- pins --------------------------------------------------------------------------------------


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
        raise TrustError(f"{path}:{where}: invalid YAML: {getattr(e, 'problem', e)}") from None
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


# -- permissions -------------------------------------------------------------------------------


def allowed_by_env() -> bool:
    return os.environ.get(ALLOW_ENV, "") == "1"


def _world_writable(st: os.stat_result) -> bool:
    return bool(st.st_mode & stat.S_IWOTH)


def world_writable(path: Path) -> str | None:
    """Why anyone could change what is loaded from ``path``, or None."""
    path = path.resolve()
    if not path.exists():
        return None
    inside = [path]
    if path.is_dir():
        inside += sorted(path.rglob("*"))
    for p in inside:
        try:
            st = p.lstat()
        except OSError:
            continue
        if _world_writable(st) and not stat.S_ISLNK(st.st_mode):
            what = "folder" if stat.S_ISDIR(st.st_mode) else "file"
            return f"{p}: {what} is world-writable (mode {stat.S_IMODE(st.st_mode):o})"
    for parent in path.parents:
        try:
            st = parent.stat()
        except OSError:
            continue
        # a sticky world-writable parent (/tmp) lets others add entries, not replace ours
        if _world_writable(st) and not st.st_mode & stat.S_ISVTX:
            return f"{parent}: parent folder of {path} is world-writable without the sticky bit"
    return None


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

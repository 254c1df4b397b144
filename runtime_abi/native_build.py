"""Build native kernel libraries with the target's C compiler: one command for tests, CI and hosts.

The AArch64 kernels (``kernels/aarch64/a64_gemm.c``) are built with the command below; on an
AArch64 host with the system compiler, elsewhere with the cross compiler
``aarch64-linux-gnu-gcc`` (Debian package gcc-aarch64-linux-gnu)::

    aarch64-linux-gnu-gcc -O3 -march=armv8-a -mtune=neoverse-n2 -shared -fPIC \\
        -I runtime_abi/include kernels/aarch64/a64_gemm.c -lm -o libpdlkit_a64_gemm.so

>>> lib = build_library(A64_GEMM_SOURCE, arch="aarch64")  # doctest: +SKIP
>>> lib.name  # cached by the hash of the source, the header and the command  # doctest: +SKIP
'libpdlkit_a64_gemm-3f2a91c07d5e.so'

The same command is ``pdlkit build-kernels`` on the command line. Results are cached under
``PDLKIT_BUILD_DIR`` (default ``~/.cache/pdlkit/native``), keyed by what went into them, so a
second call costs a hash.

What is built, and what is loaded, is checked:

* **Sources.** A build compiles a private copy of the source and the headers beside it
  (``*.h`` and the like, in its folder and below), made from the bytes it read once. In a
  pinned kernel folder (:mod:`pdlkit.runtime_abi.trust`) each of them must match its pin
  first; elsewhere their folder must not be world-writable. A header outside that set
  (``#include "../x.h"``) is not found.
* **The cache.** ``PDLKIT_BUILD_DIR`` must be absolute; the cache folder must be yours (or
  root's) and not world-writable, nor replaceable through a parent. Beside each library a
  ``<name>.sha256`` (``sha256sum`` format) records its sha256 when it was built; a cached
  library whose bytes differ from the record is refused, one without a record is built
  again over it. The bytes hashed are the bytes loaded (:func:`pdlkit.runtime_abi.dlopen.open_library`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdlkit.runtime_abi.capability import host_arch
from pdlkit.runtime_abi.dlopen import open_library
from pdlkit.runtime_abi.native_abi import HEADER
from pdlkit.runtime_abi.native_load import load_native_library
from pdlkit.runtime_abi.registry import KernelLoadError
from pdlkit.runtime_abi.trust import (
    TrustError,
    check_pin,
    check_writable,
    current_loading,
    pins_folder,
    private_folder_problem,
    read_pins,
    read_private_file,
)

from pdlkit.config import PathError
from pdlkit.errors import PdlkitError

KERNELS = Path(__file__).resolve().parents[1] / "kernels"
A64_GEMM_SOURCE = KERNELS / "aarch64" / "a64_gemm.c"
A64_DRIVER_SOURCE = KERNELS / "aarch64" / "abi_driver.c"

# Plain Armv8-A baseline: the kernels' inner loops carry their own target attributes
# (i8mm, bf16, dotprod) and check hwcaps at run time, so one library serves every AArch64 CPU.
LIBRARY_FLAGS = {"aarch64": ("-O3", "-march=armv8-a", "-mtune=neoverse-n2")}
CROSS_COMPILERS = {"aarch64": "aarch64-linux-gnu-gcc"}
APT_PACKAGES = {"aarch64": "gcc-aarch64-linux-gnu"}


class BuildError(PdlkitError, RuntimeError):
    """A native build failed or its compiler is missing; the message says what to install."""


def compiler_for(arch: str) -> str:
    """The C compiler that targets ``arch`` from this host (``$CC`` / ``cc`` when native)."""
    if arch == host_arch():
        cc = os.environ.get("CC", "cc")
        found = shutil.which(cc)
        if found is None:
            raise BuildError(f"no C compiler {cc!r} on PATH to build {arch} kernels natively")
        return found
    cross = CROSS_COMPILERS.get(arch)
    found = shutil.which(cross) if cross else None
    if found is None:
        pkg = APT_PACKAGES.get(arch, f"a cross compiler for {arch}")
        raise BuildError(
            f"building {arch} kernels on {host_arch()} needs {cross or 'a cross compiler'} "
            f"(apt-get install {pkg})"
        )
    return found


def library_command(
    source: Path, out: Path, arch: str = "aarch64", extra: tuple[str, ...] = ()
) -> list[str]:
    """The documented build command for one kernel library (``extra``: flags a kernel file
    asks for, e.g. ``-fopenmp``)."""
    flags = LIBRARY_FLAGS.get(arch, ("-O3",))
    return [
        compiler_for(arch), *flags, *extra, "-shared", "-fPIC", "-Wall", "-I", str(HEADER.parent),
        str(source), "-lm", "-o", str(out),
    ]  # fmt: skip


def driver_command(out: Path, arch: str = "aarch64", source: Path = A64_DRIVER_SOURCE) -> list[str]:
    """The ABI driver (``kernels/aarch64/abi_driver.c``) that calls a library from files."""
    return [
        compiler_for(arch), "-O1", "-Wall", "-I", str(HEADER.parent), str(source),
        "-ldl", "-o", str(out),
    ]  # fmt: skip


BUILD_DIR_ENV = "PDLKIT_BUILD_DIR"
RECORD_SUFFIX = ".sha256"
# What a source may #include from its own folder: copied into the private build folder.
INCLUDED_SUFFIXES = frozenset(".h .hh .hpp .hxx .h++ .cuh .inc .inl .ipp .tcc".split())


@dataclass(frozen=True)
class Built:
    """A library or program in the build cache: its path, and the bytes whose sha256 matched
    its record (what a caller loads, rather than reading the path again)."""

    path: Path
    data: bytes
    digest: str


def cache_dir() -> Path:
    """``PDLKIT_BUILD_DIR``, or ``~/.cache/pdlkit/native``; a relative setting is refused."""
    raw = os.environ.get(BUILD_DIR_ENV, "")
    if not raw:
        return Path.home() / ".cache" / "pdlkit" / "native"
    path = Path(raw).expanduser()
    if not path.is_absolute():
        raise PathError(
            f"{BUILD_DIR_ENV}={raw!r} is a relative path; pdlkit loads nothing from the current "
            "directory implicitly: give an absolute path"
        )
    return path


def _inputs(source: Path) -> dict[str, bytes]:
    """``{name relative to the source's folder: bytes}`` of the source and the headers beside
    it, each read once and checked: against the pins of the kernel file being loaded (or of
    the source's folder), or, unpinned, for a world-writable folder."""
    source = source.resolve()
    root = source.parent
    state = current_loading()
    if state is None:
        pins, folder, allow = read_pins(root), root, None
    else:
        pins, folder, allow = (
            state.pins,
            pins_folder(state.folder).resolve(),
            state.allow_world_writable,
        )
    if pins is not None and not source.is_relative_to(folder):
        raise TrustError(
            f"{source}:1: native source is outside the pinned kernel folder {folder}; "
            "a pinned folder builds only its own pinned sources"
        )
    if pins is None:
        check_writable([root], "native sources", allow)
    files = [source] + [
        p
        for p in sorted(root.rglob("*"))
        if p.suffix.lower() in INCLUDED_SUFFIXES
        and p.is_file()
        and not any(part.startswith(".") for part in p.relative_to(root).parts)
    ]
    out: dict[str, bytes] = {}
    for f in files:
        data = f.read_bytes()
        check_pin(f, data, pins, folder)
        out[f.relative_to(root).as_posix()] = data
    return out


def _cache_folder(out_dir: Path | None, arch: str) -> Path:
    """The folder built files go to (the cache's folder for ``arch``, or ``out_dir``),
    created private (0700) and checked, with the cache folder above it."""
    root = out_dir.expanduser().absolute() if out_dir else cache_dir()
    folder = root if out_dir else root / arch
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    for f in dict.fromkeys([root, folder]):
        why = private_folder_problem(f)
        if why:
            raise TrustError(
                f"{why}; refusing it as the native build cache (whoever can write there chooses "
                f"the code pdlkit loads): use a folder only you can write, {BUILD_DIR_ENV}=/path"
            )
    return folder


@contextlib.contextmanager
def _locked(folder: Path, name: str) -> Iterator[None]:
    """One builder at a time of the file ``name`` in the cache folder (other processes
    included): a library and its record are written together. Other libraries build
    alongside (a registry loads its kernel files side by side: registry.load_files)."""
    import fcntl

    fd = os.open(
        folder / f".{name}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
    )
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _cached(out: Path, strict: bool = True) -> Built | None:
    """The cached file at ``out`` if its bytes match its record; None when there is no file
    or no record (it is built again, over it), or, not ``strict`` (read without the lock, a
    builder may be between its two renames), when they differ."""
    record = out.with_name(out.name + RECORD_SUFFIX)
    data = read_private_file(out)
    recorded = read_private_file(record)
    if data is None or recorded is None:
        return None
    want = recorded.decode(errors="replace").split(maxsplit=1)[:1]
    got = hashlib.sha256(data).hexdigest()
    if want != [got] and not strict:
        return None
    if want != [got]:
        raise TrustError(
            f"{out}: cached native library does not match the sha256 recorded when it was built "
            f"in {record}: sha256 {got}, recorded {want[0] if want else 'nothing'}; it changed "
            "after the build: delete both files to build it again"
        )
    return Built(out, data, got)


def _build(
    source: Path, stem: str, suffix: str, command: list[str], arch: str, out_dir: Path | None
) -> Built:
    """Build ``source`` with ``command`` (``@SRC``: the source, ``@OUT``: the output) from a
    private copy of what :func:`_inputs` read, or find it in the cache, verified."""
    inputs = _inputs(source)
    h = hashlib.sha256(HEADER.read_bytes())
    for name, data in inputs.items():
        h.update(f"\0{name}\0{len(data)}\0".encode() + data)
    h.update(" ".join(command).encode())
    folder = _cache_folder(out_dir, arch)
    out = folder / f"{stem}-{h.hexdigest()[:12]}{suffix}"
    found = _cached(out, strict=False)
    if found is not None:
        return found
    with _locked(folder, out.name):
        found = _cached(out)
        if found is not None:
            return found
        with tempfile.TemporaryDirectory(dir=folder, prefix=".build-") as tmp:
            src_dir, part = Path(tmp) / "src", Path(tmp) / out.name
            for name, data in inputs.items():
                (src_dir / name).parent.mkdir(parents=True, exist_ok=True)
                (src_dir / name).write_bytes(data)
            main = str(src_dir / source.resolve().name)
            cmd = [main if a == "@SRC" else str(part) if a == "@OUT" else a for a in command]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                shown = " ".join(cmd).replace(str(src_dir), str(source.resolve().parent))
                errors = r.stderr.replace(str(src_dir), str(source.resolve().parent))
                raise BuildError(f"{shown}\nfailed:\n{errors}")
            data = part.read_bytes()
            digest = hashlib.sha256(data).hexdigest()
            record = Path(tmp) / "record"
            record.write_text(f"{digest}  {out.name}\n")
            os.replace(part, out)
            os.replace(record, out.with_name(out.name + RECORD_SUFFIX))
    return Built(out, data, digest)


def _library(
    source: Path, arch: str, out_dir: Path | None = None, extra: tuple[str, ...] = ()
) -> Built:
    stem = "lib" + (
        "pdlkit_" + source.stem if not source.stem.startswith("pdlkit") else source.stem
    )
    cmd = library_command(Path("@SRC"), Path("@OUT"), arch, extra)
    return _build(source, stem, ".so", cmd, arch, out_dir)


def build_library(
    source: Path = A64_GEMM_SOURCE,
    arch: str = "aarch64",
    out_dir: Path | None = None,
    extra: tuple[str, ...] = (),
) -> Path:
    """Build (or find cached, verified) the kernel library from ``source`` for ``arch``, with
    the ``extra`` compiler flags (part of the cache key like the rest of the command). The
    headers beside the source (``#include "x.h"``) are part of what is built: a change to one
    builds anew."""
    return _library(source, arch, out_dir, extra).path


def _build_preferring(source: Path, arch: str, extra: tuple[str, ...]) -> Built:
    """The library built with the ``extra`` flags, or with the plain command where they fail
    (e.g. ``-fopenmp`` on a compiler without OpenMP)."""
    try:
        return _library(source, arch, extra=extra)
    except BuildError:
        if not extra:
            raise
        return _library(source, arch)


def load_c_library(
    source: Path,
    arch: str,
    what: str,
    extra: tuple[str, ...] = (),
    struct: tuple[str, int] | None = None,
) -> Any:
    """``ctypes.CDLL`` of the plain C library (no pdlkit_register) built from ``source``: what
    a kernel file that calls its C through ctypes loads. ``extra`` flags are tried first;
    ``struct = (symbol, size)`` checks that the library's ``symbol()`` returns the size of the
    parameter struct the caller mirrors. Where the build, the load or the check fails it warns
    once, naming ``what``, and returns None (the file then declares nothing)."""
    import warnings

    try:
        built = _build_preferring(source, arch, extra)
        lib = open_library(built.path, built.data, built.digest)
    except (BuildError, KernelLoadError, OSError) as e:
        warnings.warn(
            f"pdlkit: {source.name} could not be built, {what} not declared: {e}", stacklevel=2
        )
        return None
    if struct is not None and getattr(lib, struct[0])() != struct[1]:
        warnings.warn(f"pdlkit: {source.name}: parameter struct size mismatch", stacklevel=2)
        return None
    return lib


def build_and_load(
    source: Path, arch: str, what: str, extra: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The kernels (by name) of the library built from ``source`` for ``arch``: what a kernel
    folder's ``.py`` beside a C source declares. ``extra`` flags (e.g. ``-fopenmp``) are
    tried first, and the plain command where they fail. Without a working compiler it warns
    once, naming ``what``, and declares nothing, so the rest of the registry stays usable."""
    import warnings

    try:
        lib = _build_preferring(source, arch, extra)
    except BuildError as e:
        warnings.warn(f"{source}: {what} not available: {e}", stacklevel=2)
        return {}
    return {k.name: k for k in load_native_library(lib.path, lib.digest, lib.data)}


def build_driver(arch: str = "aarch64", out_dir: Path | None = None) -> Path:
    """Build (or find cached, verified) the ABI driver for ``arch``."""
    cmd = driver_command(Path("@OUT"), arch, Path("@SRC"))
    return _build(A64_DRIVER_SOURCE, "abi_driver", "", cmd, arch, out_dir).path

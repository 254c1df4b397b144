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
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from pdlkit.runtime_abi.native import HEADER

KERNELS = Path(__file__).resolve().parents[1] / "kernels"
A64_GEMM_SOURCE = KERNELS / "aarch64" / "a64_gemm.c"
A64_DRIVER_SOURCE = KERNELS / "aarch64" / "abi_driver.c"

# Plain Armv8-A baseline: the kernels' inner loops carry their own target attributes
# (i8mm, bf16, dotprod) and check hwcaps at run time, so one library serves every AArch64 CPU.
LIBRARY_FLAGS = {"aarch64": ("-O3", "-march=armv8-a", "-mtune=neoverse-n2")}
CROSS_COMPILERS = {"aarch64": "aarch64-linux-gnu-gcc"}
APT_PACKAGES = {"aarch64": "gcc-aarch64-linux-gnu"}


class BuildError(RuntimeError):
    """A native build failed or its compiler is missing; the message says what to install."""


def host_arch() -> str:
    arch = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(arch, arch)


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


def driver_command(out: Path, arch: str = "aarch64") -> list[str]:
    """The ABI driver (``kernels/aarch64/abi_driver.c``) that calls a library from files."""
    return [
        compiler_for(arch), "-O1", "-Wall", "-I", str(HEADER.parent), str(A64_DRIVER_SOURCE),
        "-ldl", "-o", str(out),
    ]  # fmt: skip


def cache_dir() -> Path:
    return Path(os.environ.get("PDLKIT_BUILD_DIR", Path.home() / ".cache" / "pdlkit" / "native"))


def _build(
    sources: list[Path],
    stem: str,
    suffix: str,
    command: list[str],
    arch: str,
    out_dir: Path | None,
    headers: list[Path] | None = None,
) -> Path:
    h = hashlib.sha256()
    for src in [*sources, HEADER, *(headers or [])]:
        h.update(src.read_bytes())
    h.update(" ".join(a for a in command if a not in (str(s) for s in sources)).encode())
    folder = (out_dir or cache_dir() / arch).expanduser()
    out = folder / f"{stem}-{h.hexdigest()[:12]}{suffix}"
    if out.is_file():
        return out
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        part = Path(tmp) / out.name
        cmd = [str(part) if a == "@OUT" else a for a in command]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise BuildError(f"{' '.join(cmd)}\nfailed:\n{r.stderr}")
        os.replace(part, out)  # atomic: concurrent builders agree on the result
    return out


def build_library(
    source: Path = A64_GEMM_SOURCE,
    arch: str = "aarch64",
    out_dir: Path | None = None,
    extra: tuple[str, ...] = (),
) -> Path:
    """Build (or find cached) the kernel library from ``source`` for ``arch``, with the
    ``extra`` compiler flags (part of the cache key like the rest of the command)."""
    stem = "lib" + (
        "pdlkit_" + source.stem if not source.stem.startswith("pdlkit") else source.stem
    )
    cmd = library_command(source, Path("@OUT"), arch, extra)
    # headers beside the source (#include "x.h") are part of what is built: a change to one
    # builds anew
    headers = sorted(source.parent.glob("*.h"))
    return _build([source], stem, ".so", cmd, arch, out_dir, headers)


def _build_preferring(source: Path, arch: str, extra: tuple[str, ...]) -> Path:
    """The library built with the ``extra`` flags, or with the plain command where they fail
    (e.g. ``-fopenmp`` on a compiler without OpenMP)."""
    try:
        return build_library(source, arch, extra=extra)
    except BuildError:
        if not extra:
            raise
        return build_library(source, arch)


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
    import ctypes
    import warnings

    try:
        lib = ctypes.CDLL(str(_build_preferring(source, arch, extra)))
    except (BuildError, OSError) as e:
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

    from pdlkit.runtime_abi.native import load_native_library

    try:
        lib = _build_preferring(source, arch, extra)
    except BuildError as e:
        warnings.warn(f"{source}: {what} not available: {e}", stacklevel=2)
        return {}
    return {k.name: k for k in load_native_library(lib)}


def build_driver(arch: str = "aarch64", out_dir: Path | None = None) -> Path:
    """Build (or find cached) the ABI driver for ``arch``."""
    return _build(
        [A64_DRIVER_SOURCE], "abi_driver", "", driver_command(Path("@OUT"), arch), arch, out_dir
    )

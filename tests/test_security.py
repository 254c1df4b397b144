"""Each way around the kernel trust rules, planted, and refused with the file named: C sources
and headers of a pinned folder, the native build cache, symbolic links into world-writable
folders, a library swapped between its check and its load, a kernel file that exits."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from pathlib import Path

import pytest
from conftest import write
from pdlkit.runtime_abi.dlopen import open_library
from pdlkit.runtime_abi.native_build import build_library, host_arch, load_c_library
from pdlkit.runtime_abi.registry import KernelLoadError, KernelRegistry, load_kernel_file
from pdlkit.runtime_abi.trust import TrustError, read_pins, write_pins

from pdlkit.cli import main
from pdlkit.config import PathError

needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (`cc`) on PATH")

# A kernel file that builds the C beside it when it is loaded, and leaves a marker when it runs.
BUILDING_KERNEL = """
import pathlib
from pdlkit.runtime_abi.native_build import host_arch, load_c_library

pathlib.Path(__file__).with_suffix(".ran").touch()
LIB = load_c_library(pathlib.Path(__file__).with_name("k.c"), host_arch(), "k")
"""


def _building(source: Path) -> str:
    """The kernel file, building ``source`` instead of the ``k.c`` beside it."""
    return BUILDING_KERNEL.replace(
        'pathlib.Path(__file__).with_name("k.c")', f"pathlib.Path({str(source)!r})"
    )


SOURCE = '#include "k.h"\nint f(void) { return VALUE; }\n'


@pytest.fixture(autouse=True)
def _private_build_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PDLKIT_BUILD_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("PDLKIT_ALLOW_WORLD_WRITABLE", raising=False)


@pytest.fixture
def pinned(tmp_path) -> Path:
    """A kernel folder whose kernel file builds ``k.c`` (which includes ``k.h``), all pinned."""
    k = tmp_path / "kernels"
    write(k, "kern.py", BUILDING_KERNEL)
    write(k, "k.c", SOURCE)
    write(k, "k.h", "#define VALUE 1\n")
    assert main(["pin", str(k)]) == 0
    return k


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _c_library(tmp_path: Path, value: int) -> Path:
    """A plain C library whose ``f()`` returns ``value``, outside any cache."""
    src = write(tmp_path / f"lib{value}", "f.c", f"int f(void) {{ return {value}; }}\n")
    return build_library(src, host_arch(), out_dir=src.parent / "out")


# -- 1. C sources and headers of a pinned folder ------------------------------------------------


def test_pin_command_pins_c_sources_headers_and_helpers(tmp_path, capsys):
    k = tmp_path / "kernels"
    for name in ("kern.py", "_helper.py", "k.c", "k.h", "Makefile", "README.md"):
        write(k, name, "# x\n")
    assert main(["pin", str(k)]) == 0
    assert f"{k / 'kernels.yaml'}: pinned 5 kernel file(s)" in capsys.readouterr().out
    assert sorted(p.name for p in read_pins(k) or {}) == [
        "Makefile", "_helper.py", "k.c", "k.h", "kern.py",
    ]  # fmt: skip


@needs_cc
@pytest.mark.parametrize("edited", ["k.c", "k.h"])
def test_edited_c_file_of_a_pinned_folder_is_refused_before_anything_runs(pinned, edited):
    changed = pinned / edited
    changed.write_text(changed.read_text() + "/* changed */\n")
    with pytest.raises(KernelLoadError) as e:
        KernelRegistry.from_folders([pinned])
    assert str(e.value).startswith(
        f"{changed}:1: kernel file does not match its pin in {pinned / 'kernels.yaml'}: "
        f"sha256 {_sha(changed)}"
    )
    assert not (pinned / "kern.ran").exists()


@needs_cc
def test_header_missing_from_the_pins_is_refused(pinned):
    write_pins(pinned, [pinned / "kern.py", pinned / "k.c"])  # pinned by hand, without k.h
    with pytest.raises(KernelLoadError, match=f"^{pinned / 'k.h'}:1: kernel file is not pinned"):
        KernelRegistry.from_folders([pinned])


@needs_cc
def test_check_reports_an_edited_header(pinned, capsys):
    assert main(["check", str(pinned)]) == 0
    (pinned / "k.h").write_text("#define VALUE 666\n")
    assert main(["check", str(pinned)]) == 1
    assert f"{pinned / 'k.h'}:1: kernel file does not match its pin" in capsys.readouterr().out


@needs_cc
def test_build_started_by_a_pinned_kernel_file_checks_its_sources(pinned):
    """Loading one file with its folder's pins (as ``pdlkit check`` does): the kernel file
    matches and runs, the build it starts refuses the edited source."""
    (pinned / "k.c").write_text(SOURCE.replace("VALUE", "666"))
    with pytest.raises(KernelLoadError) as e:
        load_kernel_file(pinned / "kern.py", read_pins(pinned), pinned)
    assert str(e.value).startswith(f"{pinned / 'k.c'}:1: kernel file does not match its pin")
    assert f"(while loading {pinned / 'kern.py'}:5)" in str(e.value)


@needs_cc
def test_pinned_build_compiles_only_pinned_files(pinned):
    """A file the source includes that no pin covers is not there to be compiled."""
    write(pinned, "table.txt", "666\n")
    write(pinned, "k.c", 'int f(void) { return\n#include "table.txt"\n; }\n')
    assert main(["pin", str(pinned)]) == 0  # table.txt is no code file: not pinned
    with pytest.warns(
        UserWarning, match=r"(?s)k\.c could not be built, k not declared.*table\.txt"
    ):
        KernelRegistry.from_folders([pinned])


@needs_cc
def test_pinned_kernel_file_may_not_build_a_source_outside_its_folder(tmp_path):
    k = tmp_path / "kernels"
    outside = write(tmp_path / "elsewhere", "k.c", "int f(void) { return 666; }\n")
    write(k, "kern.py", _building(outside))
    assert main(["pin", str(k)]) == 0
    with pytest.raises(KernelLoadError) as e:
        KernelRegistry.from_folders([k])
    assert str(e.value).startswith(
        f"{outside}:1: native source is outside the pinned kernel folder {k}"
    )


@needs_cc
def test_unpinned_kernel_file_may_not_build_a_world_writable_source(tmp_path):
    k, open_ = tmp_path / "kernels", tmp_path / "open"
    source = write(open_, "k.c", "int f(void) { return 666; }\n")
    open_.chmod(0o777)
    write(k, "kern.py", _building(source))
    with pytest.raises(KernelLoadError) as e:
        KernelRegistry.from_folders([k])
    assert str(e.value).startswith(f"{open_}: folder is world-writable (mode 777); refusing")


# -- 2. the native build cache ------------------------------------------------------------------


@needs_cc
def test_cached_library_changed_after_its_build_is_refused(tmp_path):
    src = write(tmp_path / "src", "f.c", "int f(void) { return 1; }\n")
    lib = build_library(src, host_arch())
    lib.write_bytes(_c_library(tmp_path, 666).read_bytes())
    with pytest.raises(TrustError) as e:
        build_library(src, host_arch())
    assert str(e.value).startswith(
        f"{lib}: cached native library does not match the sha256 recorded when it was built "
        f"in {lib}.sha256: sha256 {_sha(lib)}"
    )


@needs_cc
def test_cached_library_without_a_record_is_built_again_not_loaded(tmp_path):
    src = write(tmp_path / "src", "f.c", "int f(void) { return 1; }\n")
    lib = build_library(src, host_arch())
    Path(f"{lib}.sha256").unlink()
    lib.write_bytes(_c_library(tmp_path, 666).read_bytes())  # planted under the expected name
    assert load_c_library(src, host_arch(), "f").f() == 1
    assert Path(f"{lib}.sha256").read_text() == f"{_sha(lib)}  {lib.name}\n"


@needs_cc
@pytest.mark.parametrize("mode", [0o777, 0o1777], ids=["777", "1777"])
def test_world_writable_build_cache_is_refused(tmp_path, mode):
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(mode)
    src = write(tmp_path / "src", "f.c", "int f(void) { return 1; }\n")
    with pytest.raises(TrustError) as e:
        build_library(src, host_arch())
    assert str(e.value).startswith(
        f"{cache}: folder is world-writable (mode {mode:o}); refusing it as the native build cache"
    )


@needs_cc
@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
def test_build_cache_owned_by_another_user_is_refused(tmp_path):
    arch_folder = tmp_path / "cache" / host_arch()
    arch_folder.mkdir(parents=True)
    os.chown(arch_folder, 4242, 4242)
    src = write(tmp_path / "src", "f.c", "int f(void) { return 1; }\n")
    with pytest.raises(TrustError, match=f"^{arch_folder}: folder is owned by uid 4242, not by"):
        build_library(src, host_arch())


@needs_cc
def test_relative_build_dir_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PDLKIT_BUILD_DIR", "cache")
    src = write(tmp_path / "src", "f.c", "int f(void) { return 1; }\n")
    with pytest.raises(PathError, match="^PDLKIT_BUILD_DIR='cache' is a relative path"):
        build_library(src, host_arch())


@pytest.mark.skipif(
    shutil.which("cc" if host_arch() == "aarch64" else "aarch64-linux-gnu-gcc") is None,
    reason="needs a C compiler for AArch64",
)
def test_build_kernels_command_reports_a_refused_cache(tmp_path, capsys):
    (tmp_path / "cache").mkdir(mode=0o777)
    (tmp_path / "cache").chmod(0o777)
    assert main(["build-kernels", "--arch", "aarch64"]) == 1
    assert capsys.readouterr().err.startswith(
        f"pdlkit build-kernels: {tmp_path / 'cache'}: folder is world-writable (mode 777)"
    )


def test_check_reports_a_relative_build_dir(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PDLKIT_BUILD_DIR", "cache")
    write(tmp_path / "kernels", "k.py", "X = 1\n")
    assert main(["check", str(tmp_path / "kernels")]) == 1
    assert "PDLKIT_BUILD_DIR='cache' is a relative path" in capsys.readouterr().out


# -- 3. symbolic links into world-writable folders ----------------------------------------------


@pytest.mark.parametrize("mode", [0o777, 0o1777], ids=["777", "1777"])
def test_symlinked_kernel_file_in_a_world_writable_folder_is_refused_unrun(tmp_path, mode):
    k, open_ = tmp_path / "kernels", tmp_path / "open"
    target = write(
        open_, "sig.py", "import pathlib\npathlib.Path(__file__).with_suffix('.ran').touch()\n"
    )
    open_.chmod(mode)
    k.mkdir()
    (k / "sig.py").symlink_to(target)
    with pytest.raises(KernelLoadError) as e:
        KernelRegistry.from_folders([k])
    assert str(e.value).startswith(
        f"{k / 'sig.py'}: symbolic link to {target}, in the world-writable folder {open_} "
        f"(mode {stat.S_IMODE(mode):o}); refusing to load kernels from it"
    )
    assert not target.with_suffix(".ran").exists()


# -- 5. a library swapped between its check and its load ----------------------------------------


@needs_cc
def test_library_is_loaded_from_the_bytes_that_were_hashed(tmp_path):
    one, other = _c_library(tmp_path, 1), _c_library(tmp_path, 666)
    data = one.read_bytes()
    shutil.copyfile(other, one)  # the file changed after its bytes were read and checked
    lib = open_library(one, data, hashlib.sha256(data).hexdigest())
    assert lib.f() == 1


# -- 14. a kernel file that exits ---------------------------------------------------------------


def test_system_exit_in_a_kernel_file_is_a_load_error_naming_its_line(tmp_path):
    kf = write(tmp_path / "kernels", "bye.py", "import sys\n\nsys.exit(3)\n")
    with pytest.raises(KernelLoadError, match=rf"^{kf}:3: SystemExit\(3\) raised while loading"):
        KernelRegistry.from_folders([kf.parent])


def test_keyboard_interrupt_in_a_kernel_file_still_interrupts(tmp_path):
    kf = write(tmp_path / "kernels", "stop.py", "raise KeyboardInterrupt\n")
    with pytest.raises(KeyboardInterrupt):
        KernelRegistry.from_folders([kf.parent])

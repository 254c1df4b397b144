"""Kernel folders are code: sha256 pins, no implicit relative paths, no world-writable folders."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import torch
from conftest import KERNEL_HEADER, linear_act_pattern, make_folders, sigmoid_kernel, write
from pdlkit.runtime_abi.trust import write_pins

import pdlkit
from pdlkit import config
from pdlkit.cli import main

# The kernel leaves a marker when its file runs, so a test can tell that nothing ran.
KERNEL = """
import pathlib
pathlib.Path(__file__).with_suffix(".ran").touch()
""" + sigmoid_kernel()


@pytest.fixture
def folders(tmp_path):
    p, k = make_folders(tmp_path, KERNEL, file="sig.py")
    return p, k, k / "sig.py"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_pinned_kernel_file_loads(folders, mlp):
    p, k, kf = folders
    pins = write_pins(k, [kf])
    assert f"sig.py: {_sha(kf)}" in pins.read_text()
    model, x = mlp
    with torch.no_grad():
        torch.testing.assert_close(pdlkit.optimize(model, patterns=p, kernels=k)(x), model(x))


def test_kernel_file_that_does_not_match_its_pin_is_refused_unrun(folders):
    p, k, kf = folders
    write_pins(k, [kf])
    kf.write_text(kf.read_text() + "\n# changed\n")
    with pytest.raises(pdlkit.PdlkitError) as e:
        pdlkit.optimize(torch.nn.Linear(2, 2), patterns=p, kernels=k)
    assert f"{kf}:1: kernel file does not match its pin in {k / 'kernels.yaml'}" in str(e.value)
    assert f"sha256 {_sha(kf)}" in str(e.value)
    assert not kf.with_suffix(".ran").exists()


def test_unpinned_file_in_a_pinned_folder_is_refused_unrun(folders):
    p, k, kf = folders
    write_pins(k, [kf])
    extra = write(k, "extra.py", KERNEL_HEADER + KERNEL.replace("k_lin_sigmoid", "k_other"))
    with pytest.raises(pdlkit.PdlkitError, match=f"{extra}:1: kernel file is not pinned in"):
        pdlkit.optimize(torch.nn.Linear(2, 2), patterns=p, kernels=k)
    assert not extra.with_suffix(".ran").exists()


def test_relative_path_in_environment_is_refused(folders, monkeypatch):
    p, k, _ = folders
    monkeypatch.chdir(k.parent)
    monkeypatch.setenv("PDLKIT_KERNEL_PATH", "kernels")
    with pytest.raises(
        pdlkit.PdlkitError, match="PDLKIT_KERNEL_PATH entry 'kernels' is a relative"
    ):
        pdlkit.optimize(torch.nn.Linear(2, 2), patterns=p)


def test_nothing_is_loaded_from_the_current_directory_by_default(folders, monkeypatch):
    _, k, kf = folders
    monkeypatch.chdir(k)  # a folder full of kernels and patterns is the current directory
    monkeypatch.delenv("PDLKIT_KERNEL_PATH", raising=False)
    monkeypatch.delenv("PDLKIT_PATTERN_PATH", raising=False)
    assert config.kernel_paths() == [config.shipped_kernels()]
    assert config.pattern_paths() == [config.shipped_patterns()]
    pdlkit.optimize(torch.nn.Linear(2, 2))
    assert not kf.with_suffix(".ran").exists()


@pytest.mark.parametrize("which", ["kernels", "patterns"])
def test_world_writable_folder_is_refused_unless_allowed(folders, which, monkeypatch):
    p, k, kf = folders
    folder = k if which == "kernels" else p
    folder.chmod(0o777)
    monkeypatch.delenv("PDLKIT_ALLOW_WORLD_WRITABLE", raising=False)
    with pytest.raises(pdlkit.PdlkitError) as e:
        pdlkit.optimize(torch.nn.Linear(2, 2), patterns=p, kernels=k)
    assert f"{folder}: folder is world-writable (mode 777); refusing to load {which}" in str(
        e.value
    )
    assert not kf.with_suffix(".ran").exists()
    pdlkit.optimize(torch.nn.Linear(2, 2), patterns=p, kernels=k, allow_world_writable=True)
    monkeypatch.setenv("PDLKIT_ALLOW_WORLD_WRITABLE", "1")
    pdlkit.optimize(torch.nn.Linear(2, 2), patterns=p, kernels=k)


def test_world_writable_file_inside_a_kernel_folder_is_refused(folders, monkeypatch):
    p, k, kf = folders
    kf.chmod(0o666)
    monkeypatch.delenv("PDLKIT_ALLOW_WORLD_WRITABLE", raising=False)
    with pytest.raises(pdlkit.PdlkitError, match=f"{kf}: file is world-writable"):
        pdlkit.optimize(torch.nn.Linear(2, 2), patterns=p, kernels=k)


def test_check_reports_pins_relative_paths_and_world_writable(tmp_path, monkeypatch, capsys):
    pinned, open_, _ = tmp_path / "pinned", tmp_path / "open", tmp_path / "x"
    kf = write(pinned, "sig.py", KERNEL_HEADER + KERNEL)
    write_pins(pinned, [kf])
    kf.write_text(kf.read_text() + "# changed\n")
    write(open_, "ls.pdl.mlir", linear_act_pattern("lin_sigmoid", "sigmoid", "lin_sigmoid"))
    open_.chmod(0o777)
    monkeypatch.setenv("PDLKIT_PATTERN_PATH", f"rel/patterns{os.pathsep}@shipped")
    monkeypatch.delenv("PDLKIT_ALLOW_WORLD_WRITABLE", raising=False)
    assert main(["check", str(pinned), str(open_)]) == 1
    out = capsys.readouterr().out
    assert f"{kf}:1: kernel file does not match its pin" in out
    assert f"{open_}: folder is world-writable (mode 777)" in out
    assert "PDLKIT_PATTERN_PATH entry 'rel/patterns' is a relative path" in out
    assert not kf.with_suffix(".ran").exists()


def test_pin_command_pins_every_kernel_file(folders, mlp, capsys):
    p, k, kf = folders
    assert main(["pin", str(k)]) == 0
    assert f"{k / 'kernels.yaml'}: pinned 1 kernel file(s)" in capsys.readouterr().out
    assert main(["check", str(k)]) == 0
    kf.write_text(kf.read_text() + "# changed\n")
    assert main(["check", str(k)]) == 1


def test_the_folder_walk_follows_links_once_and_ends_on_a_loop(tmp_path: Path) -> None:
    """config.files_under (the plan's stamp and kernel fingerprints): a linked folder is
    walked, a link back up the tree is not walked again, and only pattern / kernel files
    (or the suffixes asked for) are listed."""
    root = tmp_path / "kernels"
    (root / "sub").mkdir(parents=True)
    (root / "a.py").write_text("")
    (root / "sub" / "b.pdl.mlir").write_text("")
    (root / "sub" / "notes.txt").write_text("")
    (root / "sub" / "k.c").write_text("")
    other = tmp_path / "other"
    other.mkdir()
    (other / "c.yaml").write_text("")
    (root / "linked").symlink_to(other, target_is_directory=True)
    (root / "sub" / "up").symlink_to(root, target_is_directory=True)  # a loop
    names = [f.relative_to(root).as_posix() for f in config.files_under([root])]
    assert names == ["a.py", "linked/c.yaml", "sub/b.pdl.mlir"]
    assert [f.name for f in config.files_under([root], (".c",))] == ["k.c"]

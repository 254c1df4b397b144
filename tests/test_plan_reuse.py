"""A backend loads its plan once while nothing the load reads changed: ``optimize`` loads it up
front and its first compilation reuses it; an edited, re-permissioned or re-pinned file, or
a changed environment, loads again with every check."""

from __future__ import annotations

import os

import pytest
import torch
from conftest import linear_act_pattern, make_folders, sigmoid_kernel, write
from pdlkit.runtime_abi.trust import write_pins

import pdlkit
from pdlkit import backend as backend_mod
from pdlkit.backend import PdlkitBackend
from pdlkit.errors import ConfigError
from pdlkit.plan import plan_stamp

SIG_KERNEL = sigmoid_kernel(decl=', dtypes={"x": [torch.float32]}')


@pytest.fixture
def folders(tmp_path, monkeypatch):
    monkeypatch.delenv("PDLKIT_ALLOW_WORLD_WRITABLE", raising=False)
    return make_folders(tmp_path, SIG_KERNEL)


@pytest.fixture
def loads(monkeypatch):
    """The options of every ``load_plan`` the backend makes."""
    calls = []
    real = backend_mod.load_plan

    def counting(opts):
        calls.append(opts)
        return real(opts)

    monkeypatch.setattr(backend_mod, "load_plan", counting)
    return calls


def _substitutions(model, x, **kw) -> int:
    pdlkit.stats(reset=True)
    with torch.no_grad():
        f = pdlkit.optimize(model, default_codegen="eager", autotune="off", **kw)
        torch.testing.assert_close(f(x), model(x))
    return pdlkit.stats()["substitutions"]


def test_optimize_loads_the_plan_once(mlp, folders, loads):
    model, x = mlp
    p, k = folders
    assert _substitutions(model, x, patterns=p, kernels=k) == 1
    assert len(loads) == 1  # the constructor's; the first compilation reused it


def test_each_optimize_loads_and_sees_a_changed_pattern_file(mlp, folders, loads):
    model, x = mlp
    p, k = folders
    assert _substitutions(model, x, patterns=p, kernels=k) == 1
    path = p / "lin_sigmoid.pdl.mlir"
    path.write_text(path.read_text().replace("torch.aten.sigmoid", "torch.aten.tanh"))
    assert _substitutions(model, x, patterns=p, kernels=k) == 0
    assert len(loads) == 2  # one per optimize, never shared between backends


def test_a_file_changed_before_the_first_call_is_loaded_again(mlp, folders, loads):
    model, x = mlp
    p, k = folders
    pdlkit.stats(reset=True)
    with torch.no_grad():
        f = pdlkit.optimize(model, patterns=p, kernels=k, default_codegen="eager", autotune="off")
        write(p, "lin_sigmoid.pdl.mlir", linear_act_pattern("lin_sigmoid", "tanh", "lin_sigmoid"))
        torch.testing.assert_close(f(x), model(x))
    assert len(loads) == 2
    assert pdlkit.stats()["substitutions"] == 0


def test_reuse_keeps_the_permission_check(folders, loads):
    p, k = folders
    b = PdlkitBackend(patterns=p, kernels=k)
    plan = b.plan(b.options)
    assert b.plan(b.options) is plan and len(loads) == 1
    k.chmod(0o777)
    try:
        with pytest.raises(ConfigError, match="world-writable"):
            b.plan(b.options)
    finally:
        k.chmod(0o755)
    assert b.plan(b.options) is not plan


def test_reuse_keeps_the_pin_check(folders, loads):
    p, k = folders
    write_pins(k, [k / "k.py"])
    b = PdlkitBackend(patterns=p, kernels=k)
    b.plan(b.options)
    kernel = k / "k.py"
    st = kernel.stat()
    kernel.write_bytes(kernel.read_bytes()[:-1] + b"#")  # same size, other bytes
    os.utime(kernel, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(ConfigError, match="does not match its pin"):
        b.plan(b.options)
    assert len(loads) == 2


def test_the_environment_is_part_of_the_stamp(folders, monkeypatch, loads):
    p, k = folders
    k.chmod(0o777)
    try:
        monkeypatch.setenv("PDLKIT_ALLOW_WORLD_WRITABLE", "1")
        b = PdlkitBackend(patterns=p, kernels=k)
        b.plan(b.options)
        b.plan(b.options)
        assert len(loads) == 1
        monkeypatch.delenv("PDLKIT_ALLOW_WORLD_WRITABLE")
        with pytest.raises(ConfigError, match="world-writable"):
            b.plan(b.options)
    finally:
        k.chmod(0o755)


def test_stamp_sees_an_edit_that_keeps_size_and_mtime(folders):
    p, k = folders
    opts = PdlkitBackend(patterns=p, kernels=k).options
    before = plan_stamp(opts)
    path = p / "lin_sigmoid.pdl.mlir"
    st = path.stat()
    path.write_text(path.read_text().replace("torch.aten.sigmoid", "torch.aten.tanh   "))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size
    assert plan_stamp(opts) != before  # ctime: no one can put it back


def test_stamp_follows_links_and_changes_with_their_target(tmp_path, folders):
    p, k = folders
    elsewhere = write(tmp_path / "elsewhere", "extra.py", "X = 1\n")
    (k / "linked").symlink_to(elsewhere.parent, target_is_directory=True)
    opts = PdlkitBackend(patterns=p, kernels=k).options
    before = plan_stamp(opts)
    assert plan_stamp(opts) == before
    elsewhere.write_text("X = 2\n")
    assert plan_stamp(opts) != before


def test_a_backend_reuses_its_plan_and_files_stamp_until_a_file_changes(mlp, folders, loads):
    model, x = mlp
    p, k = folders
    b = PdlkitBackend(patterns=p, kernels=k, default_codegen="eager", autotune="off")
    pdlkit.stats(reset=True)
    with torch.no_grad():
        torch.compile(model, backend=b)(x)
        stamp = b._stamp
        torch._dynamo.reset()
        torch.compile(model, backend=b)(x)
        assert len(loads) == 1 and b._stamp == stamp == b._current_stamp(b.options)
        write(p, "lin_sigmoid.pdl.mlir", linear_act_pattern("lin_sigmoid", "tanh", "lin_sigmoid"))
        assert b != b  # Dynamo compiles again with the new file
        torch._dynamo.reset()
        torch.compile(model, backend=b)(x)
    assert len(loads) == 2 and b._stamp == b._current_stamp(b.options) != stamp
    assert pdlkit.stats()["substitutions"] == 2  # the first two compilations only


def test_a_reload_sees_an_edit_that_keeps_size_and_mtime(mlp, folders):
    """The parsed patterns are reused across loads only while no file changed, ctime included
    (an editor or ``cp -p`` can put size and mtime back; no one can put ctime back)."""
    model, x = mlp
    p, k = folders
    assert _substitutions(model, x, patterns=p, kernels=k) == 1
    path = p / "lin_sigmoid.pdl.mlir"
    st = path.stat()
    path.write_text(path.read_text().replace('"torch.aten.sigmoid"', '"torch.aten.tanh"   '))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    torch._dynamo.reset()
    assert _substitutions(model, x, patterns=p, kernels=k) == 0

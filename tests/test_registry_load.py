"""A kernel folder's files load side by side (registry.load_files: their native builds wait on
a compiler each), yet register in file order, and a bad file is reported as one loaded alone
would be."""

from __future__ import annotations

import sys
import threading
import types

import pytest
from conftest import write
from pdlkit.runtime_abi.registry import KernelRegistry

from pdlkit.errors import KernelLoadError

KERNEL = """
import torch
import pdlkit
import _pdlkit_test_meeting as meeting

meeting.barrier.wait()  # returns once the other file's load has reached here too

def meta(x):
    return x.new_empty(x.shape)

@pdlkit.kernel(op="{op}", meta=meta)
def {name}(x: torch.Tensor) -> torch.Tensor:
    return x
"""


@pytest.fixture
def meeting(monkeypatch):
    """A barrier two kernel files wait at while they load: loaded one after the other, the
    first would wait alone and fail after the timeout."""
    shared = types.SimpleNamespace(barrier=threading.Barrier(2, timeout=20))
    monkeypatch.setitem(sys.modules, "_pdlkit_test_meeting", shared)
    return shared


def test_two_files_of_a_folder_load_at_the_same_time_and_register_in_file_order(tmp_path, meeting):
    write(tmp_path, "b_second.py", KERNEL.format(op="same_op", name="b_kernel"))
    write(tmp_path, "a_first.py", KERNEL.format(op="same_op", name="a_kernel"))
    reg = KernelRegistry.from_folders([tmp_path])
    assert [k.name for k in reg.for_op("same_op")] == ["a_kernel", "b_kernel"]


def test_a_file_that_fails_is_reported_with_its_line_while_others_load(tmp_path, meeting):
    write(tmp_path, "a_good.py", KERNEL.format(op="op_a", name="a_kernel"))
    write(tmp_path, "b_meets.py", KERNEL.format(op="op_b", name="b_kernel"))
    write(tmp_path, "c_bad.py", "x = 1\nraise RuntimeError('broken kernel file')\n")
    with pytest.raises(KernelLoadError, match=r"c_bad\.py:2.*broken kernel file"):
        KernelRegistry.from_folders([tmp_path])

"""Memory: resident memory stays flat over many calls; recompiling frees old packed weights."""

from __future__ import annotations

import gc
import os
import weakref

import pytest
import torch
from conftest import KERNEL_HEADER, MLP, linear_act_pattern, write
from pdlkit.runtime_abi.prepack import CACHE

import pdlkit


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.fixture
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # a shared machine: intra-op threads would only wait on each other
    yield
    torch.set_num_threads(n)


def test_ten_thousand_calls_keep_resident_memory_flat(one_thread):
    torch.manual_seed(0)
    model = MLP(64, 256).eval()
    x = torch.randn(8, 64)
    with torch.no_grad():
        f = torch.compile(model, backend="pdlkit")
        for _ in range(1000):  # warm: compiled, packed, allocator pools filled
            f(x)
        pdlkit.stats(reset=True)
        gc.collect()
        before = rss_bytes()
        for _ in range(10_000):
            f(x)
        gc.collect()
        growth = rss_bytes() - before
    st = pdlkit.stats()
    assert st["kernel_calls"] == 20_000 and st["prepack_misses"] == 0  # packed weights reused
    assert growth < 4 << 20, f"resident memory grew by {growth / 2**20:.1f} MiB over 10k calls"


PACKED = """
def pack(w, attrs):
    return w.t().contiguous()

@pdlkit.kernel(op="lin_relu", meta=meta, prepack=pack, prepack_arg="w")
def k_packed_old(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    return torch.relu(x @ w + b)
"""


def test_recompiling_with_a_changed_pattern_set_frees_old_packed_weights(tmp_path, mlp):
    model, x = mlp
    p, k = tmp_path / "p", tmp_path / "k"
    pattern = write(p, "lr.pdl.mlir", linear_act_pattern("lin_relu", "relu", "lin_relu"))
    write(k, "k.py", KERNEL_HEADER + PACKED)
    f = pdlkit.optimize(model, patterns=p, kernels=k, default_codegen="eager")
    with torch.no_grad():
        f(x)
        packed = [
            weakref.ref(v[0]) for key, v in CACHE._entries.items() if key[0] == "k_packed_old"
        ]
        assert len(packed) == 1 and "k_packed_old" in CACHE.kernels()
        # the pattern now matches linear -> tanh, which the model does not have
        pattern.write_text(pattern.read_text().replace('"torch.aten.relu"', '"torch.aten.tanh"'))
        f = pdlkit.optimize(model, patterns=p, kernels=k, default_codegen="eager")
        torch.testing.assert_close(f(x), model(x))  # compiles with the changed set
    gc.collect()
    assert "k_packed_old" not in CACHE.kernels()
    assert packed[0]() is None  # the packed weight is freed, while the weight itself lives
    assert model.fc1.weight is not None

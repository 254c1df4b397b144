"""Host detection and named targets."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from pdlkit.runtime_abi import autotune, capability
from pdlkit.runtime_abi.capability import NAMED, cpu_flags, features_off, host, resolve

import pdlkit

X86 = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_vnni avx512_bf16 amx_tile amx_int8\n"
ARM = "processor\t: 0\nFeatures\t: fp asimd asimddp sve i8mm bf16 sve2 sha3\nCPU part\t: 0xd49\n"


def test_x86_flags():
    assert cpu_flags("x86_64", X86) == {
        "avx2",
        "avx512f",
        "avx512_vnni",
        "avx512_bf16",
        "amx_tile",
        "amx_int8",
    }


def test_aarch64_hwcaps():
    assert cpu_flags("aarch64", ARM) == {"asimddp", "sve", "i8mm", "bf16", "sve2"}


def test_host_is_this_machine():
    h = host()
    assert h.name == "host" and "cpu" in h.devices and h.arch in ("x86_64", "aarch64")


def test_named_and_dict_targets():
    assert resolve("yitian").features >= {"i8mm", "bf16", "sve2"}
    assert resolve("cuda-sm90").matches("cuda") and resolve("cuda-sm90").matches("sm_90")
    custom = resolve({"arch": "aarch64", "features": ["asimddp"]})
    assert custom.arch == "aarch64" and custom.matches("asimddp") and not custom.matches("i8mm")
    assert set(NAMED) >= {"x86-avx512-vnni", "yitian", "cuda-sm90"}


def test_unknown_target_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown target 'yitan'; known: host, aarch64, cuda-sm80"):
        resolve("yitan")


def test_features_off_takes_feature_names_and_the_amx_family():
    assert features_off("amx") == {"amx_tile", "amx_int8", "amx_bf16"}
    assert features_off(" AVX512_BF16, amx_int8 ") == {"avx512_bf16", "amx_int8"}
    assert features_off("") == frozenset()


def test_features_off_with_an_unknown_name_names_the_variable():
    with pytest.raises(pdlkit.PdlkitError, match="PDLKIT_FEATURES_OFF='amz': 'amz' names no feature; known: amx, amx_bf16"):  # fmt: skip
        features_off("amz")


@pytest.fixture
def features_off_env(monkeypatch):
    """``set(value)``: PDLKIT_FEATURES_OFF set, and host() and the decision key read again
    (both are cached per process); both read again after the test, without it."""

    def clear():
        capability.host.cache_clear()
        autotune.host_key.cache_clear()

    def set_off(value: str) -> None:
        monkeypatch.setenv("PDLKIT_FEATURES_OFF", value)
        clear()

    clear()
    yield set_off
    monkeypatch.undo()
    clear()


def test_host_leaves_out_the_features_turned_off(features_off_env):
    had = host().features
    features_off_env("amx,avx512_vnni")
    h = host()
    off = {"amx_tile", "amx_int8", "amx_bf16", "avx512_vnni"}
    assert not off & h.features and h.turned_off == off & had
    if h.turned_off:
        assert "turned off (PDLKIT_FEATURES_OFF): " in h.describe()


def test_decisions_with_features_off_are_keyed_apart(features_off_env):
    assert "features off" not in autotune.host_key()
    some = sorted(host().features & set(capability.FEATURE_ARCH))  # amx_* where there is AMX
    if not some:
        pytest.skip("the host reports none of the ISA features pdlkit names")
    features_off_env(some[0])
    assert autotune.host_key()["features off"] == [some[0]]


_TILES = """
from pdlkit.kernels.x86 import qlinear_vnni
from pdlkit.runtime_abi.dlopen import opened
lib = opened(qlinear_vnni.qlinear_q_amx.digest)
print(int(lib.pdlkit_amx_tiles(0)), int(lib.pdlkit_amx_tiles(1)))
"""


@pytest.mark.skipif(
    not {"amx_int8", "amx_bf16"} <= host().features, reason="needs amx_int8 and amx_bf16 (lscpu)"
)
@pytest.mark.parametrize(
    "off, tiles",
    [
        ("", "1 1"),
        ("amx", "0 0"),
        ("AMX_TILE", "0 0"),
        ("amx_bf16", "1 0"),
        ("avx2, amx_int8", "0 1"),
    ],
)
def test_c_kernels_keep_off_the_tiles_when_amx_is_turned_off(off, tiles):
    """The C libraries ask cpuid, not host(): the variable reaches them too, family by family
    (pdlkit_amx_tiles(0): AMX-INT8, (1): AMX-BF16)."""
    env = {**os.environ, "PDLKIT_FEATURES_OFF": off}
    run = subprocess.run([sys.executable, "-c", _TILES], env=env, capture_output=True, text=True)
    if "has no attribute 'qlinear_q_amx'" in run.stderr:
        pytest.skip("the x86 int8 library is not built here (no C compiler)")
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == tiles.split()


def test_a_misspelled_feature_stops_optimize_with_the_variable_named(features_off_env):
    features_off_env("amz")
    with pytest.raises(
        pdlkit.ConfigError, match="PDLKIT_FEATURES_OFF='amz': 'amz' names no feature"
    ):
        pdlkit.optimize(torch.nn.Linear(4, 4))

"""Host detection and named targets."""

from __future__ import annotations

import pytest
from pdlkit.runtime_abi.capability import NAMED, cpu_flags, host, resolve

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

"""Host feature detection and named targets.

A target is what kernel selection and pattern ``targets:`` are checked against. It is
detected from the host by default, or named so that a plan can be shown for a machine we
are not on (``target="yitian"``).
"""

from __future__ import annotations

import functools
import os
import platform
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pdlkit.errors import ConfigError

# ISA features this process must not use, whatever the CPU has: ``amx`` (every amx_* feature)
# or feature names, comma-separated. What a Xeon with AMX runs without it, as a CPU without
# AMX would (pdlkit's AMX kernels are not eligible, its C kernels keep off the tiles); pair it
# with oneDNN's own ``ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16`` for torch's side.
FEATURES_OFF_ENV = "PDLKIT_FEATURES_OFF"

_X86_FLAGS = {
    "avx2": "avx2",
    "avx512f": "avx512f",
    "avx512_vnni": "avx512_vnni",
    "avx512vnni": "avx512_vnni",
    "avx512_bf16": "avx512_bf16",
    "avx_vnni": "avx_vnni",  # 256-bit VNNI (Intel client CPUs): oneDNN's int8 sums in int32
    "amx_tile": "amx_tile",
    "amx_int8": "amx_int8",
    "amx_bf16": "amx_bf16",
}
_ARM_FLAGS = {"asimddp": "asimddp", "i8mm": "i8mm", "bf16": "bf16", "sve": "sve", "sve2": "sve2"}
# the CPU architecture each ISA feature belongs to (a kernel requiring one is for that arch)
FEATURE_ARCH = {
    **{f: "x86_64" for f in _X86_FLAGS.values()},
    **{f: "aarch64" for f in _ARM_FLAGS.values()},
}


@dataclass(frozen=True)
class Target:
    """What a program will run on: architecture, ISA features and devices."""

    name: str
    arch: str
    features: frozenset[str]
    devices: frozenset[str] = frozenset({"cpu"})
    # A target named for planning (``explain --target cuda-sm90`` on a laptop) says where the
    # model's tensors would live there, so kernel choice is made as if they were on it.
    models_on: str | None = None
    # what the machine has but this process was told not to use (FEATURES_OFF_ENV)
    turned_off: frozenset[str] = frozenset()

    def matches(self, selector: str) -> bool:
        """True when a manifest's ``targets:`` entry names this target, its arch, a device or a feature."""
        return (
            selector in (self.name, self.arch)
            or selector in self.devices
            or selector in self.features
        )

    def describe(self) -> str:
        feats = ", ".join(sorted(self.features)) or "none"
        off = f"; turned off ({FEATURES_OFF_ENV}): {', '.join(sorted(self.turned_off))}" if self.turned_off else ""  # fmt: skip
        return f"{self.name} ({self.arch}; devices {', '.join(sorted(self.devices))}; features {feats}{off})"


NAMED: dict[str, Target] = {
    "x86-64": Target("x86-64", "x86_64", frozenset({"avx2"})),
    "x86-avx512-vnni": Target(
        "x86-avx512-vnni", "x86_64", frozenset({"avx2", "avx512f", "avx512_vnni", "avx512_bf16"})
    ),
    "x86-amx": Target(
        "x86-amx",
        "x86_64",
        frozenset(
            {"avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16"}
        ),
    ),
    "yitian": Target("yitian", "aarch64", frozenset({"asimddp", "i8mm", "bf16", "sve", "sve2"})),
    "aarch64": Target("aarch64", "aarch64", frozenset({"asimddp"})),
    "cuda-sm80": Target(
        "cuda-sm80", "x86_64", frozenset({"sm_80"}), frozenset({"cpu", "cuda"}), "cuda"
    ),
    "cuda-sm90": Target(
        "cuda-sm90", "x86_64", frozenset({"sm_80", "sm_90"}), frozenset({"cpu", "cuda"}), "cuda"
    ),
}


def cpu_flags(arch: str, text: str | None = None) -> set[str]:
    """ISA features from /proc/cpuinfo text: x86 "flags", AArch64 "Features" (the hwcaps)."""
    table = _X86_FLAGS if arch == "x86_64" else _ARM_FLAGS
    if text is None:
        try:
            with open("/proc/cpuinfo") as f:
                text = f.read()
        except OSError:
            return set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return {table[w] for w in value.split() if w in table}
    return set()


def _amx_granted() -> bool:
    """Whether Linux gives this process the AMX tile state: asks for it as the AMX kernels do
    (``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``, x86-64 syscall 158; asking again
    is harmless). torch's ``_is_amx_tile_supported`` said no on a Xeon whose tiles ran (torch
    2.11, the GPU machine's host), so the AMX kernels were never eligible there."""
    import ctypes

    try:
        return int(ctypes.CDLL(None).syscall(158, 0x1023, 18)) == 0
    except (OSError, AttributeError):
        return False


def features_off(raw: str | None = None) -> frozenset[str]:
    """The features :data:`FEATURES_OFF_ENV` turns off (``raw`` instead of the environment):
    each entry a feature name, or a family (``amx``: amx_tile, amx_int8, amx_bf16)."""
    if raw is None:
        raw = os.environ.get(FEATURES_OFF_ENV, "")
    known = set(FEATURE_ARCH)
    off: set[str] = set()
    for entry in (e.strip().lower() for e in raw.split(",")):
        hits = {f for f in known if f == entry or f.startswith(entry + "_")} if entry else set()
        if entry and not hits:
            raise ConfigError(
                f"{FEATURES_OFF_ENV}={raw!r}: {entry!r} names no feature; known: amx, "
                + ", ".join(sorted(known))
            )
        off |= hits
    return frozenset(off)


def host_arch() -> str:
    """This machine's CPU architecture by pdlkit's names: x86_64 or aarch64 (amd64 and arm64
    as other systems spell them)."""
    arch = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(arch, arch)


@functools.cache
def host() -> Target:
    """The machine this process runs on (CPU features from /proc/cpuinfo, CUDA from torch),
    less what :data:`FEATURES_OFF_ENV` turns off (read once, at the first call)."""
    arch = host_arch()
    features = cpu_flags(arch)
    devices = {"cpu"}
    import torch

    # /proc/cpuinfo lists AMX whenever the CPU has it; Linux must also grant the tile state
    if "amx_tile" in features and not _amx_granted():
        features -= {"amx_tile", "amx_int8", "amx_bf16"}
    off = features & features_off()
    features -= off
    try:
        if torch.cuda.is_available():
            devices.add("cuda")
            major, minor = torch.cuda.get_device_capability()
            features.update(f"sm_{m}0" for m in range(8, major + 1) if m * 10 <= major * 10 + minor)
    except Exception:  # no usable CUDA runtime: a CPU-only host
        pass
    return Target("host", arch, frozenset(features), frozenset(devices), turned_off=frozenset(off))


def resolve(target: None | str | Mapping[str, Any] | Target) -> Target:
    """``None`` = the host; a name from :data:`NAMED`; or a dict ``{"arch":..., "features": [...]}``."""
    if target is None:
        return host()
    if isinstance(target, Target):
        return target
    if isinstance(target, str):
        if target == "host":
            return host()
        if target not in NAMED:
            raise ValueError(f"unknown target {target!r}; known: host, {', '.join(sorted(NAMED))}")
        return NAMED[target]
    if isinstance(target, Mapping):
        feats: Iterable[str] = target.get("features", ())
        return Target(
            str(target.get("name", "custom")),
            str(target.get("arch", host().arch)),
            frozenset(feats),
            frozenset(target.get("devices", ("cpu",))),
        )
    raise TypeError(f"target must be None, a name, a dict or a Target, got {type(target).__name__}")

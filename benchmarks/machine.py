"""What a benchmark result ran on and what it measured: shared by the benchmark scripts."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_SOURCES = ("patterns", "kernels", "pdlkit", "matcher", "runtime_abi", "quantization")


def _cpuinfo(field: str) -> str | None:
    """What follows the colon of /proc/cpuinfo's first ``field`` line; None where there is none."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(field):
                return line.split(":", 1)[1]
    except OSError:
        pass
    return None


# Arm's /proc/cpuinfo names no model: its implementer and part codes (for Alibaba's Yitian 710,
# implementer 0x41 (Arm), part 0xd49, Neoverse N2)
_ARM_PARTS = {"0xd0c": "Neoverse N1", "0xd40": "Neoverse V1", "0xd49": "Neoverse N2",
              "0xd4f": "Neoverse V2"}  # fmt: skip


def cpu_model() -> str:
    model = _cpuinfo("model name")
    if model is not None:
        return model.strip()
    part = (_cpuinfo("CPU part") or "").strip()
    if part:
        impl = (_cpuinfo("CPU implementer") or "?").strip()
        return f"Arm CPU implementer {impl}, part {part} ({_ARM_PARTS.get(part, 'unknown part')})"
    return "unknown"


def provenance() -> str:
    """The pdlkit commit measured, and the source files (tracked or new) changed at that time."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "status", "--porcelain", "--", *_SOURCES],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.splitlines()
    except OSError:
        return "- pdlkit: git not available"
    if not head and os.environ.get("PDLKIT_COMMIT"):  # a wheel run with no checkout near
        return f"- pdlkit at commit {os.environ['PDLKIT_COMMIT']} (a wheel built from it)"
    files = [line[3:] for line in changed]
    dirty = (
        f" + uncommitted changes (working tree as measured) to {', '.join(files)}"
        if files
        else " (clean)"
    )
    return f"- pdlkit at commit {head or '?'}{dirty}"


def _flags() -> list[str]:
    return (_cpuinfo("flags") or _cpuinfo("Features") or "").split()  # x86 / AArch64


_KERNEL_FLAGS = ("avx512_vnni", "avx512_bf16", "amx", "i8mm", "bf16", "sve", "asimddp")


def cpu_flags() -> str:
    """The ISA flags the kernels care about (x86: avx512_vnni, avx512_bf16, amx_*; AArch64:
    i8mm, bf16, sve*, asimddp), or why none."""
    flags = _flags()
    if not flags:
        return "?"
    keep = [f for f in flags if f.startswith(_KERNEL_FLAGS)]
    return " ".join(sorted(keep)) or "none of " + " / ".join(_KERNEL_FLAGS)


def amx() -> list[str]:
    """The AMX flags of this CPU (amx_bf16, amx_int8, amx_tile, ...); empty without AMX."""
    return sorted(f for f in _flags() if f.startswith("amx"))


def isa_caps() -> str:
    """What this run turned off of the CPU's ISA ("" when nothing): pdlkit's
    PDLKIT_FEATURES_OFF and oneDNN's ONEDNN_MAX_CPU_ISA (torch's int8 and BF16 GEMMs)."""
    caps = [f"{v}={os.environ[v]}" for v in ("PDLKIT_FEATURES_OFF", "ONEDNN_MAX_CPU_ISA") if os.environ.get(v)]  # fmt: skip
    return f"; turned off for this run: {', '.join(caps)}" if caps else ""


def versions(*names: str) -> str:
    """``name version`` for each installed distribution, ``name -`` for a missing one."""
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for n in names:
        try:
            out.append(f"{n} {version(n)}")
        except PackageNotFoundError:
            out.append(f"{n} -")
    return ", ".join(out)


def gpu_name() -> str:
    try:
        import torch

        if torch.cuda.is_available():
            return f"{torch.cuda.get_device_name(0)} (x{torch.cuda.device_count()})"
    except Exception as e:  # a broken CUDA set-up must not stop a CPU benchmark
        return f"? ({type(e).__name__})"
    return "none"


def host_header(threads: int | None = None) -> list[str]:
    """Markdown bullets for a results file: date, CPU and AMX, threads, GPU, versions, commit."""
    import datetime
    import platform

    import torch

    nproc = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    has_amx = amx()
    return [
        f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"- CPU: {cpu_model()} ({platform.machine()}); nproc {nproc}; ISA flags: {cpu_flags()}",
        f"- AMX: {'yes (' + ' '.join(has_amx) + ')' if has_amx else 'no'}{isa_caps()}",
        f"- threads: {threads if threads is not None else '-'} "
        f"(torch.get_num_threads() {torch.get_num_threads()})",
        f"- GPU: {gpu_name()}",
        f"- Python {platform.python_version()}, torch {torch.__version__}; "
        + versions("torchao", "transformers", "torch-mlir"),
        f"- load average (1/5/15 min): {' / '.join(f'{x:.2f}' for x in os.getloadavg())}",
        provenance(),
        f"- pdlkit imported from {_pdlkit_location()}",
    ]


def _pdlkit_location() -> str:
    """Where ``import pdlkit`` finds the package: this checkout, or an installed copy whose
    commit ``provenance()`` cannot tell."""
    import importlib.util

    spec = importlib.util.find_spec("pdlkit")
    where = Path(spec.origin).parent if spec and spec.origin else None
    if where is None:
        return "? (not importable)"
    return "this checkout" if where == ROOT / "pdlkit" else f"{where} (not this checkout)"

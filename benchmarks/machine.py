"""What a benchmark result ran on and what it measured: shared by the benchmark scripts."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_SOURCES = ("patterns", "kernels", "pdlkit", "matcher", "runtime_abi", "quantization")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
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
    files = [line[3:] for line in changed]
    dirty = (
        f" + uncommitted changes (working tree as measured) to {', '.join(files)}"
        if files
        else " (clean)"
    )
    return f"- pdlkit at commit {head or '?'}{dirty}"

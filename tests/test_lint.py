"""The committed formatter and type-checker settings stay clean."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "cmd", [["ruff", "check", "."], ["ruff", "format", "--check", "."], ["mypy"]]
)
def test_tool_is_clean(cmd):
    if shutil.which(cmd[0]) is None:
        pytest.skip(f"{cmd[0]} is not installed (pip install -e '.[test]')")
    r = subprocess.run(
        [sys.executable, "-m", *cmd], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stdout + r.stderr

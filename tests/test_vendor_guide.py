"""docs/vendor_guide.md runs: its files are written and its commands run, in order, in an empty folder."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "vendor_guide.md"
_BLOCK = re.compile(r"^```(\w*)([^\n]*)\n(.*?)^```\s*$", re.S | re.M)


def blocks() -> list[tuple[str, str, str]]:
    """(language, file= target or "", body) of every fenced block, in order."""
    out = []
    for lang, info, body in _BLOCK.findall(GUIDE.read_text()):
        m = re.search(r"file=(\S+)", info)
        out.append((lang, m.group(1) if m else "", body))
    return out


def test_every_command_of_the_vendor_guide_runs(tmp_path):
    script = ["set -euo pipefail"]
    for lang, target, body in blocks():
        if target:
            path = tmp_path / target
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(body)
        elif lang == "sh":
            script.append(body)
    assert len(script) >= 6, "the guide lost its commands"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PDLKIT_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    r = subprocess.run(
        ["bash", "-c", "\n".join(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "wrote my_vendor/patterns/linear_leaky_relu.pdl.mlir" in out
    assert re.search(r"linear_leaky_relu_addmm\s+reference float32\s+PASS", out), out
    assert "0 error(s), 0 warning(s)" in out
    assert re.search(
        r"linear_leaky_relu -> linear_leaky_relu_addmm\s+at leaky_relu\s+my_vendor/model.py:11",
        out,
    ), out
    # the excerpts the guide shows are what the commands wrote and printed
    generated = (tmp_path / "my_vendor/patterns/linear_leaky_relu.pdl.mlir").read_text()
    shown = [body for lang, target, body in blocks() if not lang and not target]
    assert len(shown) == 3
    for line in shown[0].splitlines():
        if "..." not in line:
            assert line.strip() in generated, line
    printed = " ".join(out.split())
    for excerpt in shown[1:]:
        for line in excerpt.splitlines():
            assert " ".join(line.split()) in printed, line
    # another target's int8 linear: one kernel file and one manifest line, checked and used
    assert not (tmp_path / "my_vendor/patterns/linear_leaky_relu.reference.py").exists()
    assert re.search(r"qlinear_mine\s+reference uint8\s+PASS", out), out
    assert re.search(r"qlinear -> qlinear_mine\s+at ", out), out
    page = (tmp_path / "report.html").read_text()
    assert 'data-pattern="linear_leaky_relu" data-kernel="linear_leaky_relu_addmm"' in page

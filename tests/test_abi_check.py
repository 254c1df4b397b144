"""pdlkit abi-check: declaration, opcheck, reference comparison, per kernel."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import KERNEL_HEADER, write

from pdlkit.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_every_shipped_kernel_passes(capsys):
    assert main(["abi-check", str(ROOT / "kernels")]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^linear_gelu_addmm +reference float32 +PASS", out, re.M)
    assert "FAIL" not in out


def _check(tmp_path, body: str, capsys) -> tuple[int, str]:
    write(tmp_path, "k.py", KERNEL_HEADER + body)
    rc = main(["abi-check", str(tmp_path / "k.py")])
    return rc, capsys.readouterr().out


def test_wrong_numbers_fail_with_the_error(tmp_path, capsys):
    rc, out = _check(
        tmp_path,
        """
@pdlkit.kernel(op="linear_relu", meta=meta, dtypes={"x": [torch.float32]})
def k_no_bias(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    return torch.relu(x @ w.t())
""",
        capsys,
    )
    assert rc == 1
    assert re.search(r"^k_no_bias +reference float32 +FAIL +max abs error", out, re.M)


def test_a_kernel_writing_into_its_input_fails(tmp_path, capsys):
    rc, out = _check(
        tmp_path,
        """
@pdlkit.kernel(op="linear_relu", meta=meta, dtypes={"x": [torch.float32]})
def k_scribbler(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    y = torch.relu(torch.nn.functional.linear(x, w, b))
    x.zero_()
    return y
""",
        capsys,
    )
    assert rc == 1 and "modified its input" in out


def test_a_kernel_declining_every_example_fails_with_its_reason(tmp_path, capsys):
    rc, out = _check(
        tmp_path,
        """
@pdlkit.kernel(op="linear_relu", meta=meta, dtypes={"x": [torch.float32]})
def k_picky(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    raise pdlkit.KernelUnsupported(f"{x.shape[0]} rows: takes more than 4096")
""",
        capsys,
    )
    assert rc == 1
    line = next(s for s in out.splitlines() if s.startswith("k_picky") and "opcheck" in s)
    assert "FAIL" in line and "declines every example input of op 'linear_relu'" in line
    assert "takes more than 4096" in line


def test_kernel_for_another_isa_is_skipped_not_failed(tmp_path, capsys):
    rc, out = _check(
        tmp_path,
        """
@pdlkit.kernel(op="linear_relu", meta=meta, requires=["sve2"])
def k_sve(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    return torch.relu(torch.nn.functional.linear(x, w, b))
""",
        capsys,
    )
    assert rc == 0 and re.search(r"^k_sve +run +SKIP +host lacks sve2", out, re.M)


def test_kernel_without_a_reference_fails(tmp_path, capsys):
    rc, out = _check(
        tmp_path,
        """
@pdlkit.kernel(op="mystery", meta=lambda x: x.new_empty(x.shape))
def k_mystery(x: Tensor) -> Tensor:
    return x.clone()
""",
        capsys,
    )
    assert rc == 1 and "no reference for op 'mystery'" in out

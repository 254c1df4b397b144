"""What Inductor is handed by the backend: graphs with pdlkit ops, and the whole-graph check's
other candidates (pdlkit/inductor_options.py, matcher/graph_guard.py)."""

from __future__ import annotations

import logging

import pytest
import torch
from autotune_chain import CHAIN_PATTERN, HEADER, Chain, calls, inputs
from conftest import write

import pdlkit

LOWERED = """
@pdlkit.kernel(op="chain", meta=meta, priority=1)
def lowered_chain(a: Tensor, wb: Tensor, wc: Tensor) -> Tensor:
    return a @ (wb.t() @ wc.t())
"""


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_inductor_meets_pdlkit_ops_with_their_lowering(tmp_path, monkeypatch):
    """No implicit fallback for a pdlkit op: its log line formats every argument's IR, which
    torch 2.11 does with logging off and which took minutes on BERT-base's late layers."""
    monkeypatch.setenv("PDLKIT_CACHE_DIR", str(tmp_path / "cache"))
    write(tmp_path / "p", "chain.pdl.mlir", CHAIN_PATTERN)
    write(tmp_path / "k", "chain.py", HEADER + LOWERED)
    log = logging.getLogger("torch._inductor.graph")
    lines, level = Lines(), log.level
    log.addHandler(lines)
    log.setLevel(logging.INFO)
    try:
        torch._dynamo.reset()
        pdlkit.stats(reset=True)
        model = pdlkit.optimize(
            Chain(), patterns=tmp_path / "p", kernels=tmp_path / "k", autotune="off"
        )
        with torch.no_grad():
            y = model(*inputs())
    finally:
        log.removeHandler(lines)
        log.setLevel(level)
    torch.testing.assert_close(y, Chain()(*inputs()), rtol=1e-4, atol=1e-3)
    assert calls(pdlkit.stats(), "lowered_chain") == 1
    implicit = [m for m in lines.lines if "implicit fallback" in m and "pdlkit" in m]
    assert implicit == []


def test_a_graph_that_fails_to_compile_is_no_candidate(tmp_path, monkeypatch):
    """The whole-graph check keeps the substituted graph (already compiled) when another
    candidate's compile raises, and says which and why once."""
    from pdlkit.matcher import graph_guard

    monkeypatch.setenv("PDLKIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(graph_guard, "CONFIDENT", float("inf"))  # compile every candidate

    def broken():
        raise RuntimeError("no lowering for pdlkit.x\n  args[0]: ...")

    ours = lambda *a: "substituted"  # noqa: E731
    with pytest.warns(UserWarning, match="inductor graph did not compile: RuntimeError: no lo"):
        verdict, fn, decision = graph_guard.choose(
            "k", lambda: ours, broken, (torch.randn(2),), "cached", 0.0
        )
    assert verdict == graph_guard.SUBSTITUTED and fn() == "substituted"
    assert "inductor excluded (did not compile" in decision.describe()

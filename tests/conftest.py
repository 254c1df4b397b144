from __future__ import annotations

import os
import tempfile
import textwrap
from pathlib import Path

import pytest
import torch

import pdlkit

# Tests of the substitution machinery expect the static choice (which kernel measures fastest
# depends on the host and its load); tests/test_autotune.py turns measurement on where it is
# the subject. Decisions never go to the developer's own cache.
os.environ["PDLKIT_AUTOTUNE"] = "off"
os.environ["PDLKIT_CACHE_DIR"] = tempfile.mkdtemp(prefix="pdlkit-test-cache-")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(textwrap.dedent(text).lstrip())
    return path


# A linear -> relu pattern whose kernel is named by `op`; reused by many tests.
def linear_act_pattern(name: str, act: str, op: str, benefit: int = 1, extra: str = "") -> str:
    return f"""
    pdl.pattern @{name} : benefit({benefit}) {{
      %x = pdl.operand
      %w = pdl.operand
      %b = pdl.operand
      %t = pdl.type
      %lin = pdl.operation "torch.aten.linear"(%x, %w, %b : !pdl.value, !pdl.value, !pdl.value) -> (%t : !pdl.type)
      %y = pdl.result 0 of %lin
      %act = pdl.operation "torch.aten.{act}"(%y : !pdl.value) -> (%t : !pdl.type)
      {extra}
      pdl.rewrite %act {{
        %op = pdl.attribute = "{op}"
        pdl.apply_native_rewrite "pdlkit_call"(%op, %x, %w, %b, %act : !pdl.attribute, !pdl.value, !pdl.value, !pdl.value, !pdl.operation)
      }}
    }}
    """


KERNEL_HEADER = """
import torch
from torch import Tensor
import pdlkit

def meta(x, w, b):
    return x.new_empty((*x.shape[:-1], w.shape[0]))
"""


class MLP(torch.nn.Module):
    """linear -> relu -> linear -> sigmoid: one linear+relu site, one linear+sigmoid site."""

    def __init__(self, d: int = 16, h: int = 32):
        super().__init__()
        self.fc1 = torch.nn.Linear(d, h)
        self.fc2 = torch.nn.Linear(h, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.fc2(torch.relu(self.fc1(x))))


@pytest.fixture
def mlp():
    torch.manual_seed(0)
    return MLP().eval(), torch.randn(4, 16)


def explain(model, *inputs, **kw) -> pdlkit.matcher.report.Report:  # type: ignore[name-defined]
    return pdlkit.explain(model, *inputs, **kw)

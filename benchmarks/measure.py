"""Small measuring and reporting helpers shared by the benchmarks."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch


def last_hidden(out: Any) -> torch.Tensor:
    """A model's main output: the tensor itself, or the first field of a ModelOutput / tuple
    (``last_hidden_state`` for transformers' base models)."""
    if isinstance(out, torch.Tensor):
        return out
    return out[0]


def p10(values: list[float]) -> float:
    """10th percentile: the latency when no other job shared the core."""
    if len(values) < 10:
        return min(values)
    return statistics.quantiles(values, n=10)[0]


def md_table(head: str, rows: Iterable[Sequence[Any]]) -> list[str]:
    """A Markdown table's lines: ``head`` ("| a | b |"), the rule under it, a line per row of
    cells."""
    return [
        head,
        "|" + "---|" * (head.count("|") - 1),
        *("| " + " | ".join(map(str, r)) + " |" for r in rows),
    ]


def write_report(path: Path, text: str) -> None:
    """Write a benchmark's report (its folder made as needed), print it and where it went."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print("\n" + text)
    print(f"written to {path}")


def interleaved(
    fns: dict[str, Callable[[], Any]], rounds: int, calls: int
) -> dict[str, list[float]]:
    """Seconds per call of each function, one window of ``calls`` calls per function and round:
    the functions take turns, so that a burst of load on a shared machine lands on all."""
    per_call: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            per_call[name].append((time.perf_counter() - t0) / calls)
    return per_call


def md_section(title: str, *lines: str) -> list[str]:
    """A report's ``## title`` section: a blank line, the title, a blank line, ``lines``."""
    return ["", f"## {title}", "", *lines]

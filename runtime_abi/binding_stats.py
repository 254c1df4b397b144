"""Counters behind ``pdlkit.stats()``: substitutions, kernel calls, fallbacks, pre-pack cache."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

_STATS_LOCK = threading.Lock()
_STATS: Counter[tuple[str, str]] = Counter()
_TOTALS = (
    "substitutions",
    "kernel_calls",
    "fallbacks",
    "prepack_hits",
    "prepack_misses",
    "prepack_evictions",
)


def count(event: str, kernel: str, n: int = 1) -> None:
    with _STATS_LOCK:
        _STATS[(event, kernel)] += n


def stats(reset: bool = False) -> dict[str, Any]:
    """Counts of substitutions, kernel calls, fallbacks and pre-pack cache events, in total and per kernel."""
    with _STATS_LOCK:
        snapshot = dict(_STATS)
        if reset:
            _STATS.clear()
    totals = dict.fromkeys(_TOTALS, 0)
    by_kernel: dict[str, dict[str, int]] = {}
    for (event, kernel), n in snapshot.items():
        by_kernel.setdefault(kernel, dict.fromkeys(_TOTALS, 0))[event] = (
            by_kernel.get(kernel, {}).get(event, 0) + n
        )
        totals[event] = totals.get(event, 0) + n
    return {**totals, "by_kernel": by_kernel}

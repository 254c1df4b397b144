"""Counters behind ``pdlkit.stats()``: substitutions, kernel calls, fallbacks, pre-pack cache."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

# One counter per thread, summed when read: counting on the hot path takes no lock and
# loses no increment when threads call kernels concurrently.
_STATS_LOCK = threading.Lock()
_COUNTERS: list[Counter[tuple[str, str]]] = []
_LOCAL = threading.local()
_TOTALS = (
    "substitutions",
    "kernel_calls",
    "fallbacks",
    "verifications",
    "disabled",
    "prepack_hits",
    "prepack_misses",
    "prepack_evictions",
)


def _mine() -> Counter[tuple[str, str]]:
    c: Counter[tuple[str, str]] = Counter()
    with _STATS_LOCK:
        _COUNTERS.append(c)
    _LOCAL.c = c
    return c


def bump(key: tuple[str, str]) -> None:
    """count() for the hot path: the (event, kernel) key is built once by the caller."""
    c = getattr(_LOCAL, "c", None)
    if c is None:
        c = _mine()
    c[key] += 1


def count(event: str, kernel: str, n: int = 1) -> None:
    c = getattr(_LOCAL, "c", None)
    if c is None:
        c = _mine()
    c[(event, kernel)] += n


def stats(reset: bool = False) -> dict[str, Any]:
    """Counts of substitutions, kernel calls, fallbacks, first-call verifications and
    substitutions they disabled (per shape), and pre-pack cache events; in total and per kernel."""
    snapshot: Counter[tuple[str, str]] = Counter()
    with _STATS_LOCK:
        for c in _COUNTERS:
            snapshot.update(c)  # a read racing an increment sees it now or at the next read
            if reset:
                c.clear()
    totals = dict.fromkeys(_TOTALS, 0)
    by_kernel: dict[str, dict[str, int]] = {}
    for (event, kernel), n in snapshot.items():
        by_kernel.setdefault(kernel, dict.fromkeys(_TOTALS, 0))[event] = (
            by_kernel.get(kernel, {}).get(event, 0) + n
        )
        totals[event] = totals.get(event, 0) + n
    return {**totals, "by_kernel": by_kernel}

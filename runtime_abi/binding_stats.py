"""Counters behind ``pdlkit.stats()``: substitutions, kernel calls, fallbacks, pre-pack cache."""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

# One counter per thread, summed when read: counting on the hot path takes no lock and
# loses no increment when threads call kernels concurrently. A finished thread's counts
# are folded into _RETIRED, so a server that starts a thread per request stays bounded.
_STATS_LOCK = threading.Lock()
_COUNTERS: list[tuple[threading.Thread, dict[tuple[str, str], int]]] = []
_RETIRED: Counter[tuple[str, str]] = Counter()
LOCAL = threading.local()
_TOTALS = (
    "substitutions",
    "kernel_calls",
    "fallbacks",
    "verifications",
    "disabled",
    "prepack_hits",
    "prepack_misses",
    "prepack_evictions",
    "tuning_hits",  # sites whose kernel choice came from the autotune cache
    "tuning_misses",  # sites measured
    "tuning_us",  # microseconds spent measuring
    "tuning_unsteady",  # decisions timed on a busy host (autotune.trusted): used, not cached
    "substitutions_undone",  # in graphs whose Inductor-only code measured faster as a whole
    "graphs_left_to_inductor",  # compiled by Inductor alone: a cached verdict, no matching
    # shape buckets of graphs with dynamic shapes that run Inductor's code for the whole graph
    "buckets_to_inductor",
    # substituted graphs the whole-graph check could not time (explain says why)
    "graphs_not_measured",
    # kernel calls whose site id found no site (a direct torch.ops.pdlkit call; in a compiled
    # graph, a lost site: the whole output check on every call, no fallback)
    "calls_without_site",
    "traces_from_disk",  # re-traces read from disk (pdlkit/trace_store.py), not made again
    "matches_from_disk",  # graphs whose match records were read back, not matched again
)


def new_counter() -> dict[tuple[str, str], int]:
    """This thread's counts (kept in ``LOCAL.c``), created on its first event."""
    # a plain dict: incrementing a Counter (a dict subclass) costs three times as much
    c: dict[tuple[str, str], int] = {}
    with _STATS_LOCK:
        alive = []
        for t, old in _COUNTERS:
            if t.is_alive():
                alive.append((t, old))
            else:
                _RETIRED.update(old)
        _COUNTERS[:] = alive
        _COUNTERS.append((threading.current_thread(), c))
    LOCAL.c = c
    return c


def count(event: str, kernel: str, n: int = 1) -> None:
    try:
        c = LOCAL.c
    except AttributeError:
        c = new_counter()
    c[(event, kernel)] = c.get((event, kernel), 0) + n


@contextlib.contextmanager
def uncounted() -> Iterator[None]:
    """Kernel calls made on this thread inside the block are not counted (autotune's timing
    calls: ``stats()`` reports what the model ran)."""
    saved = {k: LOCAL.__dict__[k] for k in ("c", "k") if k in LOCAL.__dict__}
    scratch: dict[tuple[str, str], int] = {}
    LOCAL.c = LOCAL.k = scratch
    try:
        yield
    finally:
        for k in ("c", "k"):
            if k in saved:
                setattr(LOCAL, k, saved[k])
            else:
                LOCAL.__dict__.pop(k, None)


def stats(reset: bool = False) -> dict[str, Any]:
    """Counts of substitutions, kernel calls, fallbacks, first-call verifications and
    substitutions they disabled (per shape), and pre-pack cache events; in total and per kernel."""
    snapshot: Counter[tuple[str, str]] = Counter()
    with _STATS_LOCK:
        snapshot.update(_RETIRED)
        if reset:
            _RETIRED.clear()
        for _, c in _COUNTERS:
            # dict.copy is one C call, atomic under the GIL: iterating a counter while its
            # thread adds a key would raise "dictionary changed size during iteration"
            snapshot.update(dict.copy(c))  # an increment racing this read shows up next time
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

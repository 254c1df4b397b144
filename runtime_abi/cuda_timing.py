"""GPU time of a call, with the host's launch cost kept out of it.

    before: ``reps`` calls between two CUDA events. A call whose GPU work is shorter than
            its launch (a decode-shaped GEMM: 20 us on an H200, against 15-60 us to launch it
            from Python) left the GPU idle between calls, so the events timed the host:
            the measured choice kept Llama-3's 64-row down projections as ``_int_mm`` (32 us
            of GPU time) over the split-K kernel (21 us), and decode 64 ran 1.38x BF16
            Inductor with CUDA graphs where the kernel gave 1.54x
    after:  the GPU is held by a spin kernel (``torch.cuda._sleep``) while the host enqueues
            every call, so the events time the calls' GPU work back to back, as a CUDA graph
            or a host that runs ahead would run it. A sample whose hold ended before the host
            had enqueued every call is taken again with a longer hold.

The host's cost per call is not the site's to judge: with CUDA graphs it is gone, and
without them the host runs ahead of the GPU wherever a step's GPU work is longer than its
launches. The whole-graph check (matcher/graph_guard.py) times its graphs with their launches
(``autotune.measure(..., gpu_time=False)``: :func:`issued_seconds`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

# a hold's length: this many times the host's last enqueue time for as many calls, plus a
# floor for a first sample; never over the cap (a call that synchronizes inside cannot be
# run ahead of, and its sample is what it is)
SLACK, FLOOR_S, CAP_S = 1.5, 2e-3, 0.1
_TRIES = 3
_cycles_per_s: dict[int, float] = {}


def _events() -> tuple[Any, Any]:
    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def issued_seconds(fn: Callable[[], Any], reps: int) -> float:
    """Seconds per call between two events around ``reps`` calls as the host issues them:
    the launch cost is in it wherever it is the longer (a whole graph's timing)."""
    start, end = _events()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / reps


def _spin_rate() -> float:
    """``torch.cuda._sleep``'s cycles per second on the current device (timed once)."""
    dev = torch.cuda.current_device()
    if dev not in _cycles_per_s:
        cycles = 2_000_000
        torch.cuda._sleep(1000)  # load the kernel first
        seconds = issued_seconds(lambda: torch.cuda._sleep(cycles), 1)
        _cycles_per_s[dev] = cycles / max(seconds, 1e-6)
    return _cycles_per_s[dev]


def gpu_seconds(fn: Callable[[], Any], reps: int) -> float:
    """Seconds of GPU time per call over ``reps`` calls enqueued behind a hold (see above)."""
    hold = FLOOR_S
    per_call = 0.0
    for _ in range(_TRIES):
        start, end = _events()
        torch.cuda._sleep(int(min(hold, CAP_S) * _spin_rate()))
        start.record()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        enqueued = time.perf_counter() - t0
        end.record()
        held = not start.query()  # the GPU was still in the hold when the host was done
        end.synchronize()
        per_call = start.elapsed_time(end) / 1e3 / reps
        if held or hold >= CAP_S:
            break
        hold = SLACK * enqueued + FLOOR_S
    return per_call

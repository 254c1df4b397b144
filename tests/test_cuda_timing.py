"""A site's candidates on CUDA are timed by their GPU work, their launches enqueued ahead
(runtime_abi/cuda_timing.py): a call that takes longer to launch than to run is not charged
its launch, which CUDA graphs remove and a host running ahead hides."""

from __future__ import annotations

import time

import pytest
import torch
from pdlkit.runtime_abi import autotune, cuda_timing

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _spin(us: float) -> None:
    torch.cuda._sleep(int(us * 1e-6 * cuda_timing._spin_rate()))


def _call(host_us: float, gpu_us: float):
    def call():
        time.sleep(host_us * 1e-6)  # a slow launch
        _spin(gpu_us)

    return call


def test_a_slow_launch_is_not_charged_to_a_short_kernel():
    t = cuda_timing.gpu_seconds(_call(300, 20), reps=20)
    assert t < 100e-6, t  # the GPU's 20 us, not the host's 300


def test_gpu_work_longer_than_its_launch_is_timed_whole():
    t = cuda_timing.gpu_seconds(_call(10, 200), reps=10)
    assert 150e-6 < t < 300e-6, t


def test_the_faster_kernel_wins_though_its_launch_is_slower():
    """What the measured choice saw at Llama-3's 64-row down projection: a 21 us kernel with
    a slow launch against a 32 us one with a fast launch."""
    runs = [("slow_launch", _call(120, 21)), ("fast_launch", _call(5, 32))]
    timings = autotune.measure(runs, "cuda", 5.0)
    by = {t.name: t.us for t in timings}
    assert by["slow_launch"] is not None and by["fast_launch"] is not None
    assert by["slow_launch"] < by["fast_launch"], by


def test_a_whole_graph_is_timed_with_its_launches():
    """The whole-graph check times calls as the host issues them: a graph whose launches take
    longer than its GPU work is that slow without CUDA graphs."""
    (t,) = autotune.measure([("graph", _call(300, 20))], "cuda", 5.0, gpu_time=False)
    assert t.us is not None and t.us > 250, t

"""The subject of the autotune tests (test_autotune.py, test_autotune_graph.py,
test_autotune_subgraph.py; the ``folders`` fixture in conftest.py writes its pattern and kernels).

A matmul chain ``(a @ b) @ c`` with a thin ``a @ b``: the subgraph costs O(n^3) however it is
compiled, ``fast_chain`` computes ``a @ (b @ c)`` in O(n^2), and ``slow_chain`` sleeps 20 ms
first, which is slower than the subgraph on any host.
"""

from __future__ import annotations

import torch

import pdlkit

N = 384


# The pass spells ``x @ w`` with ``w`` a graph input as ``linear(x, t(w), None)``.
CHAIN_PATTERN = """
pdl.pattern @chain : benefit(1) {
  %a = pdl.operand
  %wb = pdl.operand
  %wc = pdl.operand
  %nb = pdl.operand
  %nc = pdl.operand
  %t = pdl.type
  %t2 = pdl.type
  %m1 = pdl.operation "torch.aten.linear"(%a, %wb, %nb : !pdl.value, !pdl.value, !pdl.value) -> (%t : !pdl.type)
  %y = pdl.result 0 of %m1
  %m2 = pdl.operation "torch.aten.linear"(%y, %wc, %nc : !pdl.value, !pdl.value, !pdl.value) -> (%t2 : !pdl.type)
  pdl.rewrite %m2 {
    %op = pdl.attribute = "chain"
    pdl.apply_native_rewrite "pdlkit_call"(%op, %a, %wb, %wc, %m2 : !pdl.attribute, !pdl.value, !pdl.value, !pdl.value, !pdl.operation)
  }
}
"""


HEADER = """
import time
import torch
from torch import Tensor
import pdlkit

def meta(a, wb, wc):
    return a.new_empty((a.shape[0], wc.shape[0]))
"""


FAST = """
@pdlkit.kernel(op="chain", meta=meta, priority=1)
def fast_chain(a: Tensor, wb: Tensor, wc: Tensor) -> Tensor:
    return a @ (wb.t() @ wc.t())
"""


SLOW = """
@pdlkit.kernel(op="chain", meta=meta, priority=10)
def slow_chain(a: Tensor, wb: Tensor, wc: Tensor) -> Tensor:
    time.sleep(0.02)
    return (a @ wb.t()) @ wc.t()
"""


class Chain(torch.nn.Module):
    def forward(self, a, b, c):
        return (a @ b) @ c


def inputs():
    g = torch.Generator().manual_seed(0)
    return (torch.randn(N, 1, generator=g), torch.randn(1, N, generator=g),
            torch.randn(N, N, generator=g))  # fmt: skip


def run(p, k, mode, **kw):
    pdlkit.stats(reset=True)
    torch._dynamo.reset()
    a, b, c = inputs()
    with torch.no_grad():
        y = pdlkit.optimize(Chain(), patterns=p, kernels=k, autotune=mode, **kw)(a, b, c)
    torch.testing.assert_close(y, Chain()(a, b, c), rtol=1e-4, atol=1e-3)
    return pdlkit.stats()


def calls(st, kernel):
    return st["by_kernel"].get(kernel, {}).get("kernel_calls", 0)


# -- whole graphs for graph_guard.choose (test_autotune_graph*.py) --


class Clock:
    """The check's clock in a test (:func:`install_clock`): it reads the seconds the timed calls
    say they take. A graph that sleeps reads longer and unsteady on a loaded host, which
    changes the check's path: ``sleep(0.001)`` read as 1.4 ms makes a graph's 1.6 ms of
    library calls under CONFIDENT over it, and 1.5 ms saved no longer "as large as the graph"."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    monotonic = perf_counter

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def install_clock(monkeypatch) -> Clock:
    """A :class:`Clock` that the whole-graph check (graph_guard) and the timing it calls
    (autotune) read in place of the host's."""
    from pdlkit.matcher import graph_guard
    from pdlkit.runtime_abi import autotune

    clock = Clock()
    for module in (autotune, graph_guard):
        monkeypatch.setattr(module, "time", clock)
    return clock


def graph_maker(compiled: list, name: str, seconds: float, clock: Clock | None = None):
    """A whole graph's compile for graph_guard.choose: it notes ``name`` in ``compiled`` and
    gives code that takes ``seconds`` per call (on ``clock``, where given; else it sleeps)."""
    import time

    wait = clock.sleep if clock is not None else time.sleep

    def make():
        compiled.append(name)
        return lambda *a: wait(seconds)

    return make


def recorded_measures(monkeypatch):
    """graph_guard._measure, recording each call's timings as it returned them (a copy of
    the list: graph_guard.choose adds its failed and skipped graphs to it)."""
    from pdlkit.matcher import graph_guard

    calls = []
    real = graph_guard._measure

    def recorded(runs, device, *settled):
        timings = real(runs, device, *settled)
        calls.append(list(timings))
        return timings

    monkeypatch.setattr(graph_guard, "_measure", recorded)
    return calls


def paired(ours_ms: list[float], theirs_ms: list[float]) -> list:
    """A measurement of the substituted graph and Inductor's, round by round (ms per round)."""
    return [_timing("substituted", ours_ms), _timing("inductor", theirs_ms)]


def alone(ms: list[float]) -> list:
    """A measurement of the substituted graph alone (graph_guard._confident's rounds)."""
    return [_timing("substituted", ms)]


def _timing(name: str, ms: list[float]):
    import statistics

    from pdlkit.runtime_abi.autotune import Timing

    return Timing(name, statistics.median(ms) * 1e3, rounds=[v / 1e3 for v in ms])

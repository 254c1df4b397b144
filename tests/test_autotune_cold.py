"""A site is timed with its weights where the rest of the model leaves them (matcher/cold.py):
each timed call takes the next of several copies of the site's weights, as many as the model's
weights call for; packing a copy is never timed; small weights are not copied; and a decision
taken for a model whose weights stay in the caches is not reused for one whose do not.

The subject is autotune_chain.py's matmul chain, here with a large extra input standing for
the rest of a model's weights.
"""

from __future__ import annotations

import autotune_chain as ac
import torch
from autotune_chain import FAST, Clock, inputs, install_clock, run
from pdlkit.matcher import cold, lowered
from pdlkit.runtime_abi import autotune

import pdlkit

# records the weight each call of the kernel reads: (address, an element), cheaply enough
# that the kernel still beats the subgraph
RECORDING = """
import autotune_chain as ac

@pdlkit.kernel(op="chain", meta=meta, priority=1)
def seen_chain(a: Tensor, wb: Tensor, wc: Tensor) -> Tensor:
    ac.SEEN.append((wc.data_ptr(), float(wc[0, 0])))
    return a @ (wb.t() @ wc.t())
"""


class ChainInAModel(torch.nn.Module):
    """The chain beside 4 MiB of other weights (``rest``), as a layer of a larger model."""

    def forward(self, a, b, c, rest):
        return (a @ b) @ c + rest.sum()


def _with_rest(p, k, mode="full"):
    a, b, c = inputs()
    rest = torch.ones(1 << 20)
    torch._dynamo.reset()
    pdlkit.stats(reset=True)
    with torch.no_grad():
        y = pdlkit.optimize(ChainInAModel(), patterns=p, kernels=k, autotune=mode)(a, b, c, rest)
    torch.testing.assert_close(y, ChainInAModel()(a, b, c, rest), rtol=1e-4, atol=1e-2)
    return pdlkit.stats()


def test_copies_cover_the_models_weights_up_to_the_caps():
    mib = 1 << 20
    assert cold.copies(mib, mib // 2) == 1  # the model's weights are the site's own
    assert cold.copies(mib, 10 * mib) == 10
    assert cold.copies(mib // 64, 1 << 40) == cold.MAX_COPIES  # small weights: by count
    assert cold.copies(4 * mib, 1 << 40) == cold.CAP_BYTES // (4 * mib)  # large: by bytes
    assert cold.copies(cold.CAP_BYTES, 1 << 40) == 1


def test_model_bytes_counts_each_storage_once():
    w = torch.randn(256, 256)
    assert cold.model_bytes([w, w.t(), w[:10], torch.randn(4)]) == w.nbytes + 16


def test_a_site_in_a_larger_model_is_timed_on_copies_of_its_weight(folders, monkeypatch):
    monkeypatch.setattr(ac, "SEEN", [], raising=False)
    p, k = folders(RECORDING)
    _with_rest(p, k)
    a, b, c = inputs()
    site = c.nbytes
    model = a.nbytes + b.nbytes + c.nbytes + (4 << 20)
    addresses = {ptr for ptr, _ in ac.SEEN}
    assert len(addresses) == cold.copies(site, model) > 1
    assert {v for _, v in ac.SEEN} == {float(c[0, 0])}  # the same values


def test_small_weights_are_not_copied(folders, monkeypatch):
    monkeypatch.setattr(ac, "SEEN", [], raising=False)
    monkeypatch.setattr(ac, "N", 64)  # a 16 KiB weight: below cold.MIN_BYTES
    p, k = folders(RECORDING)
    run(p, k, "full")
    assert len({ptr for ptr, _ in ac.SEEN}) == 1


def test_the_subgraph_is_timed_on_the_same_copies(folders, monkeypatch):
    seen = []
    original = lowered.bounds

    def recording(runs, budget, best_us=None):
        seen.append({r[2].data_ptr() for _, r in runs})  # the chain's c (under its t view)
        return original(runs, budget, best_us)

    monkeypatch.setattr(lowered, "bounds", recording)
    p, k = folders(FAST)
    _with_rest(p, k)
    a, b, c = inputs()
    model = a.nbytes + b.nbytes + c.nbytes + (4 << 20)
    assert len(seen) == 1 and len(seen[0]) == cold.copies(c.nbytes, model) > 1


def test_packing_each_copy_is_not_timed(monkeypatch):
    """A call slow the first time on each copy (as packing a weight is) measures fast."""
    clock = install_clock(monkeypatch)
    first = set()

    def call(i):
        if i not in first:
            first.add(i)
            clock.sleep(0.02)

    rotation = cold.Rotation([lambda i=i: call(i) for i in range(8)])
    (t,) = autotune.measure([("kernel", rotation)], "cpu", budget=1.0)
    assert t.us is not None and t.us < 5_000 and t.note == ""


def test_a_decision_for_a_small_model_is_not_reused_for_a_large_one(folders):
    p, k = folders(FAST)
    assert run(p, k, "cached")["tuning_misses"] == 1
    assert run(p, k, "cached")["tuning_hits"] == 1
    assert _with_rest(p, k, "cached")["tuning_misses"] == 1  # more copies: measured again


def test_a_kernel_over_twice_as_slow_with_its_weights_cached_is_not_timed_on_copies(monkeypatch):
    """Its copies are never packed or run (that is most of a site's timing cost), and it is
    excluded with the reason; the fast one is timed on its copies."""
    clock = install_clock(monkeypatch)
    ran: list[tuple[str, int]] = []

    def call(name: str, i: int, seconds: float) -> None:
        ran.append((name, i))
        clock.sleep(seconds)

    fast = cold.Rotation([lambda i=i: call("fast", i, 0.001) for i in range(4)])
    slow = cold.Rotation([lambda i=i: call("slow", i, 0.005) for i in range(4)])
    t_fast, t_slow = autotune.measure([("fast", fast), ("slow", slow)], "cpu", budget=1.0)
    assert t_slow.us is None and t_slow.note.startswith(autotune.NOT_TIMED_COLD)
    assert {i for name, i in ran if name == "slow"} == {0}
    assert t_fast.us is not None and {i for name, i in ran if name == "fast"} == {0, 1, 2, 3}


def test_a_kernel_slow_for_its_first_few_calls_is_still_timed_on_copies(monkeypatch):
    """A kernel's first calls in a process can run several times slower than later ones (the
    dynamic AMX qlinear at GPT-2's first site: 3.8, 1.6, 1.6, 0.5 ms); three slow calls do not
    make it "over twice as slow" as one steady from the start."""
    clock = install_clock(monkeypatch)
    calls = {"warming": 0}

    def warming(i: int) -> None:
        calls["warming"] += 1
        clock.sleep(0.006 if calls["warming"] <= 3 else 0.001)

    warm = cold.Rotation([lambda i=i: warming(i) for i in range(4)])
    steady = cold.Rotation([lambda: clock.sleep(0.001) for _ in range(4)])
    t_warm, t_steady = autotune.measure([("warm", warm), ("steady", steady)], "cpu", budget=1.0)
    assert t_warm.us is not None and t_warm.note == ""
    assert t_steady.us is not None


def test_a_kernel_slow_for_its_first_milliseconds_of_work_is_still_timed_on_copies(monkeypatch):
    """A kernel can run several times slower for its first few milliseconds of work, however
    many calls those take (the dynamic AMX qlinear at bert-mini's first site: 2.6, then 1.35,
    1.23, 1.39, 1.31, 1.29, 0.47 ms): five slow calls after the first do not exclude it as
    "over twice as slow" as one steady from the start, and it measures the faster."""
    clock = install_clock(monkeypatch)
    ran = {"s": 0.0}

    def warming(i: int) -> None:
        d = 0.003 if ran["s"] < 0.014 else 0.0003  # 3 ms calls for its first 14 ms of work
        ran["s"] += d
        clock.sleep(d)

    warm = cold.Rotation([lambda i=i: warming(i) for i in range(4)])
    steady = cold.Rotation([lambda: clock.sleep(0.0005) for _ in range(4)])
    t_warm, t_steady = autotune.measure([("warm", warm), ("steady", steady)], "cpu", budget=1.0)
    assert t_warm.note == "" and t_warm.us is not None and t_steady.us is not None
    assert t_warm.us < t_steady.us


def _sleeping(copies: int, seconds: float, clock: Clock) -> tuple[cold.Rotation, list[int]]:
    """A rotation over ``copies`` calls that take ``seconds`` on ``clock``, and the copies it
    ran, in order."""
    ran: list[int] = []

    def call(i: int) -> None:
        ran.append(i)
        clock.sleep(seconds)

    return cold.Rotation([lambda i=i: call(i) for i in range(copies)]), ran


def test_a_kernel_whose_copies_would_take_over_the_budget_is_stopped_on_its_first(monkeypatch):
    clock = install_clock(monkeypatch)
    slow, ran = _sleeping(64, 0.02, clock)  # 64 x 20 ms > 0.2 s
    (t,) = autotune.measure([("slow", slow)], "cpu", budget=0.2)
    assert t.note == "stopped: over the budget" and t.us is not None and t.us >= 20_000
    assert set(ran) == {0}


def test_a_rotation_whose_calls_fill_its_share_runs_one_warm_call_not_four(monkeypatch):
    """Calls of a third of the share (BF16 GEMMs without BF16 hardware run for seconds): the
    first call and one warm one decide, within the budget, where four warm calls would
    double it."""
    clock = install_clock(monkeypatch)
    slow, ran = _sleeping(4, 0.04, clock)  # 4 x 40 ms > 0.1 s
    (t,) = autotune.measure([("slow", slow)], "cpu", budget=0.1)
    assert t.note == "stopped: over the budget" and t.us is not None and t.us >= 40_000
    assert ran == [0, 0]


def test_a_bucket_chosen_at_run_time_is_timed_on_copies_of_the_weight_too(folders, monkeypatch):
    """Dynamic dims: a new bucket's timing at run time rotates through as many copies of the
    site's weight as the compile-time timing did (same values)."""
    monkeypatch.setattr(ac, "SEEN", [], raising=False)
    p, k = folders(RECORDING)
    _, b, c = inputs()
    rest = torch.ones(1 << 20)
    f = pdlkit.optimize(ChainInAModel(), patterns=p, kernels=k, autotune="full", dynamic=True)
    with torch.no_grad():
        f(torch.randn(64, 1), b, c, rest)  # 64 rows: the kernel clearly wins (see autotune_chain)
        compiled = len({ptr for ptr, _ in ac.SEEN})
        ac.SEEN.clear()
        a = torch.randn(300, 1)  # a new bucket: timed at this call
        torch.testing.assert_close(
            f(a, b, c, rest), ChainInAModel()(a, b, c, rest), rtol=1e-4, atol=1e-2
        )
    at_run_time = {ptr for ptr, _ in ac.SEEN}
    assert compiled > 1 and len(at_run_time) == compiled
    assert {v for _, v in ac.SEEN} == {float(c[0, 0])}


def test_a_rotation_whose_first_call_alone_is_slow_is_timed_on_its_copies(monkeypatch):
    """As for a candidate without copies (autotune._first_calls): a first call over the
    candidate's share (0.1 s here) but within the budget is a one-time cost; a warm call
    decides."""
    clock = install_clock(monkeypatch)
    ran: list[int] = []

    def call(i: int) -> None:
        ran.append(i)
        clock.sleep(0.15 if len(ran) == 1 else 0.0005)

    slow_start = cold.Rotation([lambda i=i: call(i) for i in range(4)])
    timed, _ = autotune.measure(
        [("slow start", slow_start), ("other", lambda: clock.sleep(0.0005))], "cpu", 0.2
    )
    assert timed.note == "" and timed.us is not None and timed.us < 20_000
    assert set(ran) == {0, 1, 2, 3}

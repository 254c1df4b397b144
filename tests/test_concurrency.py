"""Concurrency: one compiled model shared by threads; the caches and counters it uses."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from conftest import MLP, make_folders, sigmoid_kernel
from pdlkit.runtime_abi import binding, binding_stats
from pdlkit.runtime_abi.binding import bind
from pdlkit.runtime_abi.prepack import PrepackCache
from pdlkit.runtime_abi.registry import KernelRegistry

import pdlkit

THREADS = 8


@pytest.fixture(autouse=True)
def _one_thread_again():
    """Kernels running on several threads turn fallback compilation off for the process;
    later tests in this process start single-threaded again."""
    yield
    binding.forget_threads()


def _run_threads(fn, n: int = THREADS) -> list:
    start = threading.Barrier(n)

    def body(i: int):
        start.wait()
        return fn(i)

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(body, range(n)))


def test_eight_threads_match_single_threaded_results():
    torch.manual_seed(0)
    model = MLP(16, 64).eval()
    inputs = [torch.randn(8, 16) for _ in range(16)]
    with torch.no_grad():
        f = torch.compile(model, backend="pdlkit")
        want = [f(x) for x in inputs]  # single-threaded, same compiled model
        pdlkit.stats(reset=True)
        calls = 250  # per thread: 2,000 calls in all

        def work(t: int) -> int:
            bad = 0
            with torch.no_grad():  # grad mode is per thread
                for i in range(calls):
                    j = (t * 7 + i) % len(inputs)
                    bad += not torch.equal(f(inputs[j]), want[j])
            return bad

        assert _run_threads(work) == [0] * THREADS
    st = pdlkit.stats()
    assert st["kernel_calls"] == 2 * THREADS * calls  # counters lose no increment
    assert st["fallbacks"] == 0
    assert st["prepack_misses"] == 0  # weights were packed once, before the threads


def test_threads_starting_cold_agree():
    torch.manual_seed(0)
    model = MLP().eval()
    x = torch.randn(4, 16)
    compiles = []
    backend = pdlkit.PdlkitBackend(default_codegen="eager")

    def counting(gm, example_inputs):
        compiles.append(1)
        return backend(gm, example_inputs)

    f = torch.compile(model, backend=counting)

    def work(t: int) -> torch.Tensor:
        with torch.no_grad():
            return f(x)

    outs = _run_threads(work)
    with torch.no_grad():
        want = model(x)
    for o in outs:
        torch.testing.assert_close(o, want)
        assert torch.equal(o, outs[0])
    # Dynamo itself compiles once per thread that misses its cache before the first
    # compilation finishes (a plain counting backend shows the same); all must agree
    assert 1 <= len(compiles) <= THREADS


def test_prepack_cache_packs_each_weight_once_under_contention():
    cache = PrepackCache(max_bytes=1 << 30)
    weights = [torch.randn(32, 32) for _ in range(6)]
    packs: dict[tuple[str, int], int] = {}
    lock = threading.Lock()

    def pack(w, attrs):
        time.sleep(0.002)  # widen the window in which other threads miss too
        with lock:
            packs[(attrs["k"], id(w))] = packs.get((attrs["k"], id(w)), 0) + 1
        return w * 2

    pdlkit.stats(reset=True)

    def work(t: int) -> int:
        bad = 0
        for i in range(300):
            w = weights[(t + i) % len(weights)]
            kern = f"k{i % 2}"
            bad += not torch.equal(cache.get(kern, pack, w, {"k": kern}), w * 2)
        return bad

    assert _run_threads(work) == [0] * THREADS
    assert sorted(packs.values()) == [1] * 12  # 6 weights x 2 kernels, each packed once
    assert len(cache) == 12 and cache.nbytes == 12 * 32 * 32 * 4
    st = pdlkit.stats()
    assert (st["prepack_misses"], st["prepack_hits"]) == (12, THREADS * 300 - 12)


def test_bounded_prepack_cache_stays_consistent_under_eviction_races():
    size = 32 * 32 * 4
    cache = PrepackCache(max_bytes=3 * size)
    weights = [torch.randn(32, 32) for _ in range(8)]

    def work(t: int) -> int:
        bad = 0
        for i in range(200):
            w = weights[(t * 3 + i) % len(weights)]
            bad += not torch.equal(cache.get("k", lambda w, a: w + 1, w, {}), w + 1)
        return bad

    assert _run_threads(work) == [0] * THREADS
    assert len(cache) <= 3 and cache.nbytes == len(cache) * size


def test_registry_and_binding_from_many_threads_agree(tmp_path):
    _, k = make_folders(tmp_path, sigmoid_kernel("k_threads"))

    def work(t: int):
        decls, ops = [], []
        for _ in range(20):
            d = KernelRegistry.from_folders([k]).get("k_threads")
            decls.append(d)
            ops.append(bind(d))
        return decls, ops

    results = _run_threads(work)
    decls = {id(d) for ds, _ in results for d in ds}
    ops = {id(o) for _, os_ in results for o in os_}
    assert len(decls) == 1 and len(ops) == 1  # one load, one torch op


def test_counters_of_finished_threads_are_kept_and_folded():
    pdlkit.stats(reset=True)

    def one():
        for _ in range(10):
            binding_stats.count("kernel_calls", "k_fold")

    for _ in range(5):
        ts = [threading.Thread(target=one) for _ in range(20)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    binding_stats.count("kernel_calls", "k_fold")  # this thread's counter exists already
    threading.Thread(target=one).start()
    time.sleep(0.05)
    assert pdlkit.stats()["by_kernel"]["k_fold"]["kernel_calls"] == 5 * 20 * 10 + 1 + 10
    assert len(binding_stats._COUNTERS) <= 22  # finished threads were folded, not kept


def test_threads_falling_back_concurrently_get_the_replaced_subgraphs_numbers(tmp_path):
    declines = """
@pdlkit.kernel(op="lin_sigmoid", meta=meta)
def k_declines(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    raise pdlkit.KernelUnsupported("never")  # every call runs the replaced subgraph
"""
    p, k = make_folders(tmp_path, declines)
    torch.manual_seed(0)
    model = MLP().eval()
    inputs = [torch.randn(4, 16) for _ in range(4)]
    with torch.no_grad():
        want = [model(x) for x in inputs]
        f = pdlkit.optimize(model, patterns=p, kernels=k, default_codegen="eager")
        f(inputs[0])
    pdlkit.stats(reset=True)

    def work(t: int) -> int:
        bad = 0
        with torch.no_grad():
            for i in range(40):  # the fallback is compiled by Inductor while threads call it
                j = (t + i) % len(inputs)
                got = f(inputs[j])
                bad += not torch.allclose(got, want[j], rtol=1e-5, atol=1e-6)
        return bad

    assert _run_threads(work) == [0] * THREADS
    assert pdlkit.stats()["fallbacks"] == THREADS * 40
    assert binding.many_threads()  # so the fallbacks ran op by op, never compiled mid-run


def test_stats_counters_lose_nothing_while_read_concurrently():
    pdlkit.stats(reset=True)
    done = threading.Event()
    reads = []

    def reader():
        while not done.is_set():
            reads.append(pdlkit.stats()["kernel_calls"])

    r = threading.Thread(target=reader)
    r.start()

    def work(t: int) -> None:
        for _ in range(5000):
            binding_stats.count("kernel_calls", "k_hammer")

    _run_threads(work)
    done.set()
    r.join()
    assert pdlkit.stats()["by_kernel"]["k_hammer"]["kernel_calls"] == THREADS * 5000
    assert reads == sorted(reads)  # a reader never sees a count go backwards

"""The whole-graph verdict (matcher/graph_guard.py) against an interleaved measurement.

    python benchmarks/x86_whole_graph.py [--model bert-mini] [--dtype int8-static] [--rounds 21]
                                        [--threads 1] [--show-rounds]

In one process, on ``--threads`` threads (default 1), with a fresh decision cache: compiles
the model as PyTorch's path does (``peer``), with ``pdlkit.optimize(autotune="cached")`` and
with ``autotune="off"``; prints the verdict pdlkit cached for the whole graph (the timings of
the substituted graph, of the kernels-only graph and of Inductor's, taken while compiling),
then times the three compiled models in ``--rounds`` rounds of 3 calls each, round-robin, and
prints per configuration the median per call and the median and range of its per-round ratio
to the peer. The question it answers: does the verdict taken at compile time agree with what
the model then runs at?

``--show-rounds`` prints, for each whole-graph measurement the check takes while compiling,
every graph's samples in the order taken, with the same compiled graphs timed right before
and right after it (21 samples of an untimed and a timed call, as the check's are), and for
every sample the page faults, involuntary context switches and CPU time of all threads it cost,
and per graph the CPU time other processes on the host spent over its samples (/proc/stat):
whether a misreading is a transient of the first calls after compiling, or lasts as long as
the compile's context (x86_whole_graph_xeon16_bertmini_int8s_t16_84e1e96.md: at 16 threads
the check read the substituted graph at twice its steady time).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch


def _host_busy_s() -> float:
    """CPU seconds every process on the host has spent so far (user, nice, system, irq,
    softirq and steal: /proc/stat's first line at USER_HZ 100; 0 where it is missing)."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[:8])
    return (user + nice + system + irq + softirq + steal) / 100


def _usage() -> tuple[int, int, float, float]:
    """This process's minor page faults, involuntary context switches and CPU seconds (all
    threads, user and system) so far, and the host's busy CPU seconds (:func:`_host_busy_s`)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_minflt, r.ru_nivcsw, r.ru_utime + r.ru_stime, _host_busy_s()


def show_rounds() -> None:
    """Wrap the check's measurement (graph_guard._measure) to print what --show-rounds says:
    each graph timed as the check's samples are right before the check and right after it,
    the check's own samples in order, and per sample (an untimed and a timed call) the page
    faults, involuntary context switches and CPU time of all threads it cost."""
    from pdlkit.matcher import graph_guard
    from pdlkit.runtime_abi import autotune

    measure, sample = graph_guard._measure, autotune._sample
    costs: dict[Any, list[tuple[int, int, float, float]]] = {}  # per graph's call

    def counted(fn: Any, *args: Any, **kwargs: Any) -> float:
        before = _usage()
        seconds = sample(fn, *args, **kwargs)
        faults, switches, cpu, host = (b - a for a, b in zip(before, _usage(), strict=True))
        costs.setdefault(fn, []).append((int(faults), int(switches), cpu, host - cpu))
        return seconds

    def print_samples(label: str, run: Any, values: list[float]) -> None:
        mine = costs[run][-len(values) :]
        others = sum(o for *_, o in mine)  # the host's busy CPU time outside this process
        print(
            f"{label}: median {statistics.median(values) * 1e6:.0f} us; other processes' CPU "
            f"{others * 1e3:.0f} ms over {sum(values) * 2e3:.0f} ms of samples; us / faults / "
            "involuntary switches / CPU ms a sample, in order: "
            + " ".join(
                f"{v * 1e6:.0f}/{f}/{c}/{t * 1e3:.1f}"
                for v, (f, c, t, _) in zip(values, mine, strict=True)
            )
        )

    def again(runs: list[tuple[str, Any]], device: str, label: str) -> None:
        for name, run in runs:  # an untimed and a timed call each, as the check's samples
            values = [autotune._sample(run, device, 1, lead=1, gpu_time=False) for _ in range(21)]
            print_samples(f"{label}, {name}", run, values)

    def shown(runs: list[tuple[str, Any]], device: str, *settled: Any) -> list[Any]:
        again(runs, device, "right before the check")
        timings = measure(runs, device, *settled)
        for t in timings:
            print_samples(f"check, {t.name}", dict(runs)[t.name], t.rounds)
        again(runs, device, "right after the check")
        return timings

    autotune._sample = counted
    graph_guard._measure = shown


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="bert-mini")
    ap.add_argument("--dtype", default="int8-static")
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    ap.add_argument("--show-rounds", action="store_true", help="the check's samples (docstring)")
    a = ap.parse_args()
    if a.show_rounds:
        show_rounds()
    folder = Path(tempfile.mkdtemp())
    os.environ["PDLKIT_CACHE_DIR"] = str(folder)
    import torch._inductor.config as ic
    import x86_models as xm
    from machine import host_header

    import pdlkit

    torch.set_num_threads(a.threads)
    print("\n".join(host_header(a.threads)))
    model, x = xm.prepare(*xm.build(a.model), a.dtype)
    ic.freezing = a.dtype.startswith("int8")
    fns: dict[str, Any] = {}
    with torch.no_grad():
        for conf in ("peer", "pdlkit", "pdlkit-off"):
            torch._dynamo.reset()
            pdlkit.stats(reset=True)
            t0 = time.perf_counter()
            f = xm.maker(conf, model)()
            f(x)
            subs = pdlkit.stats()["substitutions"] if conf != "peer" else 0
            print(f"{conf}: compile {time.perf_counter() - t0:.1f} s, {subs} substitutions")
            fns[conf] = f
        print(xm.verdict_text(folder))
        # torch._dynamo.reset() before each compile dropped the compiled code of the ones
        # before it: they compile again on their next call (from the caches, or measuring
        # again where a busy host left a verdict uncached), here and not in the rounds
        for f in fns.values():
            f(x)
        ms: dict[str, list[float]] = {c: [] for c in fns}
        for _ in range(a.rounds):
            for c, f in fns.items():
                t0 = time.perf_counter()
                for _ in range(3):
                    f(x)
                ms[c].append((time.perf_counter() - t0) / 3 * 1e3)
    for c, ts in ms.items():
        r = sorted(t / p for t, p in zip(ts, ms["peer"], strict=True))
        print(
            f"{c}: {statistics.median(ts):.2f} ms a call; per round / peer: median "
            f"{statistics.median(r):.3f} ({r[0]:.3f}-{r[-1]:.3f})"
        )


if __name__ == "__main__":
    main()

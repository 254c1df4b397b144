"""Throughput of one compiled model shared by 1, 2, 4 and 8 threads: pdlkit against Inductor.

    python benchmarks/stress_threads.py [--calls 2000] [--rounds 3]

Each thread calls the same compiled module (linear -> relu -> linear -> sigmoid, batch 16,
128 -> 512 -> 128; the pdlkit build substitutes both linears with pre-packed oneDNN
kernels) on its own inputs; every output is compared with the single-threaded result of
the same compiled module. Intra-op threads are 1, so the threads are the only parallelism.
Prints medians over interleaved rounds and writes benchmarks/results/stress_threads.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from machine import ROOT, host_header  # benchmarks/machine.py

import pdlkit

THREAD_COUNTS = (1, 2, 4, 8)


class Net(torch.nn.Module):
    """linear -> relu -> linear -> sigmoid (also benchmarks/reliability.py's model)."""

    def __init__(self, d: int = 128, h: int = 512):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(d, h), torch.nn.Linear(h, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.fc2(torch.relu(self.fc1(x))))


def _throughput(
    f: Any, inputs: list[torch.Tensor], want: list[torch.Tensor], threads: int, calls: int
) -> tuple[float, int]:
    """(calls per second over all threads, outputs that differ from single-threaded ones)."""
    per_thread = calls // threads
    start = threading.Barrier(threads + 1)

    def work(t: int) -> int:
        bad = 0
        with torch.no_grad():
            start.wait()
            for i in range(per_thread):
                j = (t * 5 + i) % len(inputs)
                bad += not torch.equal(f(inputs[j]), want[j])
        return bad

    with ThreadPoolExecutor(threads) as pool:
        futures = [pool.submit(work, t) for t in range(threads)]
        start.wait()
        t0 = time.perf_counter()
        bad = sum(fu.result() for fu in futures)
        elapsed = time.perf_counter() - t0
    return per_thread * threads / elapsed, bad


def measure(
    calls: int = 2000, rounds: int = 3, threads: tuple[int, ...] = THREAD_COUNTS
) -> list[dict[str, Any]]:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = Net().eval()
    inputs = [torch.randn(16, 128) for _ in range(8)]
    compiled = {
        "pdlkit": torch.compile(model, backend="pdlkit"),
        "inductor": torch.compile(model, backend="inductor"),
    }
    pdlkit.stats(reset=True)
    want = {}
    with torch.no_grad():
        for name, f in compiled.items():
            want[name] = [f(x) for x in inputs]  # compiles, packs weights
            for _ in range(200):
                f(inputs[0])
    subs = pdlkit.stats()["substitutions"]
    runs: dict[tuple[str, int], list[float]] = {}
    bad: dict[tuple[str, int], int] = {}
    for _ in range(rounds):
        for n in threads:
            for name, f in compiled.items():  # interleaved: both see the same machine load
                tput, mismatches = _throughput(f, inputs, want[name], n, calls)
                runs.setdefault((name, n), []).append(tput)
                bad[(name, n)] = bad.get((name, n), 0) + mismatches
    rows = []
    for n in threads:
        p, i = statistics.median(runs[("pdlkit", n)]), statistics.median(runs[("inductor", n)])
        rows.append(
            {
                "threads": n,
                "pdlkit": p,
                "inductor": i,
                "ratio": p / i,
                "mismatches": bad[("pdlkit", n)] + bad[("inductor", n)],
                "calls": calls * rounds,
                "substitutions": subs,
            }
        )
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| threads | pdlkit calls/s | Inductor calls/s | pdlkit / Inductor | outputs differing from 1 thread |",
        "|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['threads']} | {r['pdlkit']:,.0f} | {r['inductor']:,.0f} | {r['ratio']:.2f} | {r['mismatches']} of {2 * r['calls']:,} |"
        )
    return "\n".join(lines)


def header(threads: int | None = 1) -> str:
    """The CPUs and threads, then machine.host_header's bullets (date, CPU model, AMX, GPU name,
    versions, commit); ``threads``: the intra-op threads the script runs with, where one."""
    return f"{os.cpu_count()} CPUs visible (shared), intra-op threads 1.\n" + "\n".join(
        host_header(threads)
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000, help="calls per configuration and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks" / "results" / "stress_threads.md"
    )
    args = ap.parse_args()
    torch.set_num_threads(1)  # as measure() does, so that the header says so
    head = header()
    print(head, flush=True)
    rows = measure(args.calls, args.rounds)
    text = "\n".join(
        [
            "# One compiled model, many threads",
            "",
            f"Generated by `python benchmarks/stress_threads.py --calls {args.calls} --rounds {args.rounds}`: "
            + head,
            "",
            f"Model: linear(128->512) -> relu -> linear(512->128) -> sigmoid, batch 16; pdlkit substituted "
            f"{rows[0]['substitutions']} kernels. Medians over {args.rounds} interleaved rounds of "
            f"{args.calls} calls per configuration.",
            "",
            table(rows),
            "",
        ]
    )
    print(text)
    args.out.write_text(text)
    return 1 if any(r["mismatches"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())

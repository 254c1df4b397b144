"""Reliability figures: recompilations, threads, fuzzing, memory and training, in one report.

    python benchmarks/reliability.py [--fuzz-budget 60] [--calls 800]

* recompilations over 20 batch sizes (automatic dynamic shapes, and mark_dynamic): pdlkit
  against plain Inductor on the same model, counted by a backend wrapper;
* throughput of one compiled model shared by 1/2/4/8 threads (benchmarks/stress_threads.py);
* fuzz examples run per property (benchmarks/fuzz.py, tests/fuzzing.py);
* resident memory (/proc/self/statm) over 10,000 calls with pre-packed weights;
* losses of a few training steps with pdlkit against eager.

Writes benchmarks/results/reliability.md.
"""

from __future__ import annotations

import argparse
import copy
import gc
import os
import sys
from pathlib import Path
from typing import Any

import torch
from machine import ROOT  # benchmarks/machine.py
from stress_threads import Net, header, measure, table

import pdlkit


class Counting:
    def __init__(self, backend: Any):
        self.backend, self.compiles = backend, 0

    def __call__(self, gm: Any, example_inputs: Any) -> Any:
        self.compiles += 1
        return self.backend(gm, example_inputs)


def recompilations() -> list[dict[str, Any]]:
    from torch._inductor.compile_fx import compile_fx

    torch.manual_seed(0)
    model = Net(64, 256).eval()
    rows = []
    for mode in ("automatic dynamic shapes", "mark_dynamic(x, 0)"):
        row: dict[str, Any] = {"mode": mode}
        for name, inner in (("inductor", compile_fx), ("pdlkit", pdlkit.PdlkitBackend())):
            torch._dynamo.reset()
            pdlkit.stats(reset=True)
            backend = Counting(inner)
            f = torch.compile(model, backend=backend)
            worst = 0.0
            with torch.no_grad():
                for b in range(1, 21):
                    x = torch.randn(b, 64)
                    if mode.startswith("mark"):
                        torch._dynamo.mark_dynamic(x, 0)
                    worst = max(worst, (f(x) - model(x)).abs().max().item())
            row[name] = backend.compiles
            row[f"{name}_err"] = worst
            if name == "pdlkit":
                row["kernel_calls"] = pdlkit.stats()["kernel_calls"]
        rows.append(row)
    return rows


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def memory(calls: int = 10_000) -> dict[str, Any]:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = Net(64, 256).eval()
    x = torch.randn(8, 64)
    torch._dynamo.reset()
    with torch.no_grad():
        f = torch.compile(model, backend="pdlkit")
        for _ in range(1000):
            f(x)
        pdlkit.stats(reset=True)
        gc.collect()
        before = rss_bytes()
        marks = []
        for i in range(calls):
            f(x)
            if (i + 1) % (calls // 4) == 0:
                marks.append(rss_bytes())
        gc.collect()
        after = rss_bytes()
    st = pdlkit.stats()
    return {
        "calls": calls,
        "before": before,
        "after": after,
        "marks": marks,
        "kernel_calls": st["kernel_calls"],
        "prepack": (st["prepack_misses"], st["prepack_hits"]),
    }


def training(steps: int = 5) -> dict[str, Any]:
    torch.manual_seed(0)
    eager = Net(64, 256)
    mine = copy.deepcopy(eager)
    x, target = torch.randn(32, 64), torch.randn(32, 64)

    def train(model: torch.nn.Module, fn: Any) -> list[float]:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        out = []
        for _ in range(steps):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(fn(x), target)
            loss.backward()
            opt.step()
            out.append(loss.item())
        return out

    torch._dynamo.reset()
    pdlkit.stats(reset=True)
    want = train(eager, eager)
    got = train(mine, torch.compile(mine, backend="pdlkit"))
    return {
        "eager": want,
        "pdlkit": got,
        "diff": max(abs(a - b) for a, b in zip(want, got, strict=True)),
        "substitutions": pdlkit.stats()["substitutions"],
    }


def _parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fuzz-budget", type=float, default=60, help="seconds of fuzzing")
    ap.add_argument("--calls", type=int, default=800, help="calls per thread configuration")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "reliability.md")
    return ap.parse_args()


def main() -> int:
    args = _parse_args()

    n_threads = torch.get_num_threads()
    head = header(threads=None)  # the sections run with different thread counts
    print(head, flush=True)
    rec = recompilations()
    print("recompilations", rec, flush=True)
    train = training()
    print("training", train, flush=True)
    mem = memory()
    print("memory", mem, flush=True)
    threads = measure(calls=args.calls, rounds=2)
    print(table(threads), flush=True)
    torch.set_num_threads(n_threads)
    import fuzz  # benchmarks/fuzz.py

    cases, failures = fuzz.run(args.fuzz_budget)
    found = sum(len(v) for v in failures.values())

    text = "\n".join(
        [
            *_recompilation_lines(args, rec, head),
            *_thread_lines(args, threads),
            *_fuzz_lines(args, cases, found),
            *_memory_training_lines(mem, train),
        ]
    )
    print(text)
    args.out.write_text(text)
    return 1 if found or any(r["mismatches"] for r in threads) else 0


def _recompilation_lines(
    args: argparse.Namespace, rec: list[dict[str, Any]], head: str
) -> list[str]:
    lines = [
        "# Reliability",
        "",
        f"Generated by `python benchmarks/reliability.py --fuzz-budget {args.fuzz_budget:.0f} "
        f"--calls {args.calls}`: " + head,
        "",
        "## Recompilations over 20 batch sizes (1..20)",
        "",
        "Model: linear(64->256) -> relu -> linear(256->64) -> sigmoid; compilations counted by a "
        "backend wrapper around pdlkit and around Inductor's compile_fx.",
        "",
        "| dynamic shapes | Inductor compilations | pdlkit compilations | pdlkit kernel calls | max abs error vs eager (Inductor / pdlkit) |",
        "|---|---:|---:|---:|---|",
    ]
    for r in rec:
        lines.append(
            f"| {r['mode']} | {r['inductor']} | {r['pdlkit']} | {r['kernel_calls']} of 40 | "
            f"{r['inductor_err']:.1e} / {r['pdlkit_err']:.1e} |"
        )
    return lines


def _thread_lines(args: argparse.Namespace, threads: Any) -> list[str]:
    return [
        "",
        "## Threads: one compiled model shared by N threads",
        "",
        "linear(128->512) -> relu -> linear(512->128) -> sigmoid, batch 16, intra-op threads 1; "
        f"medians of 2 interleaved rounds of {args.calls} calls (benchmarks/stress_threads.py). "
        "Every output is compared with the same compiled model's single-threaded output.",
        "",
        table(threads),
        "",
        "What this shows is that results stay identical and nothing fails under 8 threads; "
        "throughput cannot scale on 2 CPUs shared with other jobs. pdlkit / Inductor below 1 "
        "is the shipped oneDNN linear kernels plus per-call dispatch against Inductor's own "
        "code at this small shape (see dispatch_overhead.md), not a threading cost: the ratio "
        "is below 1 with one thread too.",
    ]


def _fuzz_lines(args: argparse.Namespace, cases: dict[str, int], found: int) -> list[str]:
    lines = [
        "",
        "## Fuzzing",
        "",
        f"{sum(v for k, v in cases.items() if ':' not in k)} examples in {args.fuzz_budget:.0f} s "
        f"(random, benchmarks/fuzz.py); falsifying examples found: {found}.",
        "",
        "| property / outcome | examples |",
        "|---|---:|",
    ]
    lines += [f"| {k} | {v} |" for k, v in sorted(cases.items())]
    return lines


def _memory_training_lines(mem: dict[str, Any], train: dict[str, Any]) -> list[str]:
    mib = 2**20
    growth = mem["after"] - mem["before"]
    return [
        "",
        "## Resident memory over 10,000 calls (pre-packed weights)",
        "",
        f"linear(64->256) -> relu -> linear(256->64) -> sigmoid, batch 8, after 1,000 warm-up calls: "
        f"RSS {mem['before'] / mib:.1f} MiB before, {mem['after'] / mib:.1f} MiB after "
        f"{mem['calls']:,} calls: **{growth / mib:+.2f} MiB** ({growth / mem['calls']:+.1f} bytes per call); "
        f"at each quarter: {', '.join(f'{m / mib:.1f}' for m in mem['marks'])} MiB. "
        f"{mem['kernel_calls']:,} kernel calls; pre-pack misses / hits: "
        f"{mem['prepack'][0]} / {mem['prepack'][1]:,}.",
        "",
        "## Training (5 SGD steps, linear+relu and linear substituted with their backward)",
        "",
        f"pdlkit substituted {train['substitutions']} kernels; losses eager "
        f"{', '.join(f'{v:.6f}' for v in train['eager'])}; pdlkit "
        f"{', '.join(f'{v:.6f}' for v in train['pdlkit'])}; largest difference {train['diff']:.1e}.",
        "",
    ]


if __name__ == "__main__":
    sys.exit(main())

"""After a compile, does a graph of pdlkit's kernels speed up on its own? (issue 21: the
whole-graph check read bert-mini BF16's AMX graph at 1.0-1.4x Inductor's during the compile on
the 16-core Xeon, and 0.6-0.7x a second later)

    python benchmarks/x86_settling.py [--threads 16] [--seconds 20] [--dtype bf16]

Compiles bert-mini with static priority (``autotune="off"``: a kernel at every site) and with
Inductor alone, then times the two alternately, three calls each, every quarter second for
``--seconds``, printing the medians over time; with the host's NUMA nodes, transparent huge
page mode and NUMA balancing setting first, after the host (CPU model, AMX, GPU: machine.py).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _x86_models_build import build, prepare  # noqa: E402
from machine import host_header  # noqa: E402


def facts() -> dict[str, str]:
    out = {}
    for name, path in [("thp", "/sys/kernel/mm/transparent_hugepage/enabled"),
                       ("thp defrag", "/sys/kernel/mm/transparent_hugepage/defrag"),
                       ("numa balancing", "/proc/sys/kernel/numa_balancing")]:  # fmt: skip
        try:
            out[name] = Path(path).read_text().strip()
        except OSError as e:
            out[name] = f"unreadable ({e.strerror})"
    nodes = sorted(Path("/sys/devices/system/node").glob("node[0-9]*"))
    out["numa nodes"] = str(len(nodes))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--dtype", default="bf16")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print("\n".join(host_header(a.threads)), facts(), sep="\n", flush=True)
    import pdlkit

    model, x = prepare(*build("bert-mini"), a.dtype)
    with torch.no_grad():
        t0 = time.perf_counter()
        kern = pdlkit.optimize(model, autotune="off")
        kern(x)
        ind = torch.compile(model)
        ind(x)
        print(f"compiled in {time.perf_counter() - t0:.1f} s", flush=True)
        start = time.perf_counter()
        while time.perf_counter() - start < a.seconds:
            row = []
            for f in (kern, ind):
                ts = []
                for _ in range(3):
                    s = time.perf_counter()
                    f(x)
                    ts.append(time.perf_counter() - s)
                row.append(statistics.median(ts) * 1e3)
            print(f"{time.perf_counter() - start:6.2f} s: kernels {row[0]:.2f} ms, "
                  f"inductor {row[1]:.2f} ms, ratio {row[0] / row[1]:.2f}", flush=True)  # fmt: skip
            time.sleep(0.25)


if __name__ == "__main__":
    main()

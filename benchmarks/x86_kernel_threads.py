"""Per-op time of one model compiled with pdlkit's static priority, by thread count: which
kernel a thread count makes slow (torch.profiler's self CPU time per op, per call of the model).

    python benchmarks/x86_kernel_threads.py --model bert-mini --dtype int8-static --threads 4 16

Each thread count compiles the model again (``autotune="off"``: every kernel static priority
picks runs, whether or not it wins on this host) and times ``--calls`` calls after a warm-up;
then the ops that took the most time per call are listed, with the model's median per call.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from typing import Any

import torch
import x86_models as xm  # benchmarks/x86_models.py
from machine import host_header  # benchmarks/machine.py


def profile(model: Any, x: torch.Tensor, calls: int, top: int) -> list[str]:
    """The model's median ms per call over ``calls``, and its ``top`` ops by self CPU time."""
    fn = xm.maker("pdlkit-off", model)()  # x86_models.py's static-priority configuration
    with torch.no_grad():
        for _ in range(3):
            fn(x)
        times = []
        for _ in range(calls):
            t = time.perf_counter()
            fn(x)
            times.append(time.perf_counter() - t)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(calls):
                fn(x)
    lines = [f"model: {statistics.median(times) * 1e3:.2f} ms per call (median of {calls})"]
    ops = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    for e in ops[:top]:
        per_call = e.self_cpu_time_total / calls / 1e3
        lines.append(f"  {e.key}: {per_call:.3f} ms per model call, {e.count // calls} calls")
    return lines


def openmp_runtimes() -> list[str]:
    """The OpenMP runtimes mapped into this process (two would mean two thread pools)."""
    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f}
    names = ("libgomp", "libiomp", "libomp")
    return sorted(p for p in paths if p.rsplit("/", 1)[-1].startswith(names))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="bert-mini", choices=sorted(xm.MODELS))
    ap.add_argument("--dtype", default="int8-static", choices=sorted(xm.SCHEMES))
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--top", type=int, default=8)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    import torch._inductor.config as ic

    ic.freezing = args.dtype in xm.PT2E
    print("\n".join(host_header(threads=args.threads[0])))
    model, x = xm.prepare(*xm.build(args.model), args.dtype)
    for threads in args.threads:
        torch.set_num_threads(threads)
        torch._dynamo.reset()
        with xm.inductor_cache(tempfile.mkdtemp(prefix="inductor-")):
            print(f"\n{args.model} {args.dtype}, {threads} thread(s), autotune='off'")
            print("\n".join(profile(model, x, args.calls, args.top)), flush=True)
            print(f"  OpenMP runtimes loaded: {', '.join(openmp_runtimes()) or 'none'}")


if __name__ == "__main__":
    main()

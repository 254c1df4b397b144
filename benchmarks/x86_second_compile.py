"""A second compile with every cache warm: pdlkit against torch.compile, alternating, and a
cProfile of pdlkit's.

    python benchmarks/x86_second_compile.py gpt2 fp32 --repeats 4

The model and dtype are ``benchmarks/x86_models.py``'s. Each configuration first compiles
once (cold) in an Inductor cache folder of its own, with one pdlkit decision cache for the
run; then ``--repeats`` times, alternating: ``torch._dynamo.reset()``, Inductor's in-memory
caches cleared, compile and run once (the folders stay warm, as for a new process on the same
machine; pdlkit's in-process state stays). Printed: each time, the medians, and a cProfile
(cumulative, pdlkit's and Inductor's entry points) of one more pdlkit second compile. Python's
full garbage collections land on some compiles and not others: quote medians.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import tempfile
import time
import warnings

import torch
import x86_models as xm  # benchmarks/x86_models.py
from machine import host_header  # benchmarks/machine.py


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", choices=sorted(xm.MODELS))
    ap.add_argument("dtype", choices=sorted(xm.SCHEMES))
    ap.add_argument("--repeats", type=int, default=4)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    import torch._inductor.config as ic
    from torch._inductor.utils import clear_caches

    ic.freezing = args.dtype in xm.PT2E
    print("\n".join(host_header(threads=1)))
    model, x = xm.prepare(*xm.build(args.model), args.dtype)
    os.environ["PDLKIT_CACHE_DIR"] = tempfile.mkdtemp(prefix="decisions-")
    dirs = {c: tempfile.mkdtemp(prefix=f"inductor-{c}-") for c in ("peer", "pdlkit")}

    def once(conf: str, prof: cProfile.Profile | None = None) -> float:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = dirs[conf]
        torch._dynamo.reset()
        clear_caches()
        fn = xm.maker(conf, model)()
        t = time.perf_counter()
        if prof is not None:
            prof.enable()
        with torch.no_grad():
            fn(x)
        if prof is not None:
            prof.disable()
        return time.perf_counter() - t

    for c in dirs:
        print(f"{c}: first compile {once(c):.2f} s", flush=True)
    times: dict[str, list[float]] = {c: [] for c in dirs}
    for _ in range(args.repeats):
        for c in dirs:
            times[c].append(once(c))
    for c, ts in times.items():
        print(
            f"{c}: second compiles {[round(t, 3) for t in ts]}, median {statistics.median(ts):.3f} s"
        )
    ratio = statistics.median(times["pdlkit"]) / statistics.median(times["peer"])
    print(f"second compile, pdlkit / torch.compile (medians): {ratio:.2f}x")
    prof = cProfile.Profile()
    print(f"pdlkit second compile under cProfile: {once('pdlkit', prof):.3f} s")
    stats = pstats.Stats(prof).sort_stats("cumulative")
    stats.print_stats(r"(pdlkit|matcher|runtime_abi|compile_fx|output_graph)", 30)


if __name__ == "__main__":
    main()

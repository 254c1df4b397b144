"""First compiles, and second compiles with every cache warm: pdlkit against torch.compile,
alternating, and a cProfile of pdlkit's second compile.

    python benchmarks/x86_second_compile.py gpt2 fp32 --repeats 4 --first 3 [--new-process 3] [--threads 16]

The model and dtype are ``benchmarks/x86_models.py``'s. Each configuration first compiles
``--first`` times (cold, alternating, the order swapped each time), each time in a new Inductor
cache folder of its own and a new pdlkit decision cache; then, in the last of those folders,
``--repeats`` times, alternating: ``torch._dynamo.reset()``, Inductor's in-memory caches
cleared, compile and run once (the folders stay warm, as for a new process on the same
machine; pdlkit's in-process state stays); with ``--new-process N``, N more of each, each in a
process of its own over the same warm folders (nothing of the compiling process's state: what
a restarted server pays). Printed: each time, the medians, and a cProfile
(cumulative, pdlkit's and Inductor's entry points) of one more pdlkit second compile. A full
garbage collection runs untimed before each compile: without it one lands inside some compiles
and not others (BERT-base BF16, 1 thread, the 2-core Xeon: pdlkit 1.54-2.14 s, 1.31x the
peer's median; with it 1.48-1.53 s, 1.04x). The process is warmed first as in
``x86_models.py`` (``warm_process``), so that neither first compile pays its one-time costs;
``--cold-children`` leaves the new processes unwarmed, so that each pays what a restarted
server's first compile does (pdlkit's plan, Inductor's imports). Each time counts the wrapper's
creation too: ``pdlkit.optimize`` loads its plan there (before 2026-11-29 21:30 it was left out).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

import torch
import x86_models as xm  # benchmarks/x86_models.py
from machine import host_header  # benchmarks/machine.py


def compile_and_run(
    model: object,
    x: torch.Tensor,
    conf: str,
    dirs: dict[str, str],
    prof: cProfile.Profile | None = None,
) -> float:
    """Seconds to wrap (``pdlkit.optimize`` / ``torch.compile``), compile ``conf`` and run it
    once, in ``dirs[conf]``'s Inductor cache
    (``x86_models.inductor_cache``: in-memory caches cleared) and ``dirs['decisions']``' pdlkit
    decision cache, Dynamo reset first; a full garbage collection untimed before it."""
    os.environ["PDLKIT_CACHE_DIR"] = dirs["decisions"]
    torch._dynamo.reset()
    with xm.inductor_cache(dirs[conf]):
        gc.collect()
        t = time.perf_counter()  # pdlkit.optimize (its plan) counts: torch.compile's is ~0
        if prof is not None:
            prof.enable()
        fn = xm.maker(conf, model)()
        with torch.no_grad():
            fn(x)
        if prof is not None:
            prof.disable()
        return time.perf_counter() - t


def report(kind: str, times: dict[str, list[float]]) -> None:
    for c, ts in times.items():
        print(
            f"{c}: {kind} compiles {[round(t, 3) for t in ts]}, median {statistics.median(ts):.3f} s"
        )
    ratio = statistics.median(times["pdlkit"]) / statistics.median(times["peer"])
    print(f"{kind} compile, pdlkit / torch.compile (medians): {ratio:.2f}x", flush=True)


def in_new_process(args: argparse.Namespace, conf: str, dirs: dict[str, str]) -> float:
    """Seconds of one compile of ``conf`` in a new process of this script (``--child``), over
    ``dirs``' warm folders; the child warms itself first, untimed, as this process did, unless
    ``--cold-children``."""
    cmd = [sys.executable, __file__, args.model, args.dtype, "--threads", str(args.threads)]
    cmd += ["--cold-children"] if args.cold_children else []
    cmd += ["--child", conf, "--dirs"]
    done = subprocess.run([*cmd, json.dumps(dirs)], capture_output=True, text=True, check=True)
    return float(done.stdout.split("CHILD ")[-1].split()[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", choices=sorted(xm.MODELS))
    ap.add_argument("dtype", choices=sorted(xm.SCHEMES))
    ap.add_argument("--repeats", type=int, default=4, help="second compiles of each")
    ap.add_argument("--first", type=int, default=1, help="first compiles of each, fresh folders")
    ap.add_argument("--new-process", type=int, default=0, help="second compiles, a process each")
    ap.add_argument("--threads", type=int, default=1, help="torch's threads (the model's)")
    ap.add_argument(
        "--cold-children",
        action="store_true",
        help="new processes not warmed: one-time costs count",
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)  # in_new_process's: one compile, timed
    ap.add_argument("--dirs", help=argparse.SUPPRESS)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    import torch._inductor.config as ic

    ic.freezing = args.dtype in xm.PT2E
    if not args.child:
        print("\n".join(host_header(threads=args.threads)))
    cold = args.child and args.cold_children
    warm = "" if cold else xm.warm_process(tempfile.mkdtemp(prefix="warm-"))
    model, x = xm.prepare(*xm.build(args.model), args.dtype)
    if args.child:
        print(f"CHILD {compile_and_run(model, x, args.child, json.loads(args.dirs)):.4f}")
        return
    print(warm)
    confs = ("peer", "pdlkit")
    first: dict[str, list[float]] = {c: [] for c in confs}
    for i in range(args.first):  # alternating, the order swapped each time
        dirs = {c: tempfile.mkdtemp(prefix=f"inductor-{c}-") for c in confs}
        dirs["decisions"] = tempfile.mkdtemp(prefix="decisions-")
        for c in confs[:: 1 if i % 2 == 0 else -1]:
            first[c].append(compile_and_run(model, x, c, dirs))
    report("first", first)
    second: dict[str, list[float]] = {c: [] for c in confs}
    for _ in range(args.repeats):
        for c in confs:
            second[c].append(compile_and_run(model, x, c, dirs))
    report("second", second)
    if args.new_process:
        fresh: dict[str, list[float]] = {c: [] for c in confs}
        for i in range(args.new_process):  # alternating, the order swapped each time
            for c in confs[:: 1 if i % 2 == 0 else -1]:
                fresh[c].append(in_new_process(args, c, dirs))
        report("second (a new process each)", fresh)
    prof = cProfile.Profile()
    print(
        f"pdlkit second compile under cProfile: {compile_and_run(model, x, 'pdlkit', dirs, prof):.3f} s"
    )
    stats = pstats.Stats(prof).sort_stats("cumulative")
    stats.print_stats(r"(pdlkit|matcher|runtime_abi|compile_fx|output_graph)", 30)


if __name__ == "__main__":
    main()

"""One transformer model, three compiles side by side, and where each spends its time.

    python benchmarks/x86_profile.py bert-base int8-static --batch 8 --threads 1 --rounds 12
    python benchmarks/x86_profile.py bert-mini bf16 --profile      # + torch.profiler tables

The model and dtype are ``benchmarks/x86_models.py``'s (transformers configs, random weights;
int8 through pdlkit.quantization, i.e. torchao's PT2E x86 quantizer). Configurations: ``peer``
(Inductor alone, or PyTorch's own int8 path for int8: ``torch.compile`` with Inductor's
freezing), ``pdlkit`` (``pdlkit.optimize``, measured choice) and ``pdlkit-off`` (static
priority), compiled in that order in one process (freezing on for int8, for all three). Then
``--rounds`` interleaved rounds of 2 calls each, after one untimed call; printed: median latency, its ratio to the
peer's median, and the median of per-round ratios (the figure to quote on a shared host). With
``--profile``, a ``torch.profiler`` table of the top ops by self CPU time per configuration.
"""

from __future__ import annotations

import argparse
import os
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
    ap.add_argument("--batch", type=int, help="batch size (default: the model's)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    import torch._inductor.config as ic

    ic.freezing = args.dtype in xm.PT2E
    spec = xm.MODELS[args.model]
    xm.MODELS[args.model] = xm.Spec(spec.family, spec.config, args.batch or spec.batch, spec.size)
    print("\n".join(host_header(threads=args.threads)))
    model, x = xm.prepare(*xm.build(args.model), args.dtype)
    print(f"{args.model} {args.dtype}, input {tuple(x.shape)}")
    os.environ.setdefault("PDLKIT_CACHE_DIR", tempfile.mkdtemp(prefix="decisions-"))
    import pdlkit

    fns = {}
    for conf in ("peer", "pdlkit", "pdlkit-off"):
        pdlkit.stats(reset=True)
        t = time.perf_counter()
        fns[conf] = xm.maker(conf, model)()
        with torch.no_grad():
            fns[conf](x)
        st = pdlkit.stats()
        by = {
            k: v["substitutions"] for k, v in st.get("by_kernel", {}).items() if v["substitutions"]
        }
        print(f"{conf}: compile {time.perf_counter() - t:.1f} s, substitutions {by or 'none'}")
        print(
            f"  undone {st.get('substitutions_undone', 0)}, tuning hits / misses "
            f"{st.get('tuning_hits', 0)} / {st.get('tuning_misses', 0)}",
            flush=True,
        )
    times: dict[str, list[float]] = {c: [] for c in fns}
    with torch.no_grad():
        for f in fns.values():
            for _ in range(3):
                f(x)
        for _ in range(args.rounds):
            for c, f in fns.items():
                f(x)  # untimed: the timed calls follow the configuration's own (x86_models.py)
                t = time.perf_counter()
                f(x), f(x)
                times[c].append((time.perf_counter() - t) / 2)
        peer = statistics.median(times["peer"])
        for c, ts in times.items():
            per_round = statistics.median(a / b for a, b in zip(ts, times["peer"], strict=True))
            print(
                f"{c}: median {statistics.median(ts) * 1e3:.2f} ms, ratio "
                f"{statistics.median(ts) / peer:.3f}, per-round ratio median {per_round:.3f}"
            )
        if args.profile:
            profile(fns, x)


def profile(fns: dict, x: torch.Tensor) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    for c, f in fns.items():
        with torch_profile(activities=[ProfilerActivity.CPU]) as p:
            for _ in range(5):
                f(x)
        print(f"==== {c}: top ops by self CPU (5 calls)")
        table = p.key_averages().table(sort_by="self_cpu_time_total", row_limit=22)
        print(table)


if __name__ == "__main__":
    main()

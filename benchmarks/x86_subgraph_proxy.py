"""Does the proxy for "keep the subgraph" agree with the subgraph compiled by Inductor? (issue 21)

    python benchmarks/x86_subgraph_proxy.py                        # bert-mini int8-static,bf16,fp32
    python benchmarks/x86_subgraph_proxy.py --dtypes int8-static --out /tmp/p.md

pdlkit times "keep the subgraph" at each matched site by a proxy (``pdlkit/matcher/lowered.py``:
the library calls Inductor makes for the subgraph on the CPU, the rest of its ops eagerly)
instead of compiling the subgraph with Inductor (``PDLKIT_AUTOTUNE_SUBGRAPH=compile``). For
every site of the model this script compiles it with ``pdlkit.optimize(m, autotune="full")``
(Inductor's freezing on for the int8 dtypes, as x86_models.py) and, at each site, times side
by side, round-robin on the same arguments: the subgraph compiled by Inductor (its weights
constants under freezing) and the proxy; and prints the seconds each took to prepare, the
kernels' times, the proxy's bounds and the choice each timing leads to. The proxy does not
mislead where both choices agree (or differ only where the two are within the margin).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from machine import host_header  # benchmarks/machine.py
from x86_models import SCHEMES, build, prepare

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "x86_subgraph_proxy.md"


def site_rows(dtype: str, rows: list[dict[str, Any]]) -> Any:
    """Compile bert-mini of ``dtype`` with pdlkit, recording each site into ``rows``."""
    from pdlkit.matcher import choose, lowered
    from pdlkit.runtime_abi import autotune

    original = choose._subgraph_time

    def both(kernels: Any, subgraph: Any, real: Any, device: str, budget: float, frozen: Any):
        t0 = time.perf_counter()
        proxy = original(kernels, subgraph, real, device, budget, frozen)  # the default path
        proxy_s = time.perf_counter() - t0
        freezing = bool(torch._inductor.config.freezing)
        constants = frozen if freezing else ()
        low = lowered.as_inductor_lowers(subgraph.module(), real, constants, freezing)
        t0 = time.perf_counter()
        fn = subgraph.compile(list(real), constants)
        compile_s = time.perf_counter() - t0
        tensors = [
            a for i, a in enumerate(real) if isinstance(a, torch.Tensor) and i not in constants
        ]
        runs = [("compiled", lambda: fn(*tensors)), ("proxy", lambda: low.module(*real))]
        with torch.no_grad():
            compiled_t, proxy_t = autotune.measure(runs, device, 4 * budget, samples=15)
        names = [t.name for t in kernels]
        as_compiled = autotune.fastest(
            [*kernels, autotune.Timing("subgraph", compiled_t.us)], names
        )
        rows.append(dict(
            dtype=dtype, kernels=kernels, compiled=compiled_t.us, proxy_run=proxy_t.us,
            proxy=proxy, lowered=low.lowered, faithful=low.faithful, compile_s=compile_s,
            proxy_s=proxy_s, by_compiled=as_compiled,
            by_proxy=autotune.fastest([*kernels, proxy], names),
        ))  # fmt: skip
        return proxy

    choose._subgraph_time = both
    try:
        import pdlkit

        model, x = prepare(*build("bert-mini"), dtype)
        torch._inductor.config.freezing = dtype.startswith("int8")
        torch._dynamo.reset()
        with torch.no_grad():
            pdlkit.optimize(model, autotune="full")(x)
    finally:
        choose._subgraph_time = original
        torch._inductor.config.freezing = False


def fmt_us(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _differ(r: dict[str, Any]) -> str:
    """ "tie" where the two choices differ but the kernel and the compiled subgraph are
    within the autotune margin of each other (either choice costs under 3%), else **no**."""
    from pdlkit.runtime_abi.autotune import MARGIN

    best = min((t.us for t in r["kernels"] if t.us is not None), default=None)
    if best is not None and r["compiled"] and abs(best - r["compiled"]) <= MARGIN * r["compiled"]:
        return "tie"
    return "**no**"


def table(rows: list[dict[str, Any]]) -> list[str]:
    out = [
        "| dtype | site (kernels: us) | compiled us | proxy us (its bounds' note) | lower us"
        " | proxy / compiled | choice by compiled | by proxy | same | compile s | proxy s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ks = ", ".join(f"{t.name} {fmt_us(t.us)}" for t in r["kernels"])
        p = r["proxy"]
        ratio = f"{r['proxy_run'] / r['compiled']:.2f}" if r["compiled"] and r["proxy_run"] else "-"
        same = "yes" if r["by_compiled"] == r["by_proxy"] else _differ(r)
        out.append(
            f"| {r['dtype']} | {ks} | {fmt_us(r['compiled'])} | {fmt_us(r['proxy_run'])}"
            f" (library: {fmt_us(p.us)}, {p.note}) | {fmt_us(p.low)} | {ratio}"
            f" | {r['by_compiled']} | {r['by_proxy']} | {same}"
            f" | {r['compile_s']:.2f} | {r['proxy_s']:.2f} |"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", default="int8-static,bf16,fp32")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    os.environ["PDLKIT_CACHE_DIR"] = tempfile.mkdtemp(prefix="decisions-")
    start = time.perf_counter()
    rows: list[dict[str, Any]] = []
    for dtype in args.dtypes.split(","):
        if dtype not in SCHEMES:
            raise SystemExit(f"--dtypes: unknown {dtype!r}; one of {', '.join(SCHEMES)}")
        site_rows(dtype, rows)
        print("\n".join(table([r for r in rows if r["dtype"] == dtype])), flush=True)
    agree = sum(r["by_compiled"] == r["by_proxy"] for r in rows)
    ties = sum(r["by_compiled"] != r["by_proxy"] and _differ(r) == "tie" for r in rows)
    ratios = sorted(
        r["proxy_run"] / r["compiled"] for r in rows if r["compiled"] and r["proxy_run"]
    )
    text = "\n".join([
        "# The proxy for \"keep the subgraph\" against the subgraph compiled by Inductor (issue 21)",
        "",
        f"Generated by `python benchmarks/x86_subgraph_proxy.py --dtypes {args.dtypes}"
        f" --threads {args.threads}` in {time.perf_counter() - start:.0f} s (its docstring says how).",
        "",
        *host_header(args.threads),
        "",
        f"Sites: {len(rows)}; the same choice by both timings at {agree}, a tie (kernel and"
        f" compiled subgraph within 3%) at {ties}. proxy / compiled:"
        + (f" min {ratios[0]:.2f}, median {ratios[len(ratios) // 2]:.2f}, max {ratios[-1]:.2f}"
           if ratios else " -"),
        "",
        "`compiled`: the subgraph compiled by Inductor (its weights constants under freezing, on"
        " for int8), timed round-robin with `proxy`: the subgraph with Inductor's library calls,"
        " the rest eagerly (`pdlkit/matcher/lowered.py`). `library`: what pdlkit's default path"
        " returned for the site (a bound where it decides, else the proxy); `lower`: the proxy's"
        " library calls alone. `compile s` / `proxy s`: seconds to compile and time the subgraph,"
        " and pdlkit's default path for it.",
        "",
        *table(rows),
        "",
    ])  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"\nwritten to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Does the proxy for "keep the subgraph" agree with the subgraph compiled by Inductor? (issue 21)

    python benchmarks/x86_subgraph_proxy.py                        # bert-mini int8-static,bf16,fp32
    python benchmarks/x86_subgraph_proxy.py --dtypes int8-static --out /tmp/p.md
    python benchmarks/x86_subgraph_proxy.py --model vit --dtypes int8-static   # another model

pdlkit times "keep the subgraph" at each matched site by a proxy (``pdlkit/matcher/lowered.py``:
the library calls Inductor makes for the subgraph on the CPU, the rest of its ops eagerly)
instead of compiling the subgraph with Inductor (``PDLKIT_AUTOTUNE_SUBGRAPH=compile``). For
every site of bert-mini (or ``--model``) this script compiles it with
``pdlkit.optimize(m, autotune="full")`` (Inductor's freezing on for the int8 dtypes, as
x86_models.py) and, once pdlkit has decided the site, times side by side, round-robin on
the same arguments: each kernel, the subgraph
compiled by Inductor (its weights constants under freezing) and the proxy. It prints the
choice each subgraph timing leads to, pdlkit's own choice (with the bound or estimate it used),
and the seconds compiling the subgraph took against pdlkit's default path. The proxy does not
mislead where no choice it leads to runs a kernel slower than the compiled timing's choice by
more than the autotune margin (3%); keeping the subgraph where a kernel is faster is a missed
win, never slower than Inductor.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings
from functools import partial
from pathlib import Path
from typing import Any

import torch
from machine import host_header  # benchmarks/machine.py
from x86_models import SCHEMES, build, prepare

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "x86_subgraph_proxy.md"


def site_rows(dtype: str, rows: list[dict[str, Any]], model_name: str = "bert-mini") -> None:
    """Compile ``model_name`` (x86_models.py's) of ``dtype`` with pdlkit, recording each site
    into ``rows``: pdlkit's own decision (its default path), then the kernels, the compiled
    subgraph and the proxy timed again together, round-robin (the same conditions for all: a
    machine's speed drifts between phases, on a Xeon with AMX by up to 2x)."""
    from pdlkit.matcher import choose, cold, lowered
    from pdlkit.runtime_abi import autotune

    original, original_time = choose.decide, choose._subgraph_time
    spent: list[float] = []

    def subgraph_time(*args: Any) -> Any:
        t0 = time.perf_counter()
        out = original_time(*args)
        spent.append(time.perf_counter() - t0)
        return out

    def decide(runs: Any, subgraph: Any, reals: Any, device: str, budget: float, where: str,
               frozen: Any = ()) -> Any:  # fmt: skip
        decision = original(runs, subgraph, reals, device, budget, where, frozen)
        freezing = bool(torch._inductor.config.freezing)
        constants = frozen if freezing else ()
        # as pdlkit times them: one run per copy of the site's weights (matcher/cold.py)
        lows = [
            lowered.as_inductor_lowers(subgraph.module(), r, constants, freezing) for r in reals
        ]
        t0 = time.perf_counter()
        fn = subgraph.compile(list(reals[0]), constants)
        compile_s = time.perf_counter() - t0
        compiled = [partial(fn, *[a for i, a in enumerate(r)
                                  if isinstance(a, torch.Tensor) and i not in constants])
                    for r in (reals[:1] if constants else reals)]  # fmt: skip
        proxy = [partial(low.module, *r) for low, r in zip(lows, reals, strict=True)]
        both = [("compiled", cold.rotating(compiled)), ("proxy", cold.rotating(proxy))]
        with torch.no_grad():
            timed = autotune.measure([*runs, *both], device, 4 * budget, samples=15)
        t = {x.name: x for x in timed}
        kernels, names = [t[n] for n, _ in runs], [n for n, _ in runs]
        keep = next(x for x in decision.timings if x.name == autotune.KEEP)
        rows.append(dict(
            dtype=dtype, kernels=kernels, compiled=t["compiled"].us, proxy_run=t["proxy"].us,
            keep=keep, choice=decision.choice, compile_s=compile_s, proxy_s=spent[-1],
            by_compiled=autotune.fastest([*kernels, autotune.Timing("subgraph", t["compiled"].us)], names),
            by_proxy=autotune.fastest([*kernels, autotune.Timing("subgraph", t["proxy"].us)], names),
        ))  # fmt: skip
        return decision

    choose.decide, choose._subgraph_time = decide, subgraph_time
    try:
        import pdlkit

        model, x = prepare(*build(model_name), dtype)
        torch._inductor.config.freezing = dtype.startswith("int8")
        torch._dynamo.reset()
        with torch.no_grad():
            pdlkit.optimize(model, autotune="full")(x)
    finally:
        choose.decide, choose._subgraph_time = original, original_time
        torch._inductor.config.freezing = False


def fmt_us(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _differ(r: dict[str, Any], choice: str) -> str:
    """``choice`` against the compiled timing's: "yes" (the same), "tie" (it costs within the
    autotune margin of that one), "missed N%" (the subgraph kept where a kernel is N% faster:
    Inductor's code runs, never slower than without pdlkit) or "**slower N%**" (a kernel N%
    slower than the compiled subgraph or the better kernel: what the proxy must not cause)."""
    from pdlkit.runtime_abi.autotune import MARGIN

    if choice == r["by_compiled"]:
        return "yes"
    cost = {t.name: t.us for t in r["kernels"] if t.us is not None}
    cost["subgraph"] = r["compiled"]
    best, ours = cost.get(r["by_compiled"]), cost.get(choice)
    if best is None or ours is None:
        return "**no**"
    if ours <= best * (1 + MARGIN):
        return "tie"
    return (
        f"missed {ours / best - 1:.0%}"
        if choice == "subgraph"
        else f"**slower {ours / best - 1:.0%}**"
    )


def table(rows: list[dict[str, Any]]) -> list[str]:
    out = [
        "| dtype | kernels us | compiled us | proxy us | proxy / compiled | by compiled"
        " | by proxy | same | pdlkit chose (its subgraph time, how) | same | compile s | proxy s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ks = ", ".join(f"{t.name} {fmt_us(t.us)}" for t in r["kernels"])
        k = r["keep"]
        ratio = f"{r['proxy_run'] / r['compiled']:.2f}" if r["compiled"] and r["proxy_run"] else "-"
        out.append(
            f"| {r['dtype']} | {ks} | {fmt_us(r['compiled'])} | {fmt_us(r['proxy_run'])} | {ratio}"
            f" | {r['by_compiled']} | {r['by_proxy']} | {_differ(r, r['by_proxy'])}"
            f" | {r['choice']} ({fmt_us(k.us)}, {k.note}) | {_differ(r, r['choice'])}"
            f" | {r['compile_s']:.2f} | {r['proxy_s']:.2f} |"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="bert-mini", help="one of x86_models.py's models")
    ap.add_argument("--dtypes", default="int8-static,bf16,fp32")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    os.environ["PDLKIT_CACHE_DIR"] = tempfile.mkdtemp(prefix="decisions-")
    # Inductor's caches cold, as on a new machine: `compile s` is a first compile's
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-")
    start = time.perf_counter()
    rows: list[dict[str, Any]] = []
    for dtype in args.dtypes.split(","):
        if dtype not in SCHEMES:
            raise SystemExit(f"--dtypes: unknown {dtype!r}; one of {', '.join(SCHEMES)}")
        site_rows(dtype, rows, args.model)
        print("\n".join(table([r for r in rows if r["dtype"] == dtype])), flush=True)

    def count(key: str) -> str:
        marks = [_differ(r, r[key]) for r in rows]
        n = {m: sum(x.startswith(m) for x in marks) for m in ("yes", "tie", "missed", "**slower")}
        return (f"same {n['yes']}, tie {n['tie']}, subgraph kept where a kernel was faster"
                f" {n['missed']}, a slower kernel {n['**slower']}")  # fmt: skip

    ratios = sorted(
        r["proxy_run"] / r["compiled"] for r in rows if r["compiled"] and r["proxy_run"]
    )
    text = "\n".join([
        "# The proxy for \"keep the subgraph\" against the subgraph compiled by Inductor (issue 21)",
        "",
        f"Generated by `python benchmarks/x86_subgraph_proxy.py --model {args.model}"
        f" --dtypes {args.dtypes}"
        f" --threads {args.threads}` in {time.perf_counter() - start:.0f} s (its docstring says how).",
        "",
        *host_header(args.threads),
        "",
        f"Sites: {len(rows)}. Against the choice by the compiled subgraph: the choice by the"
        f" proxy (same samples) {count('by_proxy')}; pdlkit's own choice {count('choice')}."
        " proxy / compiled:"
        + (f" min {ratios[0]:.2f}, median {ratios[len(ratios) // 2]:.2f}, max {ratios[-1]:.2f}"
           if ratios else " -"),
        "",
        "Per site, timed together round-robin on the same arguments after pdlkit decided:"
        " each kernel, `compiled` (the subgraph compiled by Inductor, its weights constants under"
        " freezing, on for int8) and `proxy` (the subgraph with Inductor's library calls, the"
        " rest eagerly: `pdlkit/matcher/lowered.py`); the choice each subgraph timing leads to"
        " (`by compiled`, `by proxy`). `pdlkit chose`: its default path's own decision, timed"
        " earlier, with the subgraph time it used (`eager; every kernel is slower`: the proxy as"
        " an upper bound; `its library calls alone`: a lower bound; `proxy:` the proxy's"
        " estimate). `same`: against `by compiled` (`tie`: within 3% of that choice; `missed`:"
        " the subgraph kept where a kernel is faster; `slower`: a kernel slower than that"
        " choice). `compile s`: compiling the subgraph; `proxy s`: pdlkit's default path for it.",
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

"""A transformers Llama decode step on an x86 CPU: pdlkit against Inductor (issue 21's rule,
"never slower than the compiler it replaces", for LLM decode on the host).

    python benchmarks/x86_decode.py [--configs small tinyllama] [--dtypes bf16 fp32]
        [--batches 1 8] [--ctx 128] [--threads N] [--rounds 9] [--calls 10] [--out DIR]

The model is ``transformers.LlamaModel`` with 2 decoder layers at the config's sizes (random
weights, as ``cuda_llama.py`` builds it; ``tinyllama``: TinyLlama-1.1B's hidden 2048,
intermediate 5632, 32 heads over 4 KV heads); the step is ``cuda_llama.DecodeStep``: one token
for each of B sequences over a static KV cache of ``--ctx`` tokens, written in place at
position ctx (``--dynamic``: compiled with ``dynamic=True``, as a server whose batch and
cache lengths vary ends up compiling; each site, and the whole-graph check, chooses per shape
bucket at the bucket's first call: matcher/graph_buckets.py). Configurations, each with a KV
cache and a decision cache of its own:
``inductor`` (``torch.compile``), ``pdlkit`` (``pdlkit.optimize``, autotune "cached": the
whole-graph check times this graph on a copy of the cache it writes) and ``pdlkit-off``
(static priority, ``autotune="off"``). Timed in rounds, the configurations round-robin, each a
window of ``--calls`` back-to-back calls; ratios per round against Inductor, then the median
[lowest-highest]. Also: compile seconds (first call), what pdlkit substituted, whether the
whole-graph check undid it, and the largest difference from the eager step's output.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cuda_llama as L  # noqa: E402  benchmarks/cuda_llama.py: model, cache, decode step
from machine import host_header  # noqa: E402
from x86_models import inductor_cache, warm_process  # noqa: E402

SIZES = {
    "small": {"hidden_size": 1024, "intermediate_size": 2816, "heads": 16, "kv_heads": 4},
    "tinyllama": {"hidden_size": 2048, "intermediate_size": 5632, "heads": 32, "kv_heads": 4},
}
CONFS = ["inductor", "pdlkit", "pdlkit-off"]
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def compiled(conf: str, step: torch.nn.Module, tmp: str, dynamic: bool) -> Any:
    import pdlkit

    os.environ["PDLKIT_CACHE_DIR"] = os.path.join(tmp, conf)  # a decision cache of its own
    if conf == "inductor":
        return torch.compile(step, dynamic=dynamic)
    return pdlkit.optimize(step, dynamic=dynamic, autotune="off" if conf == "pdlkit-off" else None)


def run_case(config: str, dtype: str, batch: int, args: argparse.Namespace, tmp: str) -> dict:
    import pdlkit

    model = L.build_model(config, "cpu").to(DTYPES[dtype])
    ids = torch.randint(0, L.VOCAB, (batch, 1), generator=torch.Generator().manual_seed(2))

    def step() -> L.DecodeStep:
        kv = L.make_kv(model, batch, args.ctx, "cpu")
        kv.keys = [k.to(DTYPES[dtype]) for k in kv.keys]
        kv.values = [v.to(DTYPES[dtype]) for v in kv.values]
        return L.DecodeStep(model, kv)

    r: dict[str, Any] = {"compile_s": {}, "err": {}, "ratios": {c: [] for c in CONFS[1:]}}
    fns = {}
    with torch.no_grad():
        ref = step()(ids).float()
        for conf in CONFS:
            torch._dynamo.reset()
            pdlkit.stats(reset=True)
            fn = compiled(conf, step(), tmp, args.dynamic)
            with inductor_cache(os.path.join(tmp, f"inductor-{conf}-{dtype}-{batch}")):
                t0 = time.perf_counter()
                out = fn(ids)  # compiles, in an Inductor cache folder of its own
                r["compile_s"][conf] = time.perf_counter() - t0
            r["err"][conf] = (out.float() - ref).abs().max().item()
            st = pdlkit.stats()
            if conf == "pdlkit":  # the sites that ran a kernel in the first call
                r["subs"] = {k: v["kernel_calls"] for k, v in st["by_kernel"].items()
                             if v.get("kernel_calls")}  # fmt: skip
                undone = st.get("substitutions_undone") or st.get("buckets_to_inductor")
                r["check"] = "not measured" if st.get("graphs_not_measured") else "measured"
                r["check"] += ", Inductor's graph runs" if undone else ""
            fns[conf] = fn
        for _ in range(2):  # warm-up
            for fn in fns.values():
                fn(ids)
        times: dict[str, list[float]] = {c: [] for c in CONFS}
        for rnd in range(args.rounds):
            for conf in CONFS[rnd % 3 :] + CONFS[: rnd % 3]:
                t0 = time.perf_counter()
                for _ in range(args.calls):
                    fns[conf](ids)
                times[conf].append((time.perf_counter() - t0) / args.calls)
            for c in CONFS[1:]:
                r["ratios"][c].append(times[c][-1] / times["inductor"][-1])
    r["ms"] = {c: statistics.median(t) * 1e3 for c, t in times.items()}
    return r


def line(config: str, dtype: str, batch: int, r: dict) -> str:
    def ratio(c: str) -> str:
        q = r["ratios"][c]
        return f"{statistics.median(q):.3f}x [{min(q):.2f}-{max(q):.2f}]"

    ms, cs = r["ms"], r["compile_s"]
    return (
        f"| {config} | {dtype} | {batch} | {ms['inductor']:.2f} | {ms['pdlkit']:.2f} | "
        f"{ratio('pdlkit')} | {ms['pdlkit-off']:.2f} | {ratio('pdlkit-off')} | {r['check']} | "
        f"{cs['inductor']:.1f} / {cs['pdlkit']:.1f} / {cs['pdlkit-off']:.1f} | "
        f"{r['err']['inductor']:.3g} / {r['err']['pdlkit']:.3g} | {r['subs']} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--configs", nargs="*", default=["small"], choices=sorted(SIZES))
    ap.add_argument("--dtypes", nargs="*", default=["bf16", "fp32"], choices=sorted(DTYPES))
    ap.add_argument("--batches", nargs="*", type=int, default=[1, 8])
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument(
        "--dynamic", action="store_true", help="compile with dynamic=True (shapes symbolic)"
    )
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    L.CONFIGS.update(SIZES)
    lines = [
        "# A Llama decode step on the CPU: pdlkit against Inductor",
        "",
        *host_header(args.threads),
        "",
        f"`python benchmarks/x86_decode.py {' '.join(sys.argv[1:])}` (the script's docstring "
        "says how). ms: medians of per-round window means; ratios: per round against Inductor "
        "(lower is faster), median [lowest-highest]; check: whether the whole-graph check timed "
        "pdlkit's graph; compile s: the first call, each configuration in an Inductor cache "
        "folder of its own, after a warm-up compile of a small MLP; max abs err: "
        "against the eager step; pdlkit's kernels: per kernel, the sites that ran it in the "
        "first call (after the whole-graph check's choice).",
        "",
        "| config | dtype | batch | Inductor ms | pdlkit ms | pdlkit / Inductor | pdlkit-off ms "
        "| off / Inductor | check | compile s: Inductor / pdlkit / off | max abs err: "
        "Inductor / pdlkit | pdlkit's kernels |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        lines.insert(len(host_header(args.threads)) + 2, warm_process(tmp))  # one-time costs
        for config in args.configs:
            for dtype in args.dtypes:
                for batch in args.batches:
                    r = run_case(config, dtype, batch, args, tmp)
                    lines.append(line(config, dtype, batch, r))
                    print(lines[-1], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "x86_decode.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

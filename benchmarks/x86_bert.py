"""Quantized BERT on an x86 CPU: pdlkit int8 / BF16 next to eager, Inductor and PyTorch's int8 path.

    python benchmarks/x86_bert.py                 # bert-mini, 8 x 64, one thread
    python benchmarks/x86_bert.py --bert-base     # + BERT-base, 1 x 128 and 8 x 128, 1 and 2 threads
    python benchmarks/x86_bert.py --repeats 50    # timed calls per configuration and round
    python benchmarks/x86_bert.py --rounds 1      # one pass over the configurations (quicker)

Writes ``results/x86_bert.md`` (``--out`` to change). Every case builds one FP32 model with
random weights (``transformers.BertModel``, seed 0, eval mode, default SDPA attention, no
mask) and one batch of random ``input_ids``, then measures six configurations one after the
other, in one process, each after ``torch._dynamo.reset()``, in ``--rounds`` passes over all
six (5 for bert-mini, 1 for BERT-base) so that bursts of load from other users of the machine
fall on every configuration:

1. ``fp32-eager``: the FP32 model as is.
2. ``fp32-inductor``: ``torch.compile(model)`` (Inductor defaults, no freezing).
3. ``bf16-inductor``: ``torch.compile(model.to(torch.bfloat16))`` (Inductor defaults).
4. ``int8-inductor``: PyTorch's own x86 int8 path: ``torch.export.export(model, args).module()``
   -> torchao ``prepare_pt2e`` / ``convert_pt2e`` with ``X86InductorQuantizer``'s default
   static config, calibrated once on the benchmark batch, then ``torch.compile`` with
   ``torch._inductor.config.freezing = True`` (only for this configuration).
5. ``pdlkit-int8``: ``pdlkit.optimize(converted)`` on the same converted model (shipped
   patterns and kernels; Inductor for the rest, with ``freezing = True`` like 4, so that
   both int8 paths see the weights as constants).
6. ``pdlkit-bf16``: ``pdlkit.optimize(model_bf16)`` on the same BF16 model as 3.

The int8 model comes from ``pdlkit.quantization.quantize(model, (ids,))`` (scheme
``int8-static``), which is exactly the torchao flow of 4. Every call runs under
``torch.no_grad()``. In every round the first call of a compiled configuration compiles it
(reported as "compile s" for round 1, not part of the latency); then ``--warmup`` calls, then
``--repeats`` timed calls (``time.perf_counter`` around each call). Reported: the median over
all rounds with the 25th / 75th percentiles, the 10th percentile (the latency when the core
was not shared), ratios on both, and per-round medians. A shared machine: the load average is
recorded after each configuration.

Accuracy, on the last hidden state (``outputs[0]``) of the last timed call of round 1: cosine
similarity against FP32 eager (target >= 0.99), and max abs error against each configuration's
own eager reference: the PT2E converted model run eagerly for the int8 configurations, the BF16
model run eagerly for the BF16 ones, FP32 eager for FP32 Inductor.

GEMMs: ``pdlkit.explain(model, ids).counts()`` (substitutions per pattern) for the int8 and
BF16 models, and the share of the linear layers' FLOPs (2 * M * N * K) whose ``aten.linear``
node a substitution replaced.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from _x86_bert_gemm import GEMM_LIMIT_SIZE, gemm_info, gemm_limits, gemm_rates
from _x86_bert_results import (
    CONFIGS,
    PEER,
    Case,
    CaseResult,
    Timing,
    paired_ratios,
    paired_speedups,
    render,
)
from machine import host_header  # benchmarks/machine.py
from measure import last_hidden, write_report  # benchmarks/measure.py

# The configurations, the cases and their timings, and the report: benchmarks/_x86_bert_results.py;
# GEMM coverage, the single-core limit and the in-model GEMM rates: benchmarks/_x86_bert_gemm.py.

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "x86_bert.md"

MINI = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024)


# -- models ---------------------------------------------------------------------------------------


def build(case: Case) -> tuple[torch.nn.Module, torch.Tensor]:
    import transformers

    torch.manual_seed(0)
    cfg = transformers.BertConfig(**case.config_kwargs)
    model = transformers.BertModel(cfg).eval()  # random weights, nothing downloaded
    ids = torch.randint(0, cfg.vocab_size, (case.batch, case.seq), dtype=torch.int64)
    return model, ids


def _reference_models(
    model: torch.nn.Module, ids: torch.Tensor
) -> tuple[Any, Any, dict[str, tuple[str, torch.Tensor]]]:
    """(the BF16 model, the PT2E int8 model, each dtype's eager reference output)."""
    from pdlkit.quantization import quantize

    with torch.no_grad():
        ref_fp32 = last_hidden(model(ids)).float()
        model_bf16 = quantize(model, (ids,), scheme="bf16")
        ref_bf16 = last_hidden(model_bf16(ids)).float()
        # torch.export -> prepare_pt2e(X86InductorQuantizer default static) -> 1 calibration -> convert_pt2e
        converted = quantize(model, (ids,), scheme="int8-static")
        ref_int8 = last_hidden(converted(ids)).float()
    refs = {
        "fp32": ("FP32 eager", ref_fp32),
        "bf16": ("BF16 eager", ref_bf16),
        "int8": ("PT2E converted, eager", ref_int8),
    }
    return model_bf16, converted, refs


# -- measuring --------------------------------------------------------------------------------------


def time_calls(
    fn: Callable[[], Any], warmup: int, repeats: int
) -> tuple[list[float], float, torch.Tensor]:
    """(timed calls in ms, first call in s, last output); the first call compiles."""
    with torch.no_grad():
        t = time.perf_counter()
        out = fn()
        first = time.perf_counter() - t
        for _ in range(warmup):
            fn()
        runs = []
        for _ in range(repeats):
            t = time.perf_counter()
            out = fn()
            runs.append((time.perf_counter() - t) * 1e3)
    return runs, first, last_hidden(out).detach().float()


def _record(
    res: CaseResult,
    cfg: str,
    runs: list[float],
    first: float,
    out: torch.Tensor,
    reference: tuple[str, torch.Tensor],
    ref_fp32: torch.Tensor,
) -> Timing:
    """One round of ``cfg`` added to its Timing (made on its first round: compile time and
    accuracy, against FP32 eager and against ``reference``)."""
    from pdlkit.quantization import cosine_similarity, max_abs_error

    t = res.timings.get(cfg)
    if t is None:
        ref_name, ref = reference
        t = res.timings[cfg] = Timing(
            config=cfg,
            runs_ms=[],
            compile_s=first if cfg != "fp32-eager" else 0.0,
            load_avg=os.getloadavg(),
            cosine=cosine_similarity(out, ref_fp32),
            max_abs=max_abs_error(out, ref) if cfg != "fp32-eager" else 0.0,
            reference=ref_name,
        )
    t.runs_ms += runs
    t.round_medians.append(statistics.median(runs))
    t.load_avg = os.getloadavg()
    return t


Maker = Callable[[str], tuple[Callable[[], Any], str]]  # configuration -> (call, reference key)


def run_case(case: Case, args: argparse.Namespace) -> CaseResult:
    import pdlkit

    torch.set_num_threads(case.threads)
    res = CaseResult(case)
    print(f"\n== {case.name}: building the models", flush=True)
    model, ids = build(case)
    model_bf16, converted, refs = _reference_models(model, ids)

    # configuration: how it compiles, which model, the reference its outputs are held to
    compilers: dict[str, Callable[[Any], Any]] = {
        "eager": lambda m: m,
        "inductor": torch.compile,
        "pdlkit": pdlkit.optimize,
    }
    plans = {
        "fp32-eager": ("eager", model, "fp32"),
        "fp32-inductor": ("inductor", model, "fp32"),
        "bf16-inductor": ("inductor", model_bf16, "bf16"),
        "int8-inductor": ("inductor", converted, "int8"),
        "pdlkit-int8": ("pdlkit", converted, "int8"),
        "pdlkit-bf16": ("pdlkit", model_bf16, "bf16"),
    }

    def make(cfg: str) -> tuple[Callable[[], Any], str]:
        if cfg not in plans:
            raise ValueError(cfg)
        how, m, ref = plans[cfg]
        c = compilers[how](m)
        return (lambda: c(ids)), ref

    wanted = args.configs.split(",")
    _timed_rounds(res, args, wanted, make, refs)
    torch._dynamo.reset()
    if args.gemm_rates:
        _gemm_rates_in_model(res, wanted, make)
    if args.paired and PEER in wanted and "pdlkit-int8" in wanted:
        res.paired = paired_int8(
            model if "fp32-eager" in wanted else None, converted, ids, args.paired
        )
        torch._dynamo.reset()
    _gemm_coverage(res, wanted, (converted, model_bf16), ids)
    return res


def _timed_rounds(
    res: CaseResult,
    args: argparse.Namespace,
    wanted: list[str],
    make: Maker,
    refs: dict[str, tuple[str, torch.Tensor]],
) -> None:
    """Every wanted configuration compiled and timed once per round, into ``res``."""
    import torch._inductor.config as ic

    import pdlkit

    ref_fp32 = refs["fp32"][1]
    # Rounds: every configuration is measured once per round (compiled afresh after a
    # reset; Inductor's caches make the later compiles quicker), so that a burst of load
    # from other users of the machine lands on all configurations rather than on one.
    for rnd in range(args.rounds):
        for cfg, label in CONFIGS:
            if cfg not in wanted:
                continue
            torch._dynamo.reset()
            ic.freezing = cfg in (PEER, "pdlkit-int8")
            if cfg.startswith("pdlkit"):
                pdlkit.stats(reset=True)
            try:
                fn, ref_key = make(cfg)
                runs, first, out = time_calls(fn, args.warmup, args.repeats)
                del fn
            finally:
                ic.freezing = False
            ref_name, ref = refs[ref_key]
            t = _record(res, cfg, runs, first, out, (ref_name, ref), ref_fp32)
            if cfg.startswith("pdlkit"):
                s = pdlkit.stats()
                res.stats[cfg] = {k: s[k] for k in ("substitutions", "kernel_calls", "fallbacks")}
            print(
                f"   [{rnd + 1}/{args.rounds}] {label:<34} {statistics.median(runs):8.2f} ms  "
                f"(min {min(runs):.2f})  compile {first:5.1f} s  cos {t.cosine:.5f}  "
                f"max|err| {t.max_abs:.4g} vs {ref_name}  load {t.load_avg[0]:.2f}",
                flush=True,
            )


def _gemm_rates_in_model(res: CaseResult, wanted: list[str], make: Maker) -> None:
    """The single-core GEMM limit, then the pdlkit configurations' GEMM kernel rates."""
    import torch._inductor.config as ic

    res.limits = gemm_limits()
    print(
        f"   single-core limit ({res.case.threads} thread(s), {GEMM_LIMIT_SIZE}^3 through oneDNN): "
        + ", ".join(f"{k} {v:.0f} GOP/s" for k, v in res.limits.items()),
        flush=True,
    )
    for cfg in ("pdlkit-int8", "pdlkit-bf16"):
        if cfg not in wanted:
            continue
        torch._dynamo.reset()
        ic.freezing = cfg == "pdlkit-int8"
        try:
            fn, _ = make(cfg)
            res.rates[cfg] = gemm_rates(fn)
        finally:
            ic.freezing = False
        rates = res.rates[cfg]
        total = sum(2 * r.m * r.k * r.n * r.calls for r in rates) / (
            sum(r.us for r in rates) * 1e3 or 1
        )
        print(f"   {cfg}: GEMM kernels at {total:.0f} GOP/s in the model", flush=True)
    torch._dynamo.reset()


def _gemm_coverage(
    res: CaseResult, wanted: list[str], models: tuple[Any, Any], ids: torch.Tensor
) -> None:
    """Which linears pdlkit substituted in the int8 and BF16 models (``models``), printed."""
    converted, model_bf16 = models
    if "pdlkit-int8" in wanted:
        res.gemms["int8"] = gemm_info(converted, ids, converted)
    if "pdlkit-bf16" in wanted:
        res.gemms["bf16"] = gemm_info(model_bf16, ids, None)
    for k, g in res.gemms.items():
        print(
            f"   pdlkit {k}: {g.substituted} of {g.linears} linears substituted "
            f"({100 * g.flop_share:.0f}% of linear FLOPs): {g.counts}",
            flush=True,
        )


def paired_int8(
    model: torch.nn.Module | None, converted: torch.nn.Module, ids: torch.Tensor, windows: int
) -> dict[str, list[float]]:
    """PyTorch's int8 path and pdlkit int8, compiled side by side, and FP32 eager (``model``,
    unless None) timed in alternating windows of 3 calls each: load from other users of the
    machine lands on all of them alike, so the per-window ratios (pdlkit against PyTorch's
    int8 path, FP32 eager against pdlkit) are steadier than ratios of medians taken minutes
    apart."""
    import torch._inductor.config as ic

    import pdlkit

    ic.freezing = True
    try:
        with torch.no_grad():
            fns: dict[str, Callable[..., Any]] = {
                PEER: torch.compile(converted),
                "pdlkit-int8": pdlkit.optimize(converted),
            }
            if model is not None:
                fns["fp32-eager"] = model
            for _ in range(3):  # compile, then warm both (each backend keeps its own entry)
                for f in fns.values():
                    f(ids)
            times: dict[str, list[float]] = {k: [] for k in fns}
            for _ in range(windows):
                for k, f in fns.items():
                    t = time.perf_counter()
                    for _ in range(3):
                        f(ids)
                    times[k].append((time.perf_counter() - t) / 3 * 1e3)
    finally:
        ic.freezing = False
    print(
        f"   paired: PyTorch int8 {statistics.median(times[PEER]):.2f} ms, pdlkit int8 "
        f"{statistics.median(times['pdlkit-int8']):.2f} ms, ratio "
        f"{statistics.median(paired_ratios(times)):.3f}"
        + (
            f"; FP32 eager {statistics.median(times['fp32-eager']):.2f} ms, "
            f"{statistics.median(paired_speedups(times)):.2f}x faster"
            if "fp32-eager" in times
            else ""
        ),
        flush=True,
    )
    return times


# -- main -------------------------------------------------------------------------------------------


def _parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--bert-base",
        action="store_true",
        help="also BERT-base, 1 x 128 and 8 x 128, one and two threads (slow here)",
    )
    ap.add_argument("--no-mini", action="store_true", help="skip bert-mini (with --bert-base)")
    ap.add_argument(
        "--base-threads",
        default="1,2",
        help="BERT-base thread counts, comma-separated (default 1,2)",
    )
    ap.add_argument(
        "--base-batches", default="1,8", help="BERT-base batch sizes, comma-separated (default 1,8)"
    )
    ap.add_argument("--repeats", type=int, default=None, help="timed calls per configuration")
    ap.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="rounds over all configurations (default 5 for bert-mini, 1 for BERT-base)",
    )
    ap.add_argument("--warmup", type=int, default=5, help="untimed calls after the compiling one")
    ap.add_argument(
        "--configs",
        default=",".join(c for c, _ in CONFIGS),
        help="comma-separated subset of " + ", ".join(c for c, _ in CONFIGS),
    )
    ap.add_argument(
        "--paired",
        type=int,
        default=30,
        help="alternating windows of PyTorch's int8 path and pdlkit int8 (0: skip)",
    )
    ap.add_argument(
        "--no-gemm-rates",
        dest="gemm_rates",
        action="store_false",
        help="skip the single-core GEMM limit and the per-kernel GEMM rates in the model",
    )
    ap.add_argument("--out", type=Path, default=RESULTS)
    return ap.parse_args()


def _cases(args: argparse.Namespace) -> list[tuple[Case, int, int]]:
    """The cases to run: (case, timed calls per round, rounds)."""
    cases: list[tuple[Case, int, int]] = []  # case, timed calls per round, rounds
    if not args.no_mini:
        cases.append((Case("bert-mini", MINI, 8, 64, 1), args.repeats or 30, args.rounds or 5))
    if args.bert_base:
        for threads in (int(t) for t in args.base_threads.split(",")):
            for batch in (int(b) for b in args.base_batches.split(",")):
                reps = args.repeats or (20 if batch == 1 else 8)
                cases.append((Case("BERT-base", {}, batch, 128, threads), reps, args.rounds or 1))
    return cases


def main() -> int:
    args = _parse_args()

    warnings.filterwarnings("ignore")
    import logging

    logging.getLogger("torch._dynamo").setLevel(logging.ERROR)
    cases = _cases(args)

    start = time.perf_counter()
    load_start = os.getloadavg()
    counts = {case.threads for case, _, _ in cases}  # run_case sets each case's own
    threads = counts.pop() if len(counts) == 1 else None
    if threads is not None:
        torch.set_num_threads(threads)
    header = host_header(threads)
    print("\n".join(header), flush=True)
    results = []
    for case, reps, rounds in cases:
        args.repeats, args.rounds = reps, rounds
        results.append(run_case(case, args))
    plan = "; ".join(
        f"{c.name}: {rounds} round(s) x {reps} timed calls" for c, reps, rounds in cases
    )
    text = render(
        results, sys.argv[1:], time.perf_counter() - start, header, load_start, args.warmup, plan
    )
    write_report(args.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

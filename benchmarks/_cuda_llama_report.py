"""cuda_llama.py's report: a path's one-line summary as it is measured, and the markdown
table of every row and path.

Imported by benchmarks/cuda_llama.py (which puts this folder on ``sys.path`` first).
"""

from __future__ import annotations

import shlex
from typing import Any


def summary(r: dict[str, Any]) -> str:
    if "skipped" in r:
        return f"skipped ({r['skipped']})"
    s = f"{r['ms']:8.3f} ms  compile {r['compile_s']:5.1f} s"
    if "host_us_per_call" in r:
        s += f"  host {r['host_us_per_call']:.0f} us, {r['kernels_per_call']:.0f} kernels"
    if r.get("ro_ms") is not None:
        s += f"  reduce-overhead {r['ro_ms']:.3f} ms (skips {r['ro_skips']})"
    elif r.get("ro_note"):
        s += f"  {r['ro_note']}"
    if r.get("graph_ms") is not None:
        s += f"  graph {r['graph_ms']:.3f} ms"
    elif r.get("graph_note"):
        s += f"  graph: {r['graph_note']}"
    if "cosine_vs_bf16_eager" in r:
        s += f"  cos {r['cosine_vs_bf16_eager']:.5f}"
    if "greedy_agreement" in r:
        s += f"  greedy {r['greedy_agreement']:.3f}"
    for name, us in r.get("gpu_us_by_kernel", []):
        s += f"\n      {us:9.1f} us  {name}"
    return s


def _ms(r: dict[str, Any], key: str) -> str:
    v = r.get(key)
    return f"{v:.3f}" if isinstance(v, float) else "-"


def _paired(r: dict[str, Any]) -> str:
    """BF16 Inductor's time over the path's, round by round (each round times both paths
    within a second, so a swing of the shared host's speed between minutes cancels): median
    [lowest-highest] of the rounds, without CUDA graphs (with)."""
    out = []
    for key in ("ms", "graph_ms"):
        q = r.get(f"{key}_round_ratio_vs_bf16_inductor")
        if q:
            out.append(f"{q[1]:.2f}x [{q[0]:.2f}-{q[2]:.2f}]")
    if len(out) == 2:
        return f"{out[0]} ({out[1]})"
    return out[0] if out else ""


def _row_line(row: str, path: str, r: dict[str, Any], base: dict[str, Any]) -> str:
    speed = ""
    if path not in ("bf16_inductor", "bf16_eager") and "ms" in base:
        speed = f"{base['ms'] / r['ms']:.2f}x"
        if r.get("graph_ms") and base.get("graph_ms"):
            speed += f" ({base['graph_ms'] / r['graph_ms']:.2f}x)"
        if r.get("ro_ms") and base.get("ro_ms"):
            speed += f" [{base['ro_ms'] / r['ro_ms']:.2f}x]"
    ro = _ms(r, "ro_ms") if r.get("ro_ms") else (r.get("ro_note") or "-")
    if r.get("ro_skips"):
        ro += f" (Inductor skipped CUDA graphs {r['ro_skips']}x)"
    host = f"{r['host_us_per_call']:.0f}" if "host_us_per_call" in r else "-"
    kern = f"{r['kernels_per_call']:.0f}" if "kernels_per_call" in r else "-"
    graph = _ms(r, "graph_ms") if r.get("graph_ms") else (r.get("graph_note") or "-")
    return (
        f"| {row} | {path} | {_ms(r, 'ms')} | {graph} | {ro} | {speed} | {_paired(r)} "
        f"| {host} | {kern} "
        f"| {r['compile_s']:.1f} | {r.get('cosine_vs_bf16_eager', 1.0):.5f} | "
        f"{r.get('greedy_agreement', '')} |"
    )


def markdown(res: dict[str, Any]) -> str:
    lines = [
        f"# Llama end to end on {res['device']}: BF16 Inductor vs torchao int8 vs pdlkit int8",
        "",
        f"Written by `benchmarks/cuda_llama.py {shlex.join(res['argv'])}` (torch {res['torch']}, "
        f"Triton {res['triton']}, transformers {res['transformers']}, torchao "
        f"{res['torchao']}). {res['machine']}",
        *[
            f"Rows not run again come from `cuda_llama.py {shlex.join(e['argv'])}` on "
            f"{e['device']} {e['machine']}"
            for e in res.get("earlier", [])
        ],
        "",
        f"transformers `LlamaModel`, 2 decoder layers, config {res['config']} "
        f"({res['sizes']}), random weights, BF16 activations; decode rows: one token per "
        f"sequence over a static KV cache of {res['ctx']} tokens. Medians of "
        "`triton.testing.do_bench` (ms), then timed again once a row's paths are compiled: "
        f"{res.get('rounds', 21)} rounds, the paths round-robin, 30 back-to-back calls each, "
        "the median of the rounds "
        "(rows of runs before 2026-11-24 15:00 timed each path once, one after the other); "
        "`graph` = the compiled call captured in a CUDA graph "
        'and replayed; `reduce-overhead` = compiled with `mode="reduce-overhead"` (Inductor\'s '
        "CUDA graph trees; for pdlkit through `pdlkit.optimize(..., mode=...)`). Host us / call: "
        "back-to-back calls without waiting for the GPU; kernels / call: torch.profiler. "
        "Cosine: last hidden state against BF16 eager; greedy: agreement of the next token under "
        "a random 32000-word head (one per sequence of the row). `vs BF16 Inductor` divides "
        "the medians; `per round` divides BF16 Inductor's time by the path's in each round "
        "(the two timed within a second of each other) and gives the median [lowest-highest] "
        "of those ratios: without CUDA graphs a decode step is host-bound, and the shared "
        "host's speed swings by up to 2x between minutes, which the medians of separate "
        "paths carry and the per-round ratio cancels.",
        "",
        "| row | path | ms | graph ms | reduce-overhead ms | vs BF16 Inductor: ms (graph) [reduce-overhead] "
        "| per round: ms (graph) | host us / call | kernels / call | compile s | cosine | greedy |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row, paths in res["rows"].items():
        base = paths.get("bf16_inductor", {})
        for path, r in paths.items():
            if "skipped" in r:
                lines.append(f"| {row} | {path} | skipped: {r['skipped']} | | | | | | | | | |")
                continue
            lines.append(_row_line(row, path, r, base))
    subs = [
        f"- {row}, {path}: {p[path]['kernels']}; runner calls {p[path]['runner_calls']}"
        f"; undone by the whole-graph timing {p[path].get('undone', '-')}"
        for row, p in res["rows"].items()
        for path in ("pdlkit_int8", "pdlkit_torchao_int8", "pdlkit_torchao_w8", "pdlkit_bf16")
        if "kernels" in p.get(path, {})
    ]
    if subs:
        lines += ["", "pdlkit's substitutions (kernel: sites) and calls through its runner:", ""]
        lines += subs
    notes = [r.get("graph_note") for p in res["rows"].values() for r in p.values()]
    lines += ["", *sorted({f"- {n}" for n in notes if n})]
    return "\n".join(lines) + "\n"

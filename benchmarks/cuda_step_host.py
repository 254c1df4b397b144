"""Where a compiled Llama decode step spends its host time: BF16 Inductor against pdlkit int8.

Run on a GPU machine, beside ``cuda_llama.py`` (same model, same decode step):

    python benchmarks/cuda_step_host.py [--config llama3-gqa] [--rows 'decode 1' ...] [--out DIR]

For each row and path (compiled as ``cuda_llama.py`` compiles it):

- host us / step: back-to-back calls without waiting for the GPU, the paths interleaved
  (``measure.interleaved``, 15 rounds of 50 calls), and the GPU time of the step (a CUDA
  graph of it replayed), so that "host-bound" is a measured statement;
- kernels / step and the CPU-side ops torch.profiler sees (self CPU time per step);
- cProfile of 100 steps: the Python functions that take the host time (tottime per step),
  which names Inductor's generated ``call``, its launchers, pdlkit code if any runs per call;
- host us per launch of each Triton kernel (``launch_costs``: Inductor's ``CachingAutotuner.run``
  timed, a timer of about 1 us included in each), Inductor's own kernels against pdlkit's
  (user-defined ones): issue 23 asks pdlkit's at most 5 us over Inductor's.

``pdlkit_int8_qres``: pdlkit int8 with ``patterns/cuda/quant_residual.pdl.mlir`` enabled
(the per-token quantization inside the o- and down-projection GEMMs for one row).

Writes ``cuda_step_host_<config>.md`` (and ``.json``) under ``--out``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cuda_llama as cl  # noqa: E402  benchmarks/cuda_llama.py
from measure import interleaved  # noqa: E402

PATHS = ["bf16_inductor", "pdlkit_int8", "pdlkit_int8_static_launch", "pdlkit_int8_qres"]
_QRES = ("int8_dynamic.pdl.mlir", "llama.pdl.mlir", "quant_residual.pdl.mlir")


def qres_patterns() -> str:
    """A folder with the shipped CUDA patterns, quant_residual.pdl.mlir enabled too."""
    import tempfile

    import pdlkit.patterns

    shipped = Path(pdlkit.patterns.__file__).parent / "cuda"  # the installed pdlkit's
    out = Path(tempfile.mkdtemp(prefix="qres_"))
    for f in _QRES:
        (out / f).write_text((shipped / f).read_text())
    entries = "".join(f"  - file: {f}\n    targets: [cuda]\n" for f in _QRES)
    (out / "int8.yaml").write_text(f"version: 1\npatterns:\n{entries}")
    return str(out)


def compile_path(path: str, runner: Any) -> Any:
    if path != "pdlkit_int8_qres":
        return cl.compile_path(path, runner, "cuda")
    import pdlkit

    return pdlkit.optimize(runner, dynamic=False, patterns=qres_patterns())


def launch_costs(fn: Any, calls: int = 200) -> list[tuple[str, float, float, bool]]:
    """Each Triton kernel's host us per launch (Inductor's ``CachingAutotuner.run``, timed
    around), launches per call and whether it is user-defined (pdlkit's), most costly first."""
    import time

    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    acc: dict[str, list[Any]] = {}
    run = CachingAutotuner.run

    def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter_ns()
        out = run(self, *args, **kwargs)
        a = acc.setdefault(self.inductor_meta.get("kernel_name", "?"), [0, 0, self])
        a[0] += time.perf_counter_ns() - t0
        a[1] += 1
        return out

    CachingAutotuner.run = timed  # type: ignore[method-assign]
    try:
        for _ in range(calls):
            fn()
    finally:
        CachingAutotuner.run = run  # type: ignore[method-assign]
    torch.cuda.synchronize()
    rows = [
        (name, ns / n / 1e3, n / calls, getattr(k.heuristic_type, "name", "") == "USER_AUTOTUNE")
        for name, (ns, n, k) in acc.items()
    ]
    return sorted(rows, key=lambda r: -r[1])


def profiled_ops(
    fn: Any, calls: int = 20, top: int = 15
) -> tuple[float, list[tuple[str, float, float]]]:
    """Kernels per call and the ``top`` CPU-side ops by self CPU time: (name, us / call, count / call)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    kernels = sum(1 for e in prof.events() if e.device_type.name == "CUDA")
    rows = [
        (e.key[:70], e.self_cpu_time_total / calls, e.count / calls)
        for e in prof.key_averages()
        if e.self_cpu_time_total > 0
    ]
    rows.sort(key=lambda r: -r[1])
    return kernels / calls, rows[:top]


def python_profile(fn: Any, calls: int = 100, top: int = 25) -> str:
    """cProfile of ``calls`` steps, the ``top`` functions by total time (the stats' text)."""
    torch.cuda.synchronize()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(calls):
        fn()
    pr.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(top)
    return s.getvalue()


def gpu_us(fn: Any) -> float | None:
    replay, _ = cl.graph_replay(fn)
    return cl.bench_ms(replay, "cuda") * 1e3 if replay else None


def measure(row: str, models: dict[str, Any], ctx: int, paths: list[str]) -> dict[str, Any]:
    kind, batch, seq = cl.parse_row(row)
    g = torch.Generator(device="cuda").manual_seed(2)
    ids = torch.randint(0, cl.VOCAB, (batch, seq), generator=g, device="cuda")
    kv = cl.make_kv(models["bf16_inductor"], batch, ctx, "cuda") if kind == "decode" else None
    fns: dict[str, Any] = {}
    out: dict[str, Any] = {}
    for path in paths:
        torch._dynamo.reset()
        fn = compile_path(path, cl.runner_for(kind, models[path], kv))
        with torch.no_grad():
            fn(ids)
            torch.cuda.synchronize()
        fns[path] = fn
    with torch.no_grad():
        for path, fn in fns.items():
            r: dict[str, Any] = {"gpu_us": gpu_us(lambda fn=fn: fn(ids))}
            r["kernels"], r["cpu_ops"] = profiled_ops(lambda fn=fn: fn(ids))
            r["python"] = python_profile(lambda fn=fn: fn(ids))
            r["launches"] = launch_costs(lambda fn=fn: fn(ids))
            out[path] = r

        def window(fn: Any) -> Any:
            def run() -> None:
                torch.cuda.synchronize()
                for _ in range(50):
                    fn(ids)

            return run

        per = interleaved({p: window(f) for p, f in fns.items()}, 15, 1)
    for path, ts in per.items():
        out[path]["host_us"] = statistics.median(ts) / 50 * 1e6
    return out


def report(res: dict[str, Any]) -> str:
    lines = [f"# Host time of a compiled decode step on {res['device']}", "", res["machine"], ""]
    lines += [
        f"`cuda_step_host.py {' '.join(res['argv'])}`; Inductor config: {res['inductor_config']}",
        "",
    ]
    lines += [
        "| row | path | host us / step | GPU us / step (graph) | kernels / step |",
        "|---|---|---|---|---|",
    ]
    for row, paths in res["rows"].items():
        for p, r in paths.items():
            gpu = f"{r['gpu_us']:.0f}" if r["gpu_us"] else "-"
            lines.append(f"| {row} | {p} | {r['host_us']:.0f} | {gpu} | {r['kernels']:.0f} |")
    lines += launch_summary(res)
    for row, paths in res["rows"].items():
        for p, r in paths.items():
            lines += ["", f"## {row}, {p}: host us per Triton launch (count / step)", ""]
            lines += [
                f"- {n}{' (user-defined)' if user else ''}: {us:.1f} us, {c:.0f}x"
                for n, us, c, user in r["launches"]
            ]
            lines += ["", f"## {row}, {p}: CPU-side ops (self us / step, count / step)", ""]
            lines += [f"- {n}: {us:.1f} us, {c:.1f}x" for n, us, c in r["cpu_ops"]]
            lines += ["", "```", r["python"].strip(), "```"]
    return "\n".join(lines) + "\n"


def launch_summary(res: dict[str, Any]) -> list[str]:
    """Per row and path: the median host us per launch of Inductor's own Triton kernels and
    the slowest of the user-defined ones (pdlkit's), from ``launch_costs``."""
    lines = [
        "",
        "| row | path | Inductor's kernels: median us / launch | user-defined: max us / launch |",
    ]
    lines.append("|---|---|---|---|")
    for row, paths in res["rows"].items():
        for p, r in paths.items():
            own = [us for _, us, _, user in r["launches"] if not user]
            user = [us for _, us, _, u in r["launches"] if u]
            med = f"{statistics.median(own):.1f}" if own else "-"
            lines.append(
                f"| {row} | {p} | {med} | {max(user):.1f} |"
                if user
                else f"| {row} | {p} | {med} | - |"
            )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="llama3-gqa", choices=sorted(cl.CONFIGS))
    ap.add_argument("--rows", nargs="*", default=["decode 1", "decode 16"])
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--paths", nargs="*", default=PATHS[:2], choices=PATHS)
    ap.add_argument("--inductor-config", nargs="*", default=[], metavar="KEY=VALUE")
    ap.add_argument("--out", default="benchmarks/results")
    a = ap.parse_args()
    import pdlkit.backend  # noqa: F401  as a script using pdlkit imports it: before any compile

    res_config = cl.set_inductor_config(a.inductor_config)
    from machine import host_header

    res: dict[str, Any] = {"argv": sys.argv[1:], "device": torch.cuda.get_device_name()}
    res["machine"] = " ".join(host_header())
    res["torch"], res["inductor_config"] = torch.__version__, res_config
    model = cl.build_model(a.config, "cuda")
    ids = torch.randint(0, cl.VOCAB, (1, 16), device="cuda")
    models = {"bf16_inductor": model, **cl.quantized_copies(model, ids, [*a.paths, "pdlkit_int8"])}
    models["pdlkit_int8_qres"] = models.get("pdlkit_int8")
    res["rows"] = {row: measure(row, models, a.ctx, a.paths) for row in a.rows}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"cuda_step_host_{a.config}.json").write_text(json.dumps(res, indent=1, default=str))
    text = report(res)
    (out / f"cuda_step_host_{a.config}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()

"""Do the sites' timings predict the whole graph? (issue 21: the first compile's cost)

    python benchmarks/x86_site_savings.py                  # bert-mini, GPT-2, Llama, ViT x 4 dtypes
    python benchmarks/x86_site_savings.py --cases llama:int8-dynamic,vit:int8-static --threads 2
    python benchmarks/x86_site_savings.py --cases bert-mini:bf16 --threads 16 --retime 8

The whole-graph check (``pdlkit/matcher/graph_guard.py``) leaves Inductor's graph uncompiled
where the sites' own timings save at least ``CONFIDENT`` (15%) of the substituted graph's time:
that compile is most of a first compile's cost (``first_compile_split.py``). This script asks
whether a lower threshold would be safe. For each model and dtype (``x86_models.py``'s, random
weights) it compiles with ``pdlkit.optimize`` (the default mode, caches cold) with the threshold
out of reach, so Inductor's graph is always compiled and timed, and prints the sites' predicted
saving (``report.sites_saved_us``, as a share of the graph that ran) next to the gain the check
measured (Inductor's graph against the graph with substitutions that was timed first). A row
whose prediction is at or over a threshold while its measured gain is negative is a model that
threshold would have made slower.

``--retime N``: once the model is compiled, the graphs the check timed (the very callables it
ran) are timed again, N alternating windows of three calls each, medians in the last column:
whether the check's verdict holds outside the compile (seen on a 16-core Xeon with AMX:
bert-mini BF16's graph of AMX kernels measured 1.25x Inductor's in the check, while the same
kernels without the check ran 0.72x the peer in x86_models.py); with it, the same graphs are
also timed the check's way right after its rounds, still inside the compile (``inside``), and
the process's Python threads, OS threads (and those busy while it sleeps), child processes,
garbage-collector counts and load are printed inside and after the compile. ``--no-gc``: every timed call with the garbage collector off.
``--static``: static priority's graph is a candidate wherever it differs, ties included.
``--settle S``: with ``--retime``, the graphs timed again every quarter second for S seconds
inside the compile and after it (three calls each, alternating): whether the kernels' graph
speeds up with time inside the compile as it does after it.
With ``--retime`` the graphs' page faults and context switches per call are printed right
after the check's rounds (before any pause) and after the compile.
``--pause S``: the check's rounds start after a pause of S seconds; ``--pause-each S``: every
timed sample (the sites', the check's, and those timed again) after a pause of S seconds
(whether pauses undo the under-read seen on the Xeon, results/x86_site_savings_xeon16_t16_bf16
_settle_74a8e7d.md).
``--model-after S``: with ``--retime``, the compiled model called for S seconds more, then
timed in windows beside the check's graphs (whether a verdict looked at again after the compile,
graph_guard.LaterLook, took the faster graph), with pdlkit's counters. Inside the compile each
graph is also timed the check's way alone (no other graph between its samples).
``--profile N``: with ``--retime``, each graph's N calls under cProfile inside the compile and
after it, the functions with the most own time printed side by side (where the time of the
kernels' graph goes inside the compile).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _x86_models_build import build, prepare  # noqa: E402
from machine import host_header  # noqa: E402
from measure import interleaved, write_report  # noqa: E402
from pdlkit.matcher import choose as site_choice  # noqa: E402
from x86_models import cold_caches  # noqa: E402

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "x86_site_savings.md"
CASES = [f"{m}:{d}" for m in ("bert-mini", "gpt2", "llama", "vit")
         for d in ("fp32", "bf16", "int8-static", "int8-dynamic")]  # fmt: skip


def one_case(case: str, opts: argparse.Namespace | None = None) -> dict[str, Any]:
    """Compile ``case`` ("model:dtype") from cold caches with Inductor's graph always timed;
    the sites' saving and the check's timings (and with ``opts.retime``, theirs after
    compiling; ``opts``: the command line's options, see the module's docstring)."""
    o = opts or _parser().parse_args([])
    retime, static, profile, settle, pause = o.retime, o.static, o.profile, o.settle, o.pause
    from pdlkit.matcher import graph_guard, hedges
    from pdlkit.runtime_abi import autotune

    import pdlkit

    name, dtype = case.split(":")
    model, x = prepare(*build(name), dtype)
    seen: dict[str, Any] = {}
    original, confident = graph_guard.choose, graph_guard.CONFIDENT

    def choose(key: str, sub: Any, ind: Any, ex: Any, mode: str, saved_us: Any = None,
               **kw: Any) -> Any:  # fmt: skip
        out = original(key, sub, ind, ex, mode, saved_us, **kw)
        seen.update(saved=saved_us, choice=out[0], timings={t.name: t.us for t in out[2].timings})
        print("check's rounds (ms):", _read(out[2].timings), flush=True)
        return out

    original_rounds = graph_guard._rounds

    def rounds(runs: Any, *args: Any, **kw: Any) -> Any:  # the check's calls of the graphs
        if kw.get("first"):  # the look after the compile (graph_guard.LaterLook)
            out = original_rounds(runs, *args, **kw)
            print("the look after the compile's rounds (ms):", _read(out[0]), flush=True)
            return out
        seen["runs"] = list(runs)
        time.sleep(pause)  # --pause: the check's rounds after a pause
        out = original_rounds(runs, *args)
        if retime:  # the same graphs again the check's way, still inside the compile
            seen.update(_inside(runs, profile, settle))
        return out

    graph_guard.choose, graph_guard.CONFIDENT = choose, float("inf")
    graph_guard._rounds = rounds
    original_account = _sum_kernels(seen)
    original_sample = autotune._sample
    if o.no_gc:  # every timed call with the garbage collector off
        autotune._sample = _without_gc(original_sample)
    if o.pause_each:  # a pause before every timed sample
        autotune._sample = _paused(autotune._sample, o.pause_each)
    differs = hedges.Stakes.static_differs
    if static:  # static priority's graph a candidate wherever it differs, ties included
        hedges.Stakes.static_differs = property(lambda self: self.static_apart)
    torch._dynamo.reset()
    try:
        with cold_caches(dtype):
            compiled = pdlkit.optimize(model)
            compiled(x)
            if retime and seen.get("runs"):
                if settle:  # first: from the compile's end
                    _settling("after the compile", seen["runs"], settle)
                seen.update(_retimed(seen["runs"], lambda: compiled(x), retime))
                if o.model_after:
                    _model_after(seen["runs"], lambda: compiled(x), o.model_after)
                if profile:
                    _print_profiles(
                        seen.pop("profile inside", {}), _profiled(seen["runs"], profile)
                    )
    finally:
        graph_guard.choose, graph_guard.CONFIDENT = original, confident
        graph_guard._rounds = original_rounds
        site_choice.Tuner._account = original_account
        autotune._sample = original_sample
        hedges.Stakes.static_differs = differs
    seen.pop("runs", None)
    return {"case": case, **seen}


def _sum_kernels(seen: dict[str, Any]) -> Any:
    """Sum, into ``seen["kernels"]``, the timings of the kernels at the sites whose saving
    the check counts (choose.Tuner._account), each timed alone as the sites are; return the
    original ``_account`` to put back."""
    original = site_choice.Tuner._account

    def account(self: Any, decision: Any, dynamic: bool = False) -> None:
        original(self, decision, dynamic)
        if self.saved_us is None or dynamic or decision.choice == site_choice.KEEP:
            return
        us = {t.name: t.us for t in decision.timings}.get(decision.choice)
        seen["kernels"] = seen.get("kernels", 0.0) + (us or 0.0)

    site_choice.Tuner._account = account
    return original


def _inside(runs: list[Any], profile: int, settle: float) -> dict[str, Any]:
    """Inside the compile, right after the check's rounds: the context, the graphs timed
    again the check's way, and with ``profile`` / ``settle`` their profiles and samples."""
    from pdlkit.matcher import graph_guard

    print("inside the compile, per call:", _faults(runs), flush=True)  # before any pause
    print("inside the compile:", _context(), flush=True)
    out: dict[str, Any] = {"inside": {t.name: t.us for t in graph_guard._measure(runs, "cpu")}}
    alone = {n: graph_guard._measure([(n, fn)], "cpu", lambda f: False)[0].us for n, fn in runs}
    print("inside the compile, each graph's rounds alone (us):", alone, flush=True)
    if profile:
        out["profile inside"] = _profiled(runs, profile)
    if settle:
        _settling("inside the compile", runs, settle)
    return out


def _without_gc(sample: Any) -> Any:
    """``autotune._sample`` with the garbage collector off while it times."""

    def without(*args: Any, **kw: Any) -> Any:
        on = gc.isenabled()
        gc.disable()
        try:
            return sample(*args, **kw)
        finally:
            if on:
                gc.enable()

    return without


def _paused(sample: Any, seconds: float) -> Any:
    """``autotune._sample`` after a pause of ``seconds``."""

    def paused(*args: Any, **kw: Any) -> Any:
        time.sleep(seconds)
        return sample(*args, **kw)

    return paused


def _retimed(runs: list[Any], model: Any, windows: int) -> dict[str, dict[str, float]]:
    """The check's graphs (``runs``: its (name, call) pairs) and the compiled model's call,
    timed after the compile: medians of alternating windows of three calls, and the graphs
    timed again the check's own way (graph_guard._measure)."""
    from pdlkit.matcher import graph_guard

    print("after the compile, per call:", _faults(runs), flush=True)
    print("after the compile:", _context(), flush=True)
    per_call = interleaved({**dict(runs), "compiled model": model}, windows, 3)
    print("windows (ms):", {n: _ms(ts) for n, ts in per_call.items()}, flush=True)
    again = graph_guard._measure(runs, "cpu")
    return {
        "retimed": {n: statistics.median(ts) * 1e6 for n, ts in per_call.items()},
        "remeasured": {t.name: t.us for t in again},
    }


def _is(o: Any, cls: type) -> bool:
    """isinstance, false for a weak proxy whose object is gone (gc lists those too)."""
    try:
        return isinstance(o, cls)
    except ReferenceError:
        return False


def _ms(seconds: Any) -> list[float]:
    """Seconds as milliseconds to two places, for printing."""
    return [round(v * 1e3, 2) for v in seconds]


def _read(timings: list[Any]) -> dict[str, list[float]]:
    """Each graph's rounds (ms), as the check read them."""
    return {t.name: _ms(t.rounds or []) for t in timings}


def _model_after(runs: list[Any], model: Any, seconds: float) -> None:
    """The compiled model called back to back for ``seconds`` (a whole-graph verdict looked at
    again after the compile takes its look in one of these calls: graph_guard.LaterLook),
    then timed in windows beside the check's graphs; prints the windows and the counters."""
    import pdlkit

    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        model()
    per_call = interleaved({**dict(runs), "compiled model": model}, 6, 3)
    windows = {n: _ms(ts) for n, ts in per_call.items()}
    print(f"{seconds:g} s after the compile, windows (ms):", windows, flush=True)
    from pdlkit.matcher import graph_guard

    looks = [o for o in gc.get_objects() if _is(o, graph_guard.LaterLook)]
    print("looks after the compile:", [{"taken": not o._fns, "runs": o.decision.choice,
          "verdict": o.decision.describe()} for o in looks], flush=True)  # fmt: skip
    st = pdlkit.stats()
    keys = (
        "graph_looks_due",
        "graphs_looked_at_later",
        "graph_looks_failed",
        "substitutions_undone",
        "kernel_calls",
    )
    print("stats:", {k: v for k, v in st.items() if k in keys}, flush=True)


def _faults(runs: list[Any], calls: int = 10) -> dict[str, dict[str, float]]:
    """Per call of each graph (``calls`` back to back): ms, and the process's minor page
    faults and voluntary / involuntary context switches (all its threads: getrusage), as
    a graph that allocates fresh buffers each call pays for them (glibc's mmap'd chunks)."""
    import resource

    out = {}
    for name, fn in runs:
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        for _ in range(calls):
            fn()
        t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
        out[name] = {
            "ms": round((t1 - t0) / calls * 1e3, 2),
            "minor faults": round((r1.ru_minflt - r0.ru_minflt) / calls, 1),
            "voluntary switches": round((r1.ru_nvcsw - r0.ru_nvcsw) / calls, 1),
            "involuntary switches": round((r1.ru_nivcsw - r0.ru_nivcsw) / calls, 1),
        }
    return out


def _settling(where: str, runs: list[Any], seconds: float) -> None:
    """Every quarter second for ``seconds``: one window of three calls of each graph, in
    turn (measure.interleaved), their time per call printed in ms with the time since the
    first."""
    start, rows = time.perf_counter(), []
    while (now := time.perf_counter()) - start < seconds:
        window = interleaved(dict(runs), 1, 3)
        rows.append(
            " ".join(
                [f"{now - start:5.2f}s"] + [f"{n} {t[0] * 1e3:.2f}" for n, t in window.items()]
            )
        )
        time.sleep(max(0.0, 0.25 - (time.perf_counter() - now)))
    print(f"settling {where} (ms):", *rows, sep="\n  ", flush=True)


def _profiled(runs: list[Any], calls: int) -> dict[str, dict[str, tuple[int, float]]]:
    """Each graph's ``calls`` calls under cProfile: function -> (calls, own seconds)."""
    import cProfile
    import pstats

    out = {}
    for name, fn in runs:
        fn()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(calls):
            fn()
        prof.disable()
        stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
        out[name] = {f"{Path(f).name}:{line}({fn_name})": (int(cc[1]), float(cc[2]))
                     for (f, line, fn_name), cc in stats.items()}  # fmt: skip
    return out


def _print_profiles(inside: dict[str, Any], after: dict[str, Any], top: int = 14) -> None:
    """The functions with the most own time inside the compile, beside their time after it."""
    for name, prof in inside.items():
        later = after.get(name, {})
        print(f"profile of {name}: own ms inside / after the compile (calls)")
        print(f"  total {sum(v[1] for v in prof.values()) * 1e3:.1f} / "
              f"{sum(v[1] for v in later.values()) * 1e3:.1f}")  # fmt: skip
        for fn, (n, own) in sorted(prof.items(), key=lambda kv: -kv[1][1])[:top]:
            print(f"  {own * 1e3:8.2f} / {later.get(fn, (0, 0.0))[1] * 1e3:8.2f}  ({n})  {fn}")


def _context(seconds: float = 0.2) -> dict[str, Any]:
    """What else runs in this process and under it: Python threads, torch's threads, the
    process's OS threads and those that used over a tenth of a CPU in ``seconds`` while this
    thread slept, child processes and their CPU over the same ``seconds`` (psutil, where
    installed), the load average."""
    import threading

    ctx: dict[str, Any] = {"threads": sorted(t.name for t in threading.enumerate())}
    ctx["gc counts"], ctx["gc objects"] = gc.get_count(), len(gc.get_objects())
    ctx["gc generations"] = [len(gc.get_objects(g)) for g in range(3)]
    ctx["gc young ms"] = _young_collection_ms()
    ctx["torch threads"] = torch.get_num_threads()
    # what makes a pdlkit call site leave its direct path for the dispatcher (binding.py)
    ctx["observers"] = {
        "dispatch modes": torch._C._len_torch_dispatch_stack(),
        "function mode": torch._C._is_torch_function_mode_enabled(),
        "profiler": torch._C._autograd._profiler_enabled(),
        "functorch": torch._C._functorch.peek_interpreter_stack() is not None,
        "jit tracing": torch._C._get_tracing_state() is not None,
        "grad": torch.is_grad_enabled(),
    }
    ctx["load"] = os.getloadavg()[0]
    try:
        import psutil

        kids = psutil.Process().children(recursive=True)
    except ImportError:
        kids = None
    for k in kids or ():
        k.cpu_percent(None)  # the first reading starts each child's window
    before = _thread_ticks()
    time.sleep(seconds)
    after = _thread_ticks()
    clock = os.sysconf("SC_CLK_TCK")
    shares = {t: (ticks - before.get(t, (n, ticks))[1]) / clock / seconds
              for t, (n, ticks) in after.items()}  # fmt: skip
    ctx["native threads"] = len(after)
    ctx["busy native threads"] = [
        f"{after[t][0]} {t} {x:.0%}" for t, x in shares.items() if x > 0.1
    ]
    if kids is not None:
        ctx["children"] = len(kids)
        ctx["children cpu %"] = round(sum(k.cpu_percent(None) for k in kids if k.is_running()), 1)
    return ctx


def _young_collection_ms() -> list[float]:
    """What one collection of the young generations costs now, in ms: gen 0, then 0 and 1
    (what an allocation-heavy call pays every 700 / 7,000 allocations)."""
    out = []
    for g in (0, 1):
        t = time.perf_counter()
        gc.collect(g)
        out.append(round((time.perf_counter() - t) * 1e3, 2))
    return out


def _thread_ticks() -> dict[str, tuple[str, int]]:
    """This process's OS threads (OpenMP's workers among them): id -> (name, utime + stime)."""
    out = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:  # the thread ended
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        out[task.name] = (
            stat[stat.index("(") + 1 : stat.rindex(")")],
            int(fields[11]) + int(fields[12]),
        )
    return out


def row(r: dict[str, Any]) -> str:
    t = r.get("timings") or {}
    first = t.get("substituted") or t.get("kernels only")
    ind, saved, kernels = t.get("inductor"), r.get("saved"), r.get("kernels")
    pred = f"{saved / first:.1%}" if saved is not None and first else "unknown"
    own = f"{kernels / first:.1%}" if kernels is not None and first else "-"
    gain = f"{(ind - first) / first:+.1%}" if ind and first else "-"
    times = ", ".join(f"{n} {us / 1e3:.2f} ms" for n, us in t.items() if us is not None)
    saved_text = "-" if saved is None else f"{saved:.0f}"
    again = ", ".join(f"{n} {us / 1e3:.2f} ms" for n, us in r.get("retimed", {}).items())
    check = ", ".join(f"{n} {us / 1e3:.2f} ms" for n, us in r.get("remeasured", {}).items())
    inside = ", ".join(f"{n} {us / 1e3:.2f} ms" for n, us in r.get("inside", {}).items())
    return (
        f"| {r['case']} | {saved_text} | {pred} | {own} | {gain} | {r.get('choice', '-')} | {times} "
        f"| {inside or '-'} | {again or '-'} | {check or '-'} |"
    )


def _command(args: argparse.Namespace) -> str:
    """The options given, as a command line would give them (defaults left out but for the
    cases and threads; ``--out`` left out)."""
    parts = [f"--cases {args.cases}", f"--threads {args.threads}"]
    for action in _parser()._actions:
        value, flag = getattr(args, action.dest, None), action.option_strings[-1]
        if action.dest in ("help", "cases", "threads", "out") or value == action.default:
            continue
        parts.append(flag if value is True else f"{flag} {value}")
    return " ".join(parts)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(CASES), help="model:dtype, comma-separated")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--retime", type=int, default=0, help="windows to time the graphs again")
    ap.add_argument("--static", action="store_true", help="static priority's graph timed on ties")
    ap.add_argument("--no-gc", action="store_true", help="time with the garbage collector off")
    ap.add_argument("--profile", type=int, default=0, help="calls per graph under cProfile")
    ap.add_argument("--settle", type=float, default=0.0, help="seconds of quarter-second timings")
    ap.add_argument("--pause", type=float, default=0.0, help="seconds before the check's rounds")
    ap.add_argument("--pause-each", type=float, default=0.0, help="seconds before each sample")
    ap.add_argument("--model-after", type=float, default=0.0,
                    help="with --retime: seconds of model calls, then windows again")  # fmt: skip
    return ap


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    warnings.filterwarnings("ignore")
    warnings.filterwarnings("always", message="pdlkit: whole-graph check")  # the check's own
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    rows = []
    for case in args.cases.split(","):
        try:
            r = one_case(case, args)
        except Exception as e:  # a case that does not compile is said, the others go on
            r = {"case": case, "choice": f"failed: {type(e).__name__}: {str(e)[:120]}"}
        rows.append(row(r))
        print(rows[-1], flush=True)
    text = "\n".join([
        "# The sites' predicted saving against the whole-graph check's measured gain (issue 21)",
        "",
        f"Generated by `python benchmarks/x86_site_savings.py {_command(args)}` in "
        f"{time.perf_counter() - start:.0f} s (its docstring says how).",
        "",
        *host_header(args.threads),
        "",
        "`saved us`: the substituted sites' saving by their own timings (what the check compares"
        " with CONFIDENT); `predicted`: that as a share of the graph with substitutions"
        " timed first (`unknown`: a pin or a busy host's site timing); `kernels' own`: the"
        " counted sites' kernels, each timed alone as the sites are, as a share of that graph"
        " (over 100%: the sites' timings read slower than the graph they are part of);"
        " `measured`: Inductor's"
        " graph against that graph in the check (positive: the substitutions are faster);"
        " `verdict`: the graph that runs; `inside`: with `--retime`, the same graphs timed the"
        " check's way again right after its rounds, still inside the compile; `again`: the same graphs timed after"
        " the compile (medians of alternating windows), and the compiled model's call;"
        " `again, the check's way`: the same graphs after the compile, timed as the check"
        " times them (graph_guard._measure).",
        "",
        "| case | saved us | predicted | kernels' own | measured | verdict | check's medians "
        "| inside | again | again, the check's way |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
    ])  # fmt: skip
    write_report(args.out, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

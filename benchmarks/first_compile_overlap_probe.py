"""Would Inductor's out-of-process compile hide the whole-graph check's Inductor compile?
(issue 21's first-compile figure; a probe, not how pdlkit compiles)

    python benchmarks/first_compile_overlap_probe.py [--dtype fp32] [--rounds 2] [--threads 2]

The check compiles Inductor's code for Dynamo's graph beside the substituted graph, so a
first compile holds two or more Inductor compiles. Inductor can move a compile's code
generation into a child process (``TORCHINDUCTOR_FX_COMPILE_MODE=async+subprocess``: the call
returns after the in-process part, the code arrives later). This probe starts that compile of
Dynamo's graph at the beginning of pdlkit's backend call, so that the child's part runs while
pdlkit matches, tunes and compiles the substituted graph, and hands it to the check, waiting
for the child there. It times, each in a process of its own (bert-mini, cold caches, the
order rotated by round): ``inductor`` (``torch.compile``), ``plain`` (``pdlkit.optimize``) and
``overlap`` (the same with the early compile), with ``graph_guard.CONFIDENT`` set out of reach
in both pdlkit variants so that the check always compiles Inductor's graph. For ``overlap`` it
prints the early compile's in-process seconds (what stays serial) and the wait for the child.
Writes ``first_compile_overlap_probe.md`` (``--out``).
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
VARIANTS = ("inductor", "plain", "overlap")


def _async_compile(original: Any, gm: Any, inputs: list[Any]) -> Any:
    """Inductor's compile of ``gm`` with its code generation in a child process (Inductor's
    FX graph cache off: its async output code cannot be cached)."""
    import torch
    import torch._inductor.compile_fx as cfx

    cfx.fx_compile_mode, cfx.fx_compile_async = cfx.FxCompileMode.SUBPROCESS, True
    try:
        with torch._inductor.config.patch(fx_graph_cache=False):
            return original(gm, inputs)
    finally:
        cfx.fx_compile_mode, cfx.fx_compile_async = cfx.FxCompileMode.NORMAL, False


def _wait_for_children() -> None:
    """Every async compile's child done (its code in place at the next call)."""
    from torch._inductor.compile_fx_async import _AsyncOutputCode

    for o in gc.get_objects():
        try:
            if isinstance(o, _AsyncOutputCode) and o._future is not None:
                o._future.result()
        except ReferenceError:  # a weak proxy whose object is gone
            continue


def _early_compile(seen: dict[str, float]) -> None:
    """pdlkit's backend starts Inductor's compile of Dynamo's graph first; the check's
    compile of that graph takes it."""
    import torch._inductor.compile_fx as cfx

    from pdlkit import backend

    original, call = cfx.compile_fx, backend.PdlkitBackend.__call__
    stash: dict[str, Any] = {}

    def early(self: Any, gm: Any, example_inputs: list[Any], *a: Any, **kw: Any) -> Any:
        t = time.perf_counter()
        stash["gm"], stash["fn"] = gm, _async_compile(original, copy.deepcopy(gm), example_inputs)
        seen["in-process part s"] = time.perf_counter() - t
        return call(self, gm, example_inputs, *a, **kw)

    def compile_fx(gm: Any, inputs: list[Any], **kw: Any) -> Any:
        if stash.get("gm") is gm and "fn" in stash:
            t = time.perf_counter()
            _wait_for_children()
            seen["wait s"] = time.perf_counter() - t
            return stash.pop("fn")
        return original(gm, inputs, **kw)

    backend.PdlkitBackend.__call__ = early  # type: ignore[method-assign]
    cfx.compile_fx = compile_fx  # type: ignore[assignment]


def child(variant: str, dtype: str, threads: int) -> dict[str, Any]:
    """One variant's first compile, in this process; its seconds and what it saw."""
    import torch
    import torch._inductor.compile_fx as cfx
    from _x86_models_build import build, prepare
    from pdlkit.matcher import graph_guard
    from x86_models import inductor_cache

    import pdlkit

    torch.set_num_threads(threads)
    model, x = prepare(*build("bert-mini"), dtype)
    tmp = tempfile.mkdtemp()
    os.environ["PDLKIT_CACHE_DIR"] = os.path.join(tmp, "decisions")
    graph_guard.CONFIDENT = float("inf")  # the check always compiles Inductor's graph
    warm = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU())
    with inductor_cache(os.path.join(tmp, "warm")), torch.no_grad():  # one-time costs, and
        torch.compile(warm)(torch.randn(8, 64))  # the child process pool started
        _async_compile(cfx.compile_fx, torch.fx.symbolic_trace(warm), [torch.randn(8, 64)])
        _wait_for_children()
    seen: dict[str, float] = {}
    if variant == "overlap":
        _early_compile(seen)
    torch._dynamo.reset()
    gc.collect()
    make = torch.compile if variant == "inductor" else pdlkit.optimize
    with inductor_cache(os.path.join(tmp, "cold")), torch.no_grad():
        t = time.perf_counter()
        make(model)(x)
        seen["first compile s"] = time.perf_counter() - t
    return seen


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(child(a.child, a.dtype, a.threads)))
        return 0
    from machine import host_header
    from measure import write_report

    runs: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    for r in range(a.rounds):
        for v in VARIANTS[r % 3 :] + VARIANTS[: r % 3]:
            cmd = [sys.executable, __file__, "--child", v, "--dtype", a.dtype,
                   "--threads", str(a.threads)]  # fmt: skip
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            runs[v].append(json.loads(out.strip().splitlines()[-1]))
            print(v, runs[v][-1], flush=True)
    base = statistics.median(s["first compile s"] for s in runs["inductor"])
    rows = []
    for v in VARIANTS:
        cells = {k: statistics.median(s[k] for s in runs[v]) for k in runs[v][0]}
        rows.append(
            f"| {v} | {cells['first compile s']:.2f} | {cells['first compile s'] / base:.2f}x | "
            f"{cells.get('in-process part s', float('nan')):.2f} | "
            f"{cells.get('wait s', float('nan')):.2f} |"
        )
    text = "\n".join([
        "# First compile with the check's Inductor compile started early, out of process",
        "",
        f"`python benchmarks/first_compile_overlap_probe.py --dtype {a.dtype} --rounds "
        f"{a.rounds} --threads {a.threads}` (bert-mini; the module docstring says how).",
        "",
        *host_header(a.threads),
        "",
        "| variant | first compile s (median) | / Inductor | early compile's in-process s "
        "| wait for the child s |",
        "|---|---|---|---|---|",
        *rows,
        "",
    ])  # fmt: skip
    write_report(a.out / "first_compile_overlap_probe.md", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

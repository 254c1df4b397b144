"""Is the sweep of the sites' library calls a lower bound of Inductor's graph? (issue 21)

    python benchmarks/x86_library_sweep.py --cases bert-mini:fp32,bert-mini:bf16 --threads 16

The whole-graph check believes a saving as large as the substituted graph's time only where
the sites' library calls (the least Inductor's graph runs at them), run one after another,
take ``CONFIDENT`` more than that graph (``pdlkit/matcher/graph_guard.py``, ``BELIEVABLE``):
then Inductor's graph is not compiled. That holds only if the sweep never reads more than
Inductor's whole graph takes. For each case (``x86_models.py``'s models and dtypes, random
weights, caches cold) this compiles the model with ``pdlkit.optimize`` and, inside the check,
sweeps every case's library calls (``matcher/lowered.py``'s ``SWEEPS`` sweeps, the least taken, whatever the saving);
then compiles it with Inductor alone and times both compiled models in alternating windows.

Columns: ``sweep`` the least sweep; ``substituted`` the substituted graph's time inside the
check; ``saved`` the sites' saving; ``why`` the check's reason to skip Inductor's graph (``-``:
none, Inductor's graph was compiled and timed); ``pdlkit`` / ``inductor`` the compiled models'
medians (a compiled model's call adds Dynamo's guards to its graph's time: about 0.4 ms on the
16-core Xeon at 16 threads); ``sweep / inductor``: at or over 1.0, the sweep is not a lower
bound there.
"""

from __future__ import annotations

import argparse
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
from measure import interleaved, md_table, write_report  # noqa: E402
from x86_models import cold_caches  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "x86_library_sweep.md"


def one_case(case: str, windows: int) -> list[Any]:
    """One row: the sweep, the check's view, and both compiled models' medians (ms)."""
    from pdlkit.matcher import graph_guard, lowered

    import pdlkit

    name, dtype = case.split(":")
    model, x = prepare(*build(name), dtype)
    seen: dict[str, Any] = {}
    original = graph_guard._confident

    def confident(run: Any, device: str, saved: Any, first: str = "", calls: Any = ()) -> Any:
        seen["sweep"] = lowered.swept(calls, float("inf"), 60.0) if calls else None
        why, timings = original(run, device, saved, first, calls)
        seen.update(saved=saved, why=why, sub=timings[0].us if timings else None)
        return why, timings

    graph_guard._confident = confident
    torch._dynamo.reset()
    try:
        with cold_caches(dtype):
            ours = pdlkit.optimize(model)
            ours(x)
            theirs = torch.compile(model)
            theirs(x)
            for _ in range(3):
                ours(x), theirs(x)
            per_call = interleaved({"pdlkit": lambda: ours(x), "inductor": lambda: theirs(x)},
                                   windows, 3)  # fmt: skip
    finally:
        graph_guard._confident = original
    ms = {k: statistics.median(v) * 1e3 for k, v in per_call.items()}
    sweep, sub = seen.get("sweep"), seen.get("sub")
    ratio = f"{sweep / 1e3 / ms['inductor']:.2f}" if sweep else "-"
    return [case, _ms(sweep), _ms(sub), _ms(seen.get("saved")), seen.get("why") or "-",
            f"{ms['pdlkit']:.2f}", f"{ms['inductor']:.2f}", ratio]  # fmt: skip


def _ms(us: float | None) -> str:
    return "-" if us is None else f"{us / 1e3:.2f} ms"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="bert-mini:fp32,bert-mini:bf16,gpt2:fp32,gpt2:bf16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    start, rows = time.perf_counter(), []
    for case in args.cases.split(","):
        try:
            rows.append(one_case(case, args.windows))
        except Exception as e:  # a case that does not compile is said, the others go on
            rows.append([case, f"failed: {type(e).__name__}: {str(e)[:100]}"] + ["-"] * 6)
        print(rows[-1], flush=True)
    head = (
        "| case | sweep | substituted | saved | why | pdlkit ms | inductor ms | sweep / inductor |"
    )
    text = "\n".join([
        "# The sites' library calls, swept, against Inductor's graph (issue 21)", "",
        f"`python benchmarks/x86_library_sweep.py --cases {args.cases} --threads {args.threads}"
        f" --windows {args.windows}` in {time.perf_counter() - start:.0f} s (the docstring"
        " says what each column is).", "",
        *host_header(args.threads), "", *md_table(head, rows), "",
    ])  # fmt: skip
    write_report(args.out, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

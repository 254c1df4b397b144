"""``pdlkit demo``: a small model compiled with the shipped patterns, against Inductor.

Prints a line as each step starts (the first before torch is imported), then a short
summary: what fired, which kernels ran, the error against eager, and pdlkit's latency as a
multiple of Inductor's (``0.90x`` = pdlkit takes 90% of Inductor's time). At most 40
lines; ``--verbose`` adds the patterns loaded and the pass's times.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections import Counter
from typing import Any

from pdlkit.runtime_abi.autotune import host_key

MAX_ERROR = 1e-3


class Steps:
    """``[2/5] compiling ... done in 3.1 s``, flushed as it happens."""

    def __init__(self, total: int):
        self.total, self.n, self.t0 = total, 0, 0.0

    def start(self, what: str) -> None:
        self.n += 1
        self.t0 = time.perf_counter()
        print(f"[{self.n}/{self.total}] {what} ...", end="", flush=True)

    def done(self, note: str = "") -> None:
        took = time.perf_counter() - self.t0
        print(f" {took:.1f} s{'; ' + note if note else ''}", flush=True)


def example() -> tuple[Any, Any]:
    """The demo's model and input: ``pdlkit explain pdlkit.demo:example`` explains it."""
    import torch

    torch.manual_seed(0)

    class Block(torch.nn.Module):
        def __init__(self, d: int = 256, h: int = 1024):
            super().__init__()
            self.norm = torch.nn.LayerNorm(d)
            self.up = torch.nn.Linear(d, h)
            self.down = torch.nn.Linear(h, d)
            self.gate = torch.nn.Linear(d, d)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.down(torch.nn.functional.gelu(self.up(self.norm(x))))
            return x + y + torch.relu(self.gate(x))

    return torch.nn.Sequential(Block(), Block()).eval(), (torch.randn(8, 64, 256),)


def _time(fns: list[Any], x: Any, repeat: int) -> list[float]:
    """Median seconds per call of each function, calls interleaved (same machine load)."""
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeat):
        for fn, t in zip(fns, times, strict=True):
            t0 = time.perf_counter()
            fn(x)
            t.append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def run(threads: int = 1, repeat: int = 20, verbose: bool = False) -> int:
    print(
        "pdlkit demo: 2 transformer-style MLP blocks (LayerNorm, Linear+GELU, Linear+ReLU), "
        "input [8, 64, 256]",
        flush=True,
    )
    steps = Steps(5)
    steps.start("importing torch and pdlkit")
    import torch

    import pdlkit
    from pdlkit.backend import PdlkitBackend

    steps.done()
    torch.set_num_threads(max(1, threads))
    model, (x,) = example()
    reports: list[Any] = []

    def on_report(report: Any, plan: Any) -> None:  # the pass is done; Inductor is next
        reports.append((report, plan))
        if len(reports) > 1:
            return
        tuned = report.timings.get("autotune", 0.0)
        note = f"kernels timed in {tuned:.1f} s; " if tuned else ""
        steps.done(f"{note}{len(report.substitutions)} substitution(s)")
        steps.start("Inductor: code for everything else")

    pdlkit.stats(reset=True)
    with torch.no_grad():
        steps.start("pdlkit pass: trace with Dynamo, match patterns, choose kernels")
        expected = model(x)
        compiled = torch.compile(model, backend=PdlkitBackend(on_report=on_report))
        got = compiled(x)
        steps.done()
        steps.start("the same model under Inductor alone (the peer)")
        inductor = torch.compile(model)
        inductor(x)
        steps.done()
        steps.start(f"timing {repeat} runs each of eager, Inductor and pdlkit")
        eager_s, inductor_s, pdlkit_s = _time([model, inductor, compiled], x, repeat)
        steps.done()
    if not reports:
        print("demo FAILED: the pdlkit pass did not run (see the warning above)")
        return 1
    report, plan = reports[-1]
    err = (got - expected).abs().max().item()
    lines = _summary(report, plan, pdlkit.stats(), verbose)
    lines.append(f"max abs error vs eager: {err:.1e}")
    lines.append(_host_line())
    lines.append(
        f"latency (median of {repeat}, {threads} thread(s)): eager {eager_s * 1e3:.2f} ms, "
        f"Inductor {inductor_s * 1e3:.2f} ms, pdlkit {pdlkit_s * 1e3:.2f} ms = "
        f"{pdlkit_s / inductor_s:.2f}x Inductor's latency"
    )
    ok = err <= MAX_ERROR and bool(report.substitutions)
    problem = "no substitution" if not report.substitutions else "error too large"
    lines.append("demo OK" if ok else f"demo FAILED: {problem}")
    print("\n".join(lines), flush=True)
    return 0 if ok else 1


def _host_line() -> str:
    """The machine the latencies come from, as every benchmark names it: the CPU model,
    whether it has AMX, the GPU (pdlkit's autotune key of the host)."""
    key = host_key()
    amx = sorted(f for f in str(key.get("flags", "")).split() if f.startswith("amx"))
    return (
        f"host: {key.get('model name', key['machine'])}; "
        f"AMX: {'yes (' + ', '.join(amx) + ')' if amx else 'no'}; GPU: {key.get('gpu', 'none')}"
    )


def _summary(report: Any, plan: Any, stats: dict[str, Any], verbose: bool) -> list[str]:
    active = [p for p in plan.patterns.patterns if p.active_on(plan.target)]
    lines = [
        f"target: {plan.target.describe()}",
        f"patterns: {len(plan.patterns.patterns)} loaded, {len(active)} for this target"
        + ("" if verbose else " (--verbose lists them)"),
    ]
    if verbose:
        lines.extend(f"  {p.name}  {p.where}" for p in active)
    fired = Counter(f"{s.pattern} -> {s.kernel}" for s in report.substitutions)
    lines.append(f"substitutions ({len(report.substitutions)}):")
    lines.extend(f"  {k}: {n}x" for k, n in fired.items())
    ran = [(k, c) for k, c in stats["by_kernel"].items() if c["kernel_calls"] or c["fallbacks"]]
    lines.append(
        "kernels ran: "
        + (
            ", ".join(f"{k} {c['kernel_calls']} call(s)" for k, c in ran)
            + f"; {sum(c['fallbacks'] for _, c in ran)} fallback(s) to the replaced subgraph"
            if ran
            else "none"
        )
    )
    if verbose:
        lines.append(
            "pass: " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in report.timings.items())
        )
    return lines


if __name__ == "__main__":
    sys.exit(run())

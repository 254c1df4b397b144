"""What x86_models.py measures per case and configuration (``Case``, ``Conf``), its targets,
and its markdown report.

Imported by benchmarks/x86_models.py (run by path: this folder is on ``sys.path``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass, field

from _x86_models_build import MODELS
from measure import p10  # benchmarks/measure.py

RATIO_TARGET = 1.02  # pdlkit latency / the peer's (issue 21)
FIRST_TARGET = 1.3  # pdlkit's first compile / the peer's
SECOND_TARGET = 1.05  # pdlkit's second compile (decision cache warm) / the peer's
CONFIGS = ("pdlkit", "pdlkit-off", "peer")
CONTROL = "control"  # x86_models.py --control: the peer compiled again (the same code)


@dataclass
class Conf:
    """One configuration of one case: its compiles, windows and accuracy."""

    first_s: list[float] = field(default_factory=list)  # per round
    second_s: list[float] = field(default_factory=list)
    windows_ms: list[float] = field(default_factory=list)  # per window: ms per call
    round_medians: list[float] = field(default_factory=list)
    max_abs: float = float("nan")
    cosine: float = float("nan")
    kernels: str = ""  # substitutions by kernel, from pdlkit.stats()
    tuning: list[str] = field(default_factory=list)  # autotune counters, first / second compile
    error: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.windows_ms) if self.windows_ms else float("nan")


@dataclass
class Case:
    model: str
    dtype: str
    shape: str
    peer_label: str
    confs: dict[str, Conf] = field(default_factory=dict)
    error: str = ""
    note: str = ""  # int8: how many GEMMs the quantizer made int8
    loads: list[float] = field(default_factory=list)  # 1-min load average after each round

    @property
    def name(self) -> str:
        return f"{self.model} {self.shape} {self.dtype}"

    def ratio(self, conf: str) -> float:
        """Median of per-window ratios conf / peer (windows of one round alternate)."""
        a, b = self.confs.get(conf), self.confs.get("peer")
        if not a or not b or a.error or b.error or len(a.windows_ms) != len(b.windows_ms):
            return float("nan")
        return statistics.median(x / y for x, y in zip(a.windows_ms, b.windows_ms, strict=True))


# -- report ----------------------------------------------------------------------------------------


def fmt(x: float, spec: str = ".2f", suffix: str = "") -> str:
    return "-" if x != x else f"{x:{spec}}{suffix}"  # NaN: not measured


def verdict(x: float, target: float) -> str:
    return "-" if x != x else ("met" if x <= target else "**NOT met**")


def latency_rows(cases: list[Case]) -> list[str]:
    head = (
        "| model | dtype | input | peer | peer ms (p10) | pdlkit ms (p10) | pdlkit / peer "
        f"| <= {RATIO_TARGET} | pdlkit-off ms | off / peer | max abs err: peer / pdlkit / off "
        "| cosine: peer / pdlkit / off |"
    )
    control = any(CONTROL in r.confs for r in cases)
    if control:  # the harness's reading of the same code: the noise floor of the row
        head += " control / peer |"
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in cases:
        if r.error:
            rows.append(f"| {r.model} | {r.dtype} | {r.shape} | {r.error} |" + " |" * (8 + control))
            continue
        cs = {k: r.confs.get(k, Conf(error="not run")) for k in CONFIGS}

        def ms(c: Conf) -> str:
            return f"{c.median:.2f} ({p10(c.windows_ms):.2f})" if c.windows_ms else "-"

        order = ("peer", "pdlkit", "pdlkit-off")
        acc = [
            " / ".join(fmt(getattr(cs[k], a), s) for k in order)
            for a, s in (("max_abs", ".3g"), ("cosine", ".5f"))
        ]
        rows.append(
            f"| {r.model} | {r.dtype}{f' ({r.note})' if r.note else ''} | {r.shape} "
            f"| {r.peer_label} | {ms(cs['peer'])} "
            f"| {ms(cs['pdlkit'])} | {fmt(r.ratio('pdlkit'), '.3f', 'x')} "
            f"| {verdict(r.ratio('pdlkit'), RATIO_TARGET)} | {ms(cs['pdlkit-off'])} "
            f"| {fmt(r.ratio('pdlkit-off'), '.3f', 'x')} | {acc[0]} | {acc[1]} |"
            + (f" {fmt(r.ratio(CONTROL), '.3f', 'x')} |" if control else "")
        )
    return rows


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def compile_ratio(a: list[float], b: list[float]) -> float:
    """Median over rounds of a / b (both measured in the same round)."""
    return med([x / y for x, y in zip(a, b, strict=False)])


def compile_rows(cases: list[Case]) -> list[str]:
    head = (
        "| model | dtype | peer 1st / 2nd s | pdlkit 1st / 2nd s | pdlkit-off 1st / 2nd s "
        f"| 1st: pdlkit / peer | <= {FIRST_TARGET} | 2nd: pdlkit / peer | <= {SECOND_TARGET} |"
    )
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in cases:
        if r.error or "peer" not in r.confs or "pdlkit" not in r.confs:
            continue
        p, k = r.confs["peer"], r.confs["pdlkit"]
        off = r.confs.get("pdlkit-off", Conf())
        r1, r2 = compile_ratio(k.first_s, p.first_s), compile_ratio(k.second_s, p.second_s)

        def pair(c: Conf) -> str:
            return f"{fmt(med(c.first_s), '.1f')} / {fmt(med(c.second_s), '.1f')}"

        rows.append(
            f"| {r.model} | {r.dtype} | {pair(p)} | {pair(k)} | {pair(off)} "
            f"| {fmt(r1, '.2f', 'x')} | {verdict(r1, FIRST_TARGET)} | {fmt(r2, '.2f', 'x')} "
            f"| {verdict(r2, SECOND_TARGET)} |"
        )
    return rows


def kernel_rows(cases: list[Case]) -> list[str]:
    rows = [
        "| model | dtype | configuration | substitutions by kernel | autotune (1st; 2nd compile) |",
        "|---|---|---|---|---|",
    ]
    for r in cases:
        for conf in ("pdlkit", "pdlkit-off"):
            c = r.confs.get(conf)
            if c and c.kernels:
                tuning = "; ".join(c.tuning[:2]) or "-"
                rows.append(f"| {r.model} | {r.dtype} | {conf} | {c.kernels} | {tuning} |")
    return rows


def failures(cases: list[Case]) -> list[str]:
    out = [f"- {r.name}: {r.error}" for r in cases if r.error]
    for r in cases:
        out += [f"- {r.name}, {k}: {c.error}" for k, c in r.confs.items() if c.error]
    return out or ["none"]


def detail_rows(cases: list[Case]) -> list[str]:
    head = (
        "| case | configuration | windows | medians per round ms | 1st compiles s | 2nd compiles s "
        "| load (1 min) after each round |"
    )
    rows = [head, "|" + "---|" * (head.count("|") - 1)]

    def j(xs: list[float], spec: str = ".2f") -> str:
        return ", ".join(f"{v:{spec}}" for v in xs) or "-"

    for r in cases:
        for conf, c in r.confs.items():
            rows.append(
                f"| {r.name} | {conf} | {len(c.windows_ms)} | {j(c.round_medians)} "
                f"| {j(c.first_s, '.1f')} | {j(c.second_s, '.1f')} | {j(r.loads)} |"
            )
    return rows


def render(cases: list[Case], args: argparse.Namespace, header: list[str], secs: float) -> str:
    tuned = (
        '`pdlkit` = `pdlkit.optimize(m, autotune="cached")`, `pdlkit-off` = `autotune="off"`'
        if args.autotune
        else "**pdlkit.optimize has no `autotune` option at this commit**: `pdlkit` = "
        "`pdlkit.optimize(m)` (today's static priority); `pdlkit-off` not run"
    )
    return "\n".join(
        [
            "# Transformer models on x86: pdlkit against the compiler it replaces (issue 21)",
            "",
            f"Generated by `python benchmarks/x86_models.py {' '.join(sys.argv[1:])}` "
            f"in {secs:.0f} s (the script's docstring says how): {args.rounds} round(s) per "
            f"case, each: first and second compiles (the configurations' order rotated by "
            f"the round: in one process the one compiled first ran up to 7% slower with the "
            f"same kernels; compare rows over as many rounds as configurations), "
            f"{args.warmup} warm-up calls, "
            f"{args.windows} alternating windows of {args.calls} calls per configuration.",
            "",
            *header,
            "",
            f"{tuned}. Peer: `torch.compile(m)` (Inductor alone) for fp32 / bf16 / "
            "int8-per-token; PyTorch's own x86 int8 path for int8-static / int8-dynamic "
            "(`torch.compile(converted)` with `torch._inductor.config.freezing = True`; pdlkit "
            "compiles with freezing on too). "
            "Ratios are medians of per-window ratios (lower is faster); latencies the median "
            "(and 10th percentile) of per-call times over all windows. Accuracy: the second "
            "compile's first output against the same model (same dtype) run eagerly.",
            "",
            "## Latency",
            "",
            *latency_rows(cases),
            "",
            "## Compile cost",
            "",
            "Wall clock of `optimize` / `torch.compile` plus the first call, medians over rounds; "
            "ratios per round, then the median. Every configuration compiles in an Inductor cache "
            "folder of its own. 1st: everything cold (Inductor's caches, pdlkit's decision cache: "
            "a new machine); 2nd: after `torch._dynamo.reset()`, Inductor's in-memory caches "
            "cleared, its folder and the decision cache folder warm (pdlkit's in-process state "
            "is not cleared: a new process would have only the folders).",
            "",
            *compile_rows(cases),
            "",
            "## Kernels pdlkit substituted",
            "",
            "`pdlkit.stats()` after the compile: substitutions per kernel, and its tuning "
            "counters (hits, misses, time measuring; what won per site) in round 1; in "
            "brackets, the whole-graph verdict pdlkit's first compile cached (which graph "
            "runs, and each graph's time in the check: matcher/graph_guard.py).",
            "",
            *kernel_rows(cases),
            "",
            "## Failures",
            "",
            *failures(cases),
            "",
            "## Details",
            "",
            *detail_rows(cases),
            "",
            "Models: "
            + "; ".join(
                f"{n} = {s.family} {s.config or 'defaults'}, input {s.shape()}"
                for n, s in MODELS.items()
            )
            + ".",
            "",
        ]
    )

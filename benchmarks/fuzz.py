"""A longer fuzzing run than CI's: every property of tests/fuzzing.py, for a time budget.

    python benchmarks/fuzz.py --budget 600        # seconds, shared by the properties

Random (not derandomized) examples, no example database. Prints the examples run per
property and outcome, and every falsifying example found; exits 1 if any was found.
Writes benchmarks/results/fuzz.md.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from machine import ROOT, cpu_model, provenance  # benchmarks/machine.py

sys.path.insert(0, str(ROOT / "tests"))
import fuzzing  # noqa: E402  (tests/fuzzing.py)
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

PROPERTIES: dict[str, tuple[Any, Callable[..., None]]] = {
    "random graphs vs eager": (fuzzing.graphs, fuzzing.check_graph),
    "corrupted PDL files": (
        st.tuples(st.sampled_from(sorted(fuzzing.PATTERN_FILES)), fuzzing.mutations),
        lambda ex: fuzzing.check_pdl_corruption(*ex),
    ),
    "corrupted manifests": (fuzzing.mutations, fuzzing.check_manifest_corruption),
    "corrupted kernel files": (
        fuzzing.mutations,
        lambda m: fuzzing.check_kernel_corruption(m, pinned=False),
    ),
    "corrupted pinned kernel files": (
        fuzzing.mutations,
        lambda m: fuzzing.check_kernel_corruption(m, pinned=True),
    ),
    "random native descriptors": (fuzzing.descriptors, fuzzing.check_descriptor),
}


def run_property(strategy: Any, check: Callable[..., None], seconds: float) -> list[str]:
    """Batches of random examples until ``seconds`` pass; the falsifying examples found."""
    failures: list[str] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:

        @settings(
            max_examples=25,
            database=None,
            deadline=60_000,
            suppress_health_check=list(HealthCheck),
            print_blob=True,
        )
        @given(strategy)
        def prop(ex: Any) -> None:
            check(ex)

        try:
            prop()
        except Exception as e:  # a falsifying example: report it, keep fuzzing
            failures.append("".join(traceback.format_exception(e)).strip())
    return failures


def run(
    budget: float, only: list[str] | None = None
) -> tuple[dict[str, int], dict[str, list[str]]]:
    names = [n for n in PROPERTIES if not only or n in only]
    fuzzing.CASES.clear()
    failures = {}
    for name in names:
        strategy, check = PROPERTIES[name]
        failures[name] = run_property(strategy, check, budget / len(names))
        print(f"{name}: done, {len(failures[name])} falsifying example(s)", flush=True)
    return dict(fuzzing.CASES), failures


def _last_error(trace: str) -> str:
    """The innermost error line of a (grouped) traceback."""
    lines = [ln.strip(" |+-") for ln in trace.splitlines()]
    errors = [ln for ln in lines if ln and ("Error" in ln or "Exception" in ln) and ":" in ln]
    return errors[-1] if errors else lines[-1]


def report(cases: dict[str, int], failures: dict[str, list[str]], budget: float) -> str:
    lines = [
        "# Fuzzing (hypothesis, random examples)",
        "",
        f"- {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, budget {budget:.0f} s",
        f"- machine: {cpu_model()}, {platform.machine()}, Python {platform.python_version()}",
        provenance(),
        "",
        "| property / outcome | examples |",
        "|---|---:|",
    ]
    lines += [f"| {k} | {v} |" for k, v in sorted(cases.items())]
    found = [(n, f) for n, fs in failures.items() for f in fs]
    lines += ["", f"Falsifying examples found: {len(found)}"]
    lines += [f"- {n}: `{_last_error(f)[:300]}`" for n, f in found]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=120, help="seconds in all (default 120)")
    ap.add_argument("--only", action="append", choices=sorted(PROPERTIES))
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "fuzz.md")
    args = ap.parse_args()
    cases, failures = run(args.budget, args.only)
    for name, found in failures.items():
        for f in found:
            print(f"--- {name}: falsifying example ---\n{f}\n")
    text = report(cases, failures, args.budget)
    print(text)
    args.out.write_text(text)
    return 1 if any(failures.values()) else 0


if __name__ == "__main__":
    sys.exit(main())

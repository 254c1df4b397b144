"""Which of the whole-graph check's other graphs are worth compiling: the graph with a kernel
at every site (graph_guard.KERNELS) and static priority's (graph_guard.STATIC).

    before: bert-mini BF16 on the AVX2-only AMD EPYC, 2 threads: 24 of 25 sites took a kernel,
            the pooler's linear kept its subgraph (84 us eager, 131 us as a kernel), so the
            kernels-only graph differed there alone; both graphs were compiled and timed,
            25.3 against 25.5 ms: a whole Inductor compile (about 5 s of a 17.7 s first
            compile; Inductor's own took 10.0 s) for graphs 47 us apart by their sites
    after:  where the kernels-only graph's sites add up to within :data:`SHARE` of the
            measured choice's (the check's own margin: it could not tell them apart), the
            kernels-only graph is compiled in its place, alone; static priority's graph is
            compiled only where its sites differ from the measured choice's by that much,
            and the kernels-only graph is not compiled beside the measured choice's

Why the kernels-only graph, not the measured choice: whenever the check compiled both, it took
the kernels-only graph, by more than its sites said (the 16-core Xeon with AMX, 16 threads:
bert-mini BF16 2820 against 3440 us, first_compile_hedges_xeon16_t16.md; Llama int8-static
3.13 against 4.25 ms, ViT int8-static 10.00 against 10.89 ms, x86_models_xeon16_t16_gpt2_llama_
vit_c887840.md): a site left to Inductor between kernel sites costs more in the graph than
alone. Sites whose timings are unknown count as infinitely apart.

Why not static priority's graph beside both: it measured fastest in 4 of the 20 checks that
benchmarks/results/ records with it compiled (the Xeon with AMX and the AMD EPYCs; the
kernels-only graph beside it in at least 18): Llama BF16 on the Xeon at 22d629e, 3 rounds, 2.91-3.31
against the kernels-only graph's 3.11-3.34 ms (the check ran it in one; since then the
kernels-only graph takes AMX at every site there, static priority's graph: 5666d05), and AVX2
BERT-base FP32 once (231.8 against Inductor's 249.3 ms). In 14 it was the slowest or next to
it. It costs a whole Inductor compile (AVX2 bert-mini FP32 compiled four graphs), so beside
the kernels-only graph it is left out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pdlkit.runtime_abi import autotune
from pdlkit.runtime_abi.autotune import KEEP, Decision

# sites' timings that add up to within this share of the measured choice's are a tie
SHARE = autotune.MARGIN


def took_us(decision: Decision, name: str) -> float:
    """What ``name`` took at ``decision``'s site (its estimate where a proxy timed it, the
    larger figure); infinite where it was not timed."""
    for t in decision.timings:
        if t.name == name and t.us is not None:
            return t.us
    return math.inf


def _gap(other: float, chosen: float) -> float:
    """How much slower ``other`` measured than the chosen implementation (infinite where
    either was not timed)."""
    return other - chosen if math.isfinite(other) and math.isfinite(chosen) else math.inf


@dataclass
class Stakes:
    """How far the other graphs' sites are from the measured choice's, over a compilation."""

    kernels_sites: int = 0  # sites where the kernels-only graph differs from the measured choice
    kernels_us: float = 0.0  # how much slower its choices measured there, summed
    static_us: float = 0.0  # the same for static priority's graph
    static_apart: bool = False  # static priority's differs from the kernels-only graph somewhere
    sites_us: float = 0.0  # every site's measured choice (where timed)

    def add(self, decision: Decision, kernels_choice: str, static_choice: str | None) -> None:
        """One site: its ``decision``, and the kernels-only and static graphs' choices there
        (``static_choice`` None: static priority's kernel did not run, and is not compared)."""
        us = took_us(decision, decision.choice)
        self.sites_us += 0.0 if math.isinf(us) else us
        if kernels_choice != decision.choice:
            self.kernels_sites += 1
            self.kernels_us += _gap(took_us(decision, kernels_choice), us)
        if static_choice is not None and static_choice != decision.choice:
            self.static_us += _gap(took_us(decision, static_choice), us)
            self.static_apart |= kernels_choice not in (KEEP, static_choice)

    @classmethod
    def settled(cls, kernels_instead: bool, kernels_differ: bool, static_differs: bool) -> Stakes:
        """Stakes that give these verdicts (match records kept on disk keep only those)."""
        far = math.inf if kernels_differ else 0.0  # 0.0: a tie against the 1 us below
        return cls(int(kernels_instead or kernels_differ), far,
                   math.inf if static_differs else 0.0, static_differs, 1.0)  # fmt: skip

    def _tie(self, us: float) -> bool:
        return us < SHARE * self.sites_us

    @property
    def kernels_instead(self) -> bool:
        """The kernels-only graph differs, within the margin: it is compiled in place of the
        measured choice's, alone."""
        return self.kernels_sites > 0 and self._tie(self.kernels_us)

    @property
    def kernels_differ(self) -> bool:
        """The kernels-only graph differs by more: both are compiled and timed."""
        return self.kernels_sites > 0 and not self._tie(self.kernels_us)

    @property
    def static_differs(self) -> bool:
        """Static priority's graph differs by more than the margin, and the kernels-only graph
        is not compiled beside the measured choice's (then it is left out: module docstring)."""
        return self.static_apart and not self._tie(self.static_us) and not self.kernels_differ

    def notes(self) -> dict[str, str]:
        """What explain says of each graph these stakes decided (by graph_guard's names)."""
        out = {}
        if self.kernels_instead:
            out["kernels only"] = (
                f"compiled in place of the measured choice: its sites add {self.kernels_us:.0f} "
                f"us, under {SHARE:.0%} of the sites' {self.sites_us:.0f} us"
            )
        if self.static_apart and self._tie(self.static_us):
            out["static priority"] = (
                f"not compiled: its sites add {self.static_us:.0f} us, under {SHARE:.0%} of "
                f"the sites' {self.sites_us:.0f} us"
            )
        elif self.static_apart and self.kernels_differ:
            out["static priority"] = "not compiled: the kernels-only graph is timed instead"
        return out


def kernels_only(decision: Decision, order: Sequence[str]) -> Decision:
    """A site's choice in the kernels-only graph: the kernel of highest priority (``order``)
    within :data:`autotune.KERNELS_TIE` of the fastest kernel (of all that ran, where a busy
    host made the timings untrusted), even where the subgraph measured faster; ``decision``
    as it is where no kernel was timed.

        before: timings amx 417 us, onednn 334 us, subgraph 330 us -> keep the subgraph
        after:  kernels only -> onednn (amx is 25% slower: no tie)"""
    timings = [t for t in decision.timings if t.name != KEEP]
    tie = autotune.KERNELS_TIE if autotune.trusted(decision) else float("inf")
    best = autotune.fastest(timings, order, tie=tie)
    if best == KEEP or best == decision.choice:
        return decision
    return Decision(best, decision.timings, "kernels only")

"""Whether the whole-graph check's hedges are worth compiling: the graph with a kernel at every
site (graph_guard.KERNELS) and static priority's (graph_guard.STATIC).

    before: bert-mini BF16 on the AVX2-only AMD EPYC, 2 threads: 24 of 25 sites took a kernel,
            the pooler's linear (84 us eager, 131 us as a kernel) kept its subgraph, so the
            kernels-only graph differed there alone; it was compiled and timed as a third
            graph, 28.1 against 28.3 ms: about 5 s of a 17.7 s first compile (Inductor's own
            10.0 s) to tell apart graphs that can differ by 0.3%
    after:  a hedge is compiled only where the sites at which it differs from the substituted
            graph take at least :data:`SHARE` of all the sites' time: that is the most it can
            gain there, and a smaller gain is under the check's own margin (autotune.MARGIN);
            explain says so where one is left out

A site's stake is what its chosen implementation takes (the substituted graph's time there,
the most a different choice can save), unknown (infinite) where that was not timed; the sites'
time is the chosen implementations' summed over every site, a lower bound of the graph's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pdlkit.runtime_abi import autotune
from pdlkit.runtime_abi.autotune import KEEP, Decision

# the share of the sites' time below which a hedge is not compiled (the check's margin)
SHARE = autotune.MARGIN


def chosen_us(decision: Decision) -> float:
    """What ``decision``'s choice took at its site (its estimate where a proxy timed it:
    the larger figure); infinite where it was not timed."""
    for t in decision.timings:
        if t.name == decision.choice and t.us is not None:
            return t.us
    return math.inf


@dataclass
class Stakes:
    """What the sites at which each hedge differs take, summed over a compilation's sites."""

    kernels_us: float = 0.0  # sites where the kernels-only graph differs from the substituted
    static_us: float = 0.0  # sites where static priority's does
    static_apart: bool = False  # static priority's differs from the kernels-only graph somewhere
    sites_us: float = 0.0  # every site's chosen implementation (where timed)

    def add(self, decision: Decision, kernels_choice: str, static_choice: str | None) -> None:
        """One site: its ``decision``, and the kernels-only and static graphs' choices there
        (``static_choice`` None: static priority's kernel did not run, and is not compared)."""
        us = chosen_us(decision)
        self.sites_us += 0.0 if math.isinf(us) else us
        if kernels_choice != decision.choice:
            self.kernels_us += us
        if static_choice is not None and static_choice != decision.choice:
            self.static_us += us
            self.static_apart |= kernels_choice not in (KEEP, static_choice)

    @classmethod
    def settled(cls, kernels_differ: bool, static_differs: bool) -> Stakes:
        """Stakes that give these verdicts (match records kept on disk keep only those)."""
        return cls(math.inf if kernels_differ else 0.0, math.inf if static_differs else 0.0,
                   static_differs)  # fmt: skip

    def _worth(self, us: float) -> bool:
        return us > 0 and us >= SHARE * self.sites_us

    @property
    def kernels_differ(self) -> bool:
        return self._worth(self.kernels_us)

    @property
    def static_differs(self) -> bool:
        return self.static_apart and self._worth(self.static_us)

    def left_out(self) -> dict[str, str]:
        """Each hedge that differs from the substituted graph but is not compiled, and why
        (for explain, by graph_guard's names)."""
        out = {}
        for name, us, differs in (
            ("kernels only", self.kernels_us, self.kernels_differ),
            ("static priority", self.static_us, self.static_differs),
        ):
            if us > 0 and not differs and (name == "kernels only" or self.static_apart):
                out[name] = (
                    f"not compiled: it differs at sites taking {us:.0f} us, under "
                    f"{SHARE:.0%} of the sites' {self.sites_us:.0f} us"
                )
        return out

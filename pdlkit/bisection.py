"""Which substitution makes a model's output diverge from eager?

    result = pdlkit.bisect(model, x, patterns="my/patterns", kernels="my/kernels")
    print(result)      # or: pdlkit bisect mypkg.models:factory

The model is compiled once (every op but the kernels runs eagerly, so only substitutions
can make a difference); then call sites are switched to their replaced subgraph and back,
without recompiling: a binary search over the sites, in graph order, finds the first one
whose kernel makes the output diverge; it is switched off and the search repeats until
the remaining substitutions agree with eager.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from pdlkit import config
from pdlkit.backend import optimize
from pdlkit.optimized import as_keywords, is_optimized, session_of, unwrap
from pdlkit.plan import options_in
from pdlkit.runtime_abi.verify import compare, reference_only


@dataclass
class Culprit:
    pattern: str
    kernel: str
    where: str  # call site
    alone: str  # how the output diverges with only this substitution on


@dataclass
class BisectResult:
    sites: list[str]  # every substitution: "kernel at call site ..."
    all_on: str  # how the output diverges with every substitution on ("" = it agrees)
    all_off: str  # same with every substitution off (not "" = not the kernels' fault)
    culprits: list[Culprit] = field(default_factory=list)
    runs: int = 0

    def __str__(self) -> str:
        lines = [f"pdlkit bisect: {len(self.sites)} substitution(s), {self.runs} run(s)"]
        if not self.all_on:
            lines.append("the output agrees with eager with every substitution on")
            return "\n".join(lines)
        lines.append(f"with every substitution on: {self.all_on}")
        if self.all_off:
            lines.append(
                f"with every substitution off it still diverges ({self.all_off}): "
                "not a kernel's doing (check the model's determinism or the tolerance)"
            )
        for c in self.culprits:
            lines.append(f"diverging: kernel {c.kernel!r} at {c.where}")
            lines.append(f"  with only this substitution on: {c.alone}")
        return "\n".join(lines)


def _outputs(x: Any) -> list[torch.Tensor]:
    return [t for t in torch.utils._pytree.tree_leaves(x) if isinstance(t, torch.Tensor)]


def bisect(
    model: Callable[..., Any],
    *inputs: Any,
    patterns: config.PathArg = None,
    kernels: config.PathArg = None,
    target: Any = None,
    tolerance: tuple[float | None, float | None] | None = None,
    default_codegen: str | None = None,
    max_culprits: int = 8,
    autotune: str | None = None,
    allow_world_writable: bool | None = None,
) -> BisectResult:
    """Find the substitutions that make ``model(*inputs)`` diverge from eager.

    Takes ``optimize``'s options, or ``optimize``'s result, whose options (and code
    generator) it reuses; an option given here overrides. Otherwise every op but the kernels
    runs eagerly (``default_codegen="eager"``), so that only substitutions can make a
    difference. ``tolerance`` is ``(rtol, atol)`` over the outputs (default: the per-dtype
    ones of ``verify``, relative to each output's largest magnitude).
    """
    optimized = is_optimized(model)
    model, opts = unwrap(model, options_in(locals()))
    if default_codegen is None and not optimized:
        opts = replace(opts, default_codegen="eager")
    with torch.no_grad():
        want = _outputs(model(*inputs))
        # verify would switch diverging sites off by itself: bisection decides here
        compiled = optimize(model, **(as_keywords(opts) | {"verify": False}))
        compiled(*inputs)
        # the sites this compilation made, in graph order (its compile session's: the
        # compiled model keeps them alive)
        sites = session_of(compiled).sites()
        runs = 0

        def diverges(on: set[int]) -> str:
            nonlocal runs
            for i, cs in enumerate(sites):
                cs.intercept = None if i in on else reference_only
            runs += 1
            return compare(_outputs(compiled(*inputs)), want, tolerance)

        everything = set(range(len(sites)))
        result = BisectResult(
            sites=[f"{cs.kernel.name} at {cs.where()}" for cs in sites],
            all_on=diverges(everything),
            all_off="",
        )
        if result.all_on:
            result.all_off = diverges(set())
        candidates = list(range(len(sites)))
        while result.all_on and not result.all_off and len(result.culprits) < max_culprits:
            if not diverges(set(candidates)):
                break
            lo, hi = 0, len(candidates)  # candidates[:lo] agree, candidates[:hi] diverge
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if diverges(set(candidates[:mid])):
                    hi = mid
                else:
                    lo = mid
            i = candidates.pop(hi - 1)
            cs = sites[i]
            result.culprits.append(
                Culprit(cs.pattern, cs.kernel.name, cs.where(), diverges({i}) or "agrees alone")
            )
        for cs in sites:
            cs.intercept = None
        result.runs = runs
    return result

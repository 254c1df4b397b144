"""GEMMs in x86_bert.py's models: which linears pdlkit substituted (and their share of the
FLOPs), the single-core GEMM limit, and the rate of each substituted GEMM kernel in the model.

Imported by benchmarks/x86_bert.py (run by path: this folder is on ``sys.path``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class GemmInfo:
    counts: dict[str, int]
    substituted: int
    linears: int
    flop_share: float  # of the linear layers' FLOPs
    near_misses: int


@dataclass
class GemmRate:
    """One GEMM kernel at one shape inside the compiled model, from the profiler."""

    kernel: str
    m: int
    k: int
    n: int
    calls: int
    us: float  # total time in the kernel op over all calls

    @property
    def gops(self) -> float:
        return 2 * self.m * self.k * self.n * self.calls / (self.us * 1e3)


def gemm_info(model: Any, ids: torch.Tensor, converted: torch.fx.GraphModule | None) -> GemmInfo:
    """Substitutions by pattern, and the share of linear FLOPs they cover."""
    import pdlkit

    torch._dynamo.reset()
    report = pdlkit.explain(model, ids)
    torch._dynamo.reset()
    replaced = {n for s in report.substitutions for n in s.replaced}
    flops = linear_flops(model if converted is None else converted, ids)
    total = sum(flops.values()) or 1
    covered = sum(f for name, f in flops.items() if name in replaced)
    return GemmInfo(
        counts=report.counts(),
        substituted=len(report.substitutions),
        linears=len(flops),
        flop_share=covered / total,
        near_misses=len(report.near_misses),
    )


def linear_flops(model: Any, ids: torch.Tensor) -> dict[str, int]:
    """FX name of every ``aten.linear`` node -> 2*M*N*K, from an export of ``model``.

    The names are those of the pre-dispatch ATen graph pdlkit matches on (``linear``,
    ``linear_1``, ...), which a substitution's ``replaced`` list uses too.
    """
    from torch.fx.passes.shape_prop import ShapeProp

    with torch.no_grad():
        if isinstance(model, torch.fx.GraphModule):
            gm = model
        else:
            gm = torch.export.export(model, (ids,)).module()
        ShapeProp(gm).propagate(ids)  # one eager run; converted graphs carry no "val" meta
    out: dict[str, int] = {}
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target == torch.ops.aten.linear.default:
            x, w = node.args[0], node.args[1]
            xs = x.meta["tensor_meta"].shape
            n, k = w.meta["tensor_meta"].shape
            m = 1
            for d in xs[:-1]:
                m *= int(d)
            out[node.name] = 2 * m * int(n) * int(k)
    return out


GEMM_LIMIT_SIZE = 2048  # the large GEMM whose rate is "the single-core limit" (per case threads)


def gemm_limits(repeats: int = 7) -> dict[str, float]:
    """GOP/s of one large GEMM through oneDNN, int8 and BF16: the limit the model's GEMMs are
    judged against. int8: the faster of ``torch._int_mm`` (s8 x s8 -> s32) and oneDNN's
    qlinear (u8 x s8 -> f32, pre-packed) at 2048^3; BF16: ``F.linear`` in bfloat16. The
    median of ``repeats`` calls, taken right before the model's GEMMs are timed (also by
    their median call), so that load from other users of the machine weighs on both."""
    n = GEMM_LIMIT_SIZE
    g = torch.Generator().manual_seed(0)
    a = torch.randint(-128, 128, (n, n), generator=g, dtype=torch.int8)
    w = torch.randint(-127, 128, (n, n), generator=g, dtype=torch.int8)
    packed = torch.ops.onednn.qlinear_prepack(w, None)
    scales, zps = torch.full((n,), 0.01), torch.zeros(n, dtype=torch.int64)
    au = (a.view(torch.uint8) ^ 0x80).contiguous()
    xb, wb = torch.randn(n, n, generator=g).bfloat16(), torch.randn(n, n, generator=g).bfloat16()
    cands = {
        "int8": [
            lambda: torch._int_mm(a, w.t()),
            lambda: torch.ops.onednn.qlinear_pointwise.default(
                au, 0.02, 128, packed, scales, zps, None, 1.0, 0, torch.float32, "none", [], ""
            ),
        ],
        "bf16": [lambda: torch.nn.functional.linear(xb, wb)],
    }
    out = {}
    with torch.no_grad():
        for kind, fns in cands.items():
            best = 0.0
            for fn in fns:
                fn()
                times = []
                for _ in range(repeats):
                    t = time.perf_counter()
                    fn()
                    times.append(time.perf_counter() - t)
                best = max(best, 2 * n**3 / statistics.median(times) / 1e9)
            out[kind] = best
    return out


def _gemm_ops() -> dict[str, str]:
    """``pdlkit::<op name>`` -> kernel name, for the bound kernels whose logical op is a linear."""
    from pdlkit.runtime_abi import binding

    return {
        str(op._schema.name): key[0]
        for key, op in binding._BOUND.items()
        if "linear" in key[2] or key[2] == "int_mm"
    }


def gemm_rates(fn: Callable[[], Any], calls: int = 10) -> list[GemmRate]:
    """Time in each substituted GEMM kernel per shape over ``calls`` forwards of the compiled
    model: each GEMM op's call (the ``__call__`` that Inductor's code makes, the direct path to
    the kernel) is wrapped in a timer for the duration. Not torch.profiler: it sends every call
    through the dispatcher and records each aten op inside the kernels, which added 30-45 us
    per GEMM call here."""
    from pdlkit.runtime_abi import binding

    ops = _gemm_ops()
    acc: dict[tuple[str, int, int, int], list[float]] = {}  # per-call times, us
    clock = time.perf_counter

    def timed(kernel: str, call: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            t = clock()
            out = call(self, *args, **kwargs)
            dt = clock() - t
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            x = next((a for a in tensors if a.dim() >= 2), None)
            if x is not None:
                k = x.shape[-1]
                w = next(
                    (a for a in tensors if a.dim() == 2 and a is not x and a.shape[1] == k), None
                )
                if w is not None:
                    acc.setdefault((kernel, x.numel() // k, k, w.shape[0]), []).append(dt * 1e6)
            return out

        return wrapper

    with torch.no_grad():
        fn()  # compiles: binds the ops
    patched = []
    for op in binding._BOUND.values():
        kernel = ops.get(str(op._schema.name))
        cls = type(op)
        if kernel is None or cls is torch._ops.OpOverload:  # no direct path: leave it alone
            continue
        patched.append((cls, cls.__call__))
        cls.__call__ = timed(kernel, cls.__call__)  # type: ignore[method-assign]
    try:
        with torch.no_grad():
            for _ in range(calls):
                fn()
    finally:
        for cls, call in patched:
            cls.__call__ = call  # type: ignore[method-assign]
    # the median call per shape, times the calls: a burst of load from another user of the
    # machine moves a mean over 10 forwards by 20-30%, a median hardly
    return [
        GemmRate(kn, m, k, n, len(ts), statistics.median(ts) * len(ts))
        for (kn, m, k, n), ts in sorted(acc.items())
    ]


def overall_rate(rates: list[GemmRate]) -> float:
    us = sum(r.us for r in rates)
    return sum(2 * r.m * r.k * r.n * r.calls for r in rates) / (us * 1e3) if us else float("nan")

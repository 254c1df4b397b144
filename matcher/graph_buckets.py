"""The whole-graph check of a graph compiled with dynamic shapes: one verdict per shape bucket.

before: a graph with dynamic shapes was never timed whole: each site chose per shape
        bucket at run time (matcher/choose.py's ``BucketChoice``), and a graph whose sites
        each won could still run slower than Inductor's code for it (16-core Xeon with
        AMX, a BF16 Llama decode step compiled with ``dynamic=True``, batch 8: 1.08-1.16x
        Inductor's time, the graph's fusions ended at every opaque call)
after:  both graphs are compiled once, for every shape; the first call in each bucket
        (the next power of two of each dynamic dim, as the sites bucket) times them on
        that call's inputs with :func:`graph_guard.choose` (inputs written in place on
        copies; the verdict cached per host under the bucket), and every call in the
        bucket runs the faster one; no recompilation.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx
from pdlkit.matcher import graph_guard, graph_writes
from pdlkit.runtime_abi import autotune
from pdlkit.runtime_abi.autotune import Decision
from pdlkit.runtime_abi.binding_stats import count, uncounted
from pdlkit.runtime_abi.triton_binding import size_hint

# (position among the graph's inputs, dim of that tensor; None: the input is a symbolic int)
Dims = tuple[tuple[int, int | None], ...]
Timed = tuple[str, Callable[..., Any], Decision]  # graph_guard.choose's verdict, code, decision


def dynamic_dims(gm: fx.GraphModule) -> Dims:
    """The graph's dynamic dims: each input's symbolic sizes, and its symbolic ints."""
    dims: list[tuple[int, int | None]] = []
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, n in enumerate(placeholders):
        v = n.meta.get("example_value", n.meta.get("val"))
        if isinstance(v, torch.SymInt):
            dims.append((i, None))
        elif isinstance(v, torch.Tensor):
            dims += [(i, d) for d, s in enumerate(v.shape) if type(s) is not int]
    return tuple(dims)


def buckets(args: Sequence[Any], dims: Dims) -> tuple[int, ...]:
    """The bucket (autotune.bucket) of each dynamic dim's size in this call."""
    return tuple(
        autotune.bucket(size_hint(args[i] if d is None else args[i].shape[d])) for i, d in dims
    )


def hinted(x: Any) -> Any:
    """A symbolic int's value in this compilation (triton_binding.size_hint); anything else
    as it is. The compilation's example inputs hold Dynamo's symbols for its symbolic ints:
    compiled code run on one, or ``int()`` of one, adds a guard that specializes the frame."""
    return size_hint(x) if isinstance(x, torch.SymInt) else x


class BucketedGraphs:
    """The compiled code of a graph with dynamic shapes: the substituted graph's or
    Inductor's, chosen per shape bucket (see the module's docstring).

    ``key``: the verdicts' cache key without the bucket; ``written``: the inputs the graph
    writes in place (graph_writes.written_inputs), on copies while timed; ``deferred``:
    around each timing, puts off and restores the substituted graph's first-call checks
    (binding.DeferredChecks), so the model's own calls in a new bucket still check in full;
    ``decisions``: each bucket's verdict and timings, as decided (explain)."""

    def __init__(
        self,
        dims: Dims,
        substituted: Callable[..., Any],
        inductor: Callable[..., Any],
        key: str,
        mode: str,
        written: Sequence[int],
        deferred: Callable[[Callable[[], Timed]], Timed],
    ):
        self.dims, self.key, self.mode, self.written = dims, key, mode, tuple(written)
        self.fns = {graph_guard.SUBSTITUTED: substituted, graph_guard.INDUCTOR: inductor}
        self.chosen: dict[tuple[int, ...], Callable[..., Any]] = {}
        self.decisions: dict[tuple[int, ...], Decision] = {}
        self.deferred = deferred
        self._lock = threading.Lock()

    def __call__(self, *args: Any) -> Any:
        b = buckets(args, self.dims)
        fn = self.chosen.get(b)
        if fn is None:
            with self._lock:
                fn = self.chosen.get(b) or self.choose(args)
        return fn(*args)

    def choose(self, args: Sequence[Any]) -> Callable[..., Any]:
        """Time both graphs on ``args``' shapes (or read the bucket's cached verdict) and
        keep the faster for the bucket; returns its code."""
        b = buckets(args, self.dims)
        ours, key = self.fns[graph_guard.SUBSTITUTED], verdict_key(self.key, b)

        def timed() -> Timed:
            if self.mode != "cached" or autotune.decision_cache().get(key) is None:
                # one untimed call first: its sites choose their kernels for the bucket
                ours(*graph_writes.scratch_inputs(args, self.written))
            return graph_guard.choose(
                key,
                lambda: ours,
                lambda: self.fns[graph_guard.INDUCTOR],
                args,
                self.mode,
                written=self.written,
            )

        with torch.no_grad(), uncounted():
            _, fn, decision = self.deferred(timed)
        if decision.choice == graph_guard.INDUCTOR:
            count("buckets_to_inductor", "(whole graph)")
        self.decisions[b] = decision
        self.chosen[b] = fn
        return fn


def verdict_key(key: str, b: tuple[int, ...]) -> str:
    """A bucket's verdict's cache key: the graph's (:func:`bucket_key`) and the bucket's."""
    return f"{key} buckets {list(b)}"


def bucket_key(
    gm: fx.GraphModule, example_inputs: Sequence[Any], kernels: Sequence[str], dims: Dims
) -> str:
    """The verdicts' cache key without the bucket: Dynamo's graph (its symbols included),
    its inputs' dtypes, devices and static sizes, and the kernels substituted."""
    dyn = set(dims)
    shapes = [
        (
            [None if (i, d) in dyn else s for d, s in enumerate(x.shape)],
            str(x.dtype),
            x.device.type,
        )
        if isinstance(x, torch.Tensor)
        else (None if (i, None) in dyn else repr(x))
        for i, x in enumerate(example_inputs)
    ]
    return autotune.site_key(["whole graph per bucket", str(gm.graph), shapes, sorted(kernels)])

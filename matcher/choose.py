"""Which implementation runs at a matched site: a kernel, or the replaced subgraph.

    before: linear_gelu matched at gelu_3; kernels linear_gelu_bf16 (priority 10) and
            linear_gelu_onednn (priority 5) are eligible -> linear_gelu_bf16 runs
    after:  each is timed on gelu_3's shapes, dtypes and real weights, and so is the
            subgraph as Inductor compiles it -> the fastest runs, or nothing is substituted

:class:`Tuner` is made once per compilation (``pdlkit.backend.run_pass``) and asked by the
matcher's ``pdlkit_call`` for every match. It makes the site's arguments real: graph inputs
and constants are the tensors the compiled model will get (Dynamo's example inputs: the
weights are the model's own), views of them are taken again, and every intermediate value is
a fresh tensor of its shape and dtype. Kernels are timed through their bound
``torch.ops.pdlkit`` op with a call site of their own, as compiled code calls them (pre-packing
happens in the warm-up, outside the timing).

The subgraph is timed as Inductor runs it: its ops interpreted eagerly give an upper bound and
its extern ops (GEMMs, convolutions, attention: what Inductor calls as library kernels on the
CPU) a lower bound. A kernel slower than the upper bound loses and one faster than the lower
bound wins without more ado; in between, or on CUDA, the subgraph is compiled by Inductor and
timed (`benchmarks/x86_models.py` compares these choices with whole-model timings).
Timings and choices are cached per host (:mod:`pdlkit.runtime_abi.autotune`).
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx
from pdlkit.matcher.canonicalize import weight_views
from pdlkit.runtime_abi import autotune
from pdlkit.runtime_abi.autotune import KEEP, Decision, Excluded, Timing
from pdlkit.runtime_abi.binding import CallSite, bind, drop_site, new_site
from pdlkit.runtime_abi.binding_stats import count, uncounted
from pdlkit.runtime_abi.kernel import KernelDecl

aten = torch.ops.aten
# ops Inductor leaves to a library on the CPU (extern kernels): the subgraph costs at least these
_EXTERN = {
    aten.linear.default, aten.addmm.default, aten.mm.default, aten.bmm.default,
    aten.baddbmm.default, aten.matmul.default, aten._int_mm.default,
    aten.convolution.default, aten.conv2d.default, aten.conv1d.default,
    aten.scaled_dot_product_attention.default,
}  # fmt: skip
# views of a graph input are taken again on the real tensor (a transposed weight is the weight)
_VIEWS = {
    aten.t.default, aten.transpose.int, aten.permute.default, aten.view.default,
    aten.reshape.default, aten.expand.default, aten.unsqueeze.default, aten.squeeze.dim,
    aten.detach.default, aten.alias.default, aten.slice.Tensor, aten.select.int,
    aten.numpy_T.default,
}  # fmt: skip


def _hint(d: Any) -> int:
    """A dim's value in the example inputs (a symbolic dim's hint)."""
    if isinstance(d, int):
        return d
    node = d.node
    hint = node.hint
    return int(hint if hint is not None else node.shape_env.size_hint(node.expr))


def _synthetic(fake: torch.Tensor) -> torch.Tensor:
    """A real tensor shaped like ``fake``: values of the usual scale for its dtype."""
    shape = [_hint(d) for d in fake.shape]
    dev, dt = fake.device, fake.dtype
    if dt.is_floating_point:
        return torch.randn(shape, device=dev).to(dt)
    if dt == torch.bool:
        return torch.zeros(shape, dtype=dt, device=dev)
    info = torch.iinfo(dt)
    lo, hi = max(info.min, -128), min(info.max, 255) + 1
    return torch.randint(lo, hi, shape, dtype=dt, device=dev)


class Tuner:
    """The measured choice for one compilation (see the module docstring)."""

    def __init__(self, mode: str, gm: fx.GraphModule, example_inputs: Sequence[Any]):
        self.mode = mode
        self.gm = gm
        phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self._inputs = dict(zip(phs, example_inputs, strict=False))
        self._values: dict[fx.Node, Any] = {}
        self._memo: dict[str, Decision] = {}
        self.cache = autotune.decision_cache()
        self.budget = autotune.budget_s()
        self.seconds = 0.0  # spent measuring in this compilation

    # real arguments ---------------------------------------------------------------------------
    def value(self, node: fx.Node) -> Any:
        if node not in self._values:
            self._values[node] = self._make(node)
        return self._values[node]

    def _make(self, node: fx.Node) -> Any:
        if node.op == "placeholder" and node in self._inputs:
            return self._inputs[node]
        if node.op == "get_attr":
            obj: Any = self.gm
            for part in str(node.target).split("."):
                obj = getattr(obj, part)
            return obj
        if node.op == "call_function" and node.target in _VIEWS and node.args:
            src = node.args[0]
            if isinstance(src, fx.Node) and src.op in ("placeholder", "get_attr"):
                args = fx.map_arg(node.args, self.value)
                kwargs = fx.map_arg(node.kwargs, self.value)
                return node.target(*args, **kwargs)
        fake = node.meta.get("val")
        if isinstance(fake, torch.Tensor):
            return _synthetic(fake)
        if isinstance(fake, torch.SymInt | int):
            return _hint(fake)
        raise Excluded(f"no value for argument {node.name}")

    def real(self, arg: Any) -> Any:
        if isinstance(arg, fx.Node):
            return self.value(arg)
        if isinstance(arg, list | tuple):
            return type(arg)(self.real(a) for a in arg)
        return arg

    # the key ---------------------------------------------------------------------------------
    def key(
        self, op: str, cands: Sequence[KernelDecl], args: Sequence[Any], sl: Sequence[fx.Node]
    ) -> str:
        def sig(a: Any) -> Any:
            if isinstance(a, fx.Node):
                a = a.meta.get("val")
            if isinstance(a, list | tuple):
                return [sig(x) for x in a]
            if isinstance(a, torch.Tensor):
                dims = [
                    d if isinstance(d, int) else f"b{autotune.bucket(_hint(d))}" for d in a.shape
                ]
                return [dims, str(a.dtype), a.device.type]
            return repr(a)

        parts = [
            op,
            [(k.name, k.version, k.digest) for k in cands],
            [sig(a) for a in args],
            [str(n.target) for n in sl],
        ]
        return autotune.site_key(parts)

    # choosing --------------------------------------------------------------------------------
    def choose(
        self,
        op: str,
        cands: Sequence[KernelDecl],
        args: Sequence[Any],
        subgraph: Callable[..., Any],
        sl: Sequence[fx.Node],
        where: str,
        pin: str | None = None,
    ) -> Decision:
        """The fastest of ``cands`` and ``subgraph`` (``args``: FX nodes and constants).

        ``subgraph`` is a callable ``(*args)`` with ``compile(args)`` for Inductor's code
        (``matcher.substitute._LazyModule``). A pinned kernel keeps its site; the timings
        say whether another candidate was faster."""
        key = self.key(op, cands, args, sl)
        decision = self._memo.get(key)
        if decision is None and self.mode == "cached":
            decision = self.cache.get(key)
            if decision is not None:
                count("tuning_hits", decision.choice)
        if decision is None:
            t0 = time.perf_counter()
            with uncounted():
                decision = self._measure(cands, args, subgraph, where)
            spent = time.perf_counter() - t0
            self.seconds += spent
            count("tuning_misses", decision.choice)
            count("tuning_us", decision.choice, int(spent * 1e6))
            self.cache.put(key, decision)
        self._memo[key] = decision
        names = {k.name for k in cands}
        if decision.choice != KEEP and decision.choice not in names:
            decision = Decision(cands[0].name, decision.timings, "static")  # a stale entry
        if pin is not None:
            decision = Decision(pin, decision.timings, "pinned")
        return decision

    def _measure(
        self,
        cands: Sequence[KernelDecl],
        args: Sequence[Any],
        subgraph: Callable[..., Any],
        where: str,
    ) -> Decision:
        device = _device(args, self)
        runs: list[tuple[str, Callable[[], Any]]] = []
        sites: list[int] = []
        try:
            for k in cands:
                fn, sid = self._kernel_call(k, args, where)
                runs.append((k.name, fn))
                sites.append(sid)
            real = [self.real(a) for a in args]
            with torch.no_grad():
                timings = autotune.measure(runs, device, self.budget)
                timings.append(self._subgraph_time(timings, subgraph, real, device))
        finally:
            for sid in sites:
                drop_site(sid)
        for t in timings:
            if t.us is None and t.name != KEEP:
                warnings.warn(
                    f"pdlkit autotune: kernel {t.name} is not a candidate at {where}: {t.note}",
                    stacklevel=2,
                )
        order = [k.name for k in cands]
        return Decision(autotune.fastest(timings, order), timings)

    def _kernel_call(
        self, k: KernelDecl, args: Sequence[Any], where: str
    ) -> tuple[Callable[[], Any], int]:
        node_args = list(args)
        transposed = weight_views(k, node_args)
        for i in transposed:
            node_args[i] = node_args[i].args[0]  # the weight itself; the site takes the view
        real = [self.real(a) for a in node_args]

        def declined(*_: Any) -> Any:
            raise Excluded("declined the call (KernelUnsupported)")

        site = CallSite(k, f"autotune at {where}", where, "", declined, transposed=transposed)
        sid = new_site(site)
        op = bind(k)
        return (lambda: op(*real, sid)), sid

    def _subgraph_time(
        self, kernels: Sequence[Timing], subgraph: Any, real: Sequence[Any], device: str
    ) -> Timing:
        """The replaced subgraph's time as Inductor would run it (see the module docstring)."""
        times = [t.us for t in kernels if t.us is not None and not t.note.startswith("stopped")]
        best = min(times, default=None)
        if device == "cpu" and best is not None:
            try:
                lower, upper = _eager_bounds(subgraph, real, self.budget)
            except Exception as e:
                return Timing(KEEP, None, f"eager run raised {type(e).__name__}: {e}")
            if best >= upper:
                return Timing(KEEP, upper, "eager; every kernel is slower")
            if best * (1 + autotune.MARGIN) < lower:
                return Timing(KEEP, lower, "its library calls alone; a kernel is faster")
        fn = subgraph.compile(list(real))
        if fn is None:
            return Timing(KEEP, None, f"Inductor failed: {subgraph.compile_error}")
        tensors = [a for a in real if isinstance(a, torch.Tensor)]
        (t,) = autotune.measure([(KEEP, lambda: fn(*tensors))], device, self.budget)
        t.note = "Inductor"
        return t


def _device(args: Sequence[Any], tuner: Tuner) -> str:
    for a in args:
        v = a.meta.get("val") if isinstance(a, fx.Node) else None
        if isinstance(v, torch.Tensor):
            return v.device.type
    return "cpu"


class _Timed(fx.Interpreter):
    """Runs a graph eagerly, adding up the seconds spent in extern ops."""

    extern = 0.0

    def run_node(self, n: fx.Node) -> Any:
        if n.target in _EXTERN:
            t0 = time.perf_counter()
            out = super().run_node(n)
            self.extern += time.perf_counter() - t0
            return out
        return super().run_node(n)


def _eager_bounds(subgraph: Any, real: Sequence[Any], budget: float) -> tuple[float, float]:
    """(lower, upper) bounds in microseconds of the subgraph's time under Inductor on the CPU:
    the median time of its extern ops, and of the whole subgraph run eagerly."""
    module = subgraph.module()
    lows, highs = [], []
    deadline = time.perf_counter() + budget / 2
    with torch.no_grad(), contextlib.suppress(StopIteration):
        for i in range(9):
            interp = _Timed(module)
            t0 = time.perf_counter()
            interp.run(*real)
            if i:  # the first run warms up
                highs.append(time.perf_counter() - t0)
                lows.append(interp.extern)
            if i >= 3 and time.perf_counter() > deadline:
                raise StopIteration
    lows.sort()
    highs.sort()
    return lows[len(lows) // 2] * 1e6, highs[len(highs) // 2] * 1e6

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
happens in the warm-up, outside the timing). Each timed call takes the next of several copies
of the site's weights, as many as the model's weight bytes call for (:mod:`pdlkit.matcher.cold`:
in the model a site's weights come back from memory, not from the core's caches).

The subgraph is timed as Inductor runs it, by default without compiling it: it runs with the
library calls Inductor makes for it on the CPU (:mod:`pdlkit.matcher.lowered`: oneDNN's int8
GEMM on a packed weight under freezing), the rest of its ops eagerly. Those calls alone are a
lower bound of Inductor's time and the eager run about an upper one: a kernel slower than the
upper bound loses, one faster than the lower bound wins, and in between the eager run is the
subgraph's time (the proxy; ``benchmarks/x86_subgraph_proxy.py`` compares it with the compiled
subgraph per site). With ``PDLKIT_AUTOTUNE_SUBGRAPH=compile``, or on CUDA, Inductor compiles
the subgraph and it is timed (`benchmarks/x86_models.py` compares these choices with whole
models). The sites' savings for the whole-graph check take the lower bound where the subgraph's
time is the proxy's. Timings and choices are cached per host."""

from __future__ import annotations

import operator
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any

import torch
import torch.fx as fx
from pdlkit.matcher import cold, hedges, lowered
from pdlkit.matcher.canonicalize import weight_views
from pdlkit.runtime_abi import autotune, triton_binding
from pdlkit.runtime_abi.autotune import KEEP, Decision, Excluded, Timing
from pdlkit.runtime_abi.binding import bind, needs_guard, past_first_checks
from pdlkit.runtime_abi.binding_stats import count, uncounted
from pdlkit.runtime_abi.kernel import KernelDecl
from pdlkit.runtime_abi.outputs import fresh
from pdlkit.runtime_abi.sites import CallSite, drop_site, new_site

aten = torch.ops.aten
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


def _computes_qparams(node: fx.Node) -> bool:
    """A ``choose_qparams`` call (PT2E's dynamic quantization) or an item of its result: made
    by running it, not as fresh values. A random zero point falls outside the activations'
    dtype as often as not (a kernel then declines, and is never chosen: seen with torchao's
    ArmInductorQuantizer's s8 activations), and a random scale can be negative."""
    if node.op != "call_function":
        return False
    if node.target is operator.getitem and isinstance(node.args[0], fx.Node):
        return _computes_qparams(node.args[0])
    return "choose_qparams" in getattr(node.target, "__name__", "")


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
        self.mode, self.gm = mode, gm
        phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self._inputs = dict(zip(phs, example_inputs, strict=False))
        self._values: dict[fx.Node, Any] = {}
        self.decided: dict[str, Decision] = {}  # site key -> decision (also record_memo.py's)
        self.cache = autotune.decision_cache()
        self.budget = autotune.budget_s()
        consts = [self.value(n) for n in gm.graph.nodes if n.op == "get_attr"]
        self.model_bytes = cold.model_bytes([*example_inputs, *consts])  # a call's weights: cold.py
        self.seconds = 0.0  # spent measuring in this compilation
        # what the substituted sites save against their subgraphs (:meth:`_account`), for the
        # whole-graph check's confidence (graph_guard.CONFIDENT); None once one is unknown
        self.saved_us: float | None = 0.0
        # the counted sites' library calls that bound Inductor's time from below, one run of
        # them each (Timing.extern), for the check's sweep of a saving as large as the graph
        self.library_calls: list[Callable[[], float]] = []
        # False: every site takes a kernel even where its subgraph measured faster (the
        # whole-graph check's "kernels only" graph: :meth:`kernels_only`, graph_guard.py)
        self.keep = True
        # how far that graph's sites, and static priority's, are from this one's: which of
        # them the whole-graph check compiles (matcher/hedges.py)
        self.stakes = hedges.Stakes()
        self.unsteady = False  # a site timed on a busy host (autotune.trusted): cache no verdict
        self.per_bucket = False  # the graph is checked whole per shape bucket (see pick.py)

    # real arguments ---------------------------------------------------------------------------
    def value(self, node: fx.Node) -> Any:
        if node not in self._values:
            self._values[node] = self._make(node)
        return self._values[node]

    def _run(self, node: fx.Node) -> Any:
        """``node``'s op on the values of its arguments."""
        target = node.target
        assert callable(target), node.format_node()
        return target(*fx.map_arg(node.args, self.value), **fx.map_arg(node.kwargs, self.value))

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
                return self._run(node)
        if _computes_qparams(node):  # a valid scale and zero point
            return self._run(node)
        fake = node.meta.get("val")
        if isinstance(fake, torch.Tensor):
            return _synthetic(fake)
        if isinstance(fake, torch.SymInt | int):
            return _hint(fake)
        raise Excluded(f"no value for argument {node.name}")

    def real(self, arg: Any, world: Mapping[fx.Node, Any] | None = None) -> Any:
        """``arg``'s value; ``world``: copies of the site's weights (:meth:`worlds`) to take
        instead of the model's own, views of them taken again."""
        if isinstance(arg, fx.Node):
            base = _base(arg)
            if world and base is not None and base in world:
                if base is arg:
                    return world[arg]
                view = arg.target
                assert callable(view), arg.format_node()
                rest = fx.map_arg(arg.args[1:], self.value)
                return view(world[base], *rest, **fx.map_arg(arg.kwargs, self.value))
            return self.value(arg)
        if isinstance(arg, list | tuple):
            return type(arg)(self.real(a, world) for a in arg)
        return arg

    # the site's weights, as the model leaves them (matcher/cold.py) -----------------------------
    def _weights(self, args: Sequence[Any]) -> tuple[list[fx.Node], int]:
        """The graph inputs and constants among ``args`` (or under their views) whose tensors
        a timing copies, and how many copies of them it rotates through (1: none)."""
        found: dict[fx.Node, None] = {}
        for a in _nodes(args):
            base = _base(a)
            if base is not None and cold.weighty(self.value(base)):
                found[base] = None
        site = sum(self.value(w).nbytes for w in found)
        return list(found), cold.copies(site, self.model_bytes) if found else 1

    def copies(self, args: Sequence[Any]) -> int:
        """How many copies of the site's weights its timing rotates through."""
        return self._weights(args)[1]

    def worlds(self, args: Sequence[Any]) -> list[dict[fx.Node, Any]]:
        """The model's own weights (an empty world), then ``copies(args) - 1`` copies."""
        weights, n = self._weights(args)
        return [{}] + [{w: cold.clone(self.value(w)) for w in weights} for _ in range(n - 1)]

    # the key ---------------------------------------------------------------------------------
    def key(
        self, op: str, cands: Sequence[KernelDecl], args: Sequence[Any], sl: Sequence[fx.Node]
    ) -> str:
        """The site's cache key; a dynamic dim counts by its bucket (autotune.bucket)."""
        sigs = [_fill(_template(a), a) for a in args]
        return _key(op, cands, sigs, [str(n.target) for n in sl], self.copies(args))

    def dispatcher(
        self,
        op: str,
        cands: Sequence[KernelDecl],
        args: Sequence[Any],
        sl: Sequence[fx.Node],
        where: str,
        first: Decision,
    ) -> BucketChoice | None:
        """For a site with dynamic dims, the intercept that picks per shape bucket at run
        time (None for a site of static shapes)."""
        templates = [_template(a) for a in args]
        sym = tuple(
            (i, d)
            for i, t in enumerate(templates)
            if isinstance(t, dict)
            for d, size in enumerate(t["dims"])
            if size is None
        )
        if not sym:
            return None
        seen = tuple(autotune.bucket(_hint(args[i].meta["val"].shape[d])) for i, d in sym)
        prefix = (op, list(cands), templates, [str(n.target) for n in sl])
        weights, n = self._weights(args)
        cold_args = (tuple(i for i, a in enumerate(args) if _base(a) in weights), n)
        return BucketChoice(
            prefix, sym, {seen: first.choice}, where, self.cache, self.budget, cold_args
        )

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
        """The fastest of ``cands`` and ``subgraph`` (``args``: FX nodes and constants); where
        a busy host made the timings untrusted, the kernel of highest priority that ran.

        ``subgraph`` is a callable ``(*args)`` with ``compile(args)`` for Inductor's code
        (``runtime_abi.fallback.ReplacedSubgraph``). A pinned kernel keeps its site; the timings
        say whether another candidate was faster."""
        key = self.key(op, cands, args, sl)
        decision = self.decided.get(key)
        if decision is None:
            decision, spent = cached_or_measured(
                self.cache, key, self.mode == "cached",
                lambda: self._measure(cands, args, subgraph, where),
            )  # fmt: skip
            self.seconds += spent
            self.unsteady |= not autotune.trusted(decision)
        self.decided[key] = decision
        if decision.choice != KEEP and decision.choice not in {k.name for k in cands}:
            decision = Decision(cands[0].name, decision.timings, "static")  # a stale entry
        if pin is not None:
            decision = Decision(pin, decision.timings, "pinned")
        else:
            other = hedges.kernels_only(decision, [k.name for k in cands])
            decision = decision if autotune.trusted(decision) else other  # no ranking
            top, ran = cands[0].name, {t.name for t in decision.timings if t.ran()}
            self.stakes.add(decision, other.choice, top if top in ran else None)
            decision = decision if self.keep else other
        self._account(decision, any(isinstance(a, fx.Node) and _computes_qparams(a) for a in args))
        return decision

    def _account(self, decision: Decision, dynamic: bool = False) -> None:
        """Add a site's saving to :attr:`saved_us`: against a proxy's lower bound (its library
        calls alone), unknown (None) from a pin or from timings a busy host made untrusted.
        A ``dynamic`` site (its activation's qparams computed in the graph) adds nothing: alone
        it misjudged the graph around it (AVX-512 EPYC: GPT-2 int8-dynamic's sites saved 20% of
        the graph, which ran 10% slower than Inductor's; x86_site_savings_epyc_avx512_t2_*.md)."""
        if decision.choice == KEEP or self.saved_us is None or dynamic:
            return
        t = {x.name: x.us if x.low is None else x.low for x in decision.timings}
        keep, ours = t.get(KEEP), t.get(decision.choice)
        known = decision.source != "pinned" and autotune.trusted(decision)
        if not known or keep is None or ours is None:
            self.saved_us = None
        else:
            self.saved_us += max(keep - ours, 0.0)
            bound = next((x.extern for x in decision.timings if x.name == KEEP), None)
            if bound is not None:  # a decision read from the cache has none
                self.library_calls.append(bound)

    def _measure(
        self,
        cands: Sequence[KernelDecl],
        args: Sequence[Any],
        subgraph: Callable[..., Any],
        where: str,
    ) -> Decision:
        sites: list[int] = []
        try:
            worlds = self.worlds(args)
            runs = []
            for k in cands:
                fn, sid = self._kernel_call(k, args, where, worlds)
                runs.append((k.name, fn))
                sites.append(sid)
            reals = [[self.real(a, w) for a in args] for w in worlds]
            # graph constants: the weights under Inductor's freezing (get_attr, see retrace)
            frozen = tuple(
                i for i, a in enumerate(args) if isinstance(a, fx.Node) and a.op == "get_attr"
            )
            return decide(runs, subgraph, reals, _device(args), self.budget, where, frozen)
        finally:
            for sid in sites:
                drop_site(sid)

    def _kernel_call(
        self, k: KernelDecl, args: Sequence[Any], where: str, worlds: Sequence[Mapping[Any, Any]]
    ) -> tuple[Callable[[], Any], int]:
        node_args = list(args)
        transposed = weight_views(k, node_args)
        for i in transposed:
            node_args[i] = node_args[i].args[0]  # the weight itself; the site takes the view
        reals = [[self.real(a, w) for a in node_args] for w in worlds]
        op, sid = timing_site(k, where, transposed, needs_guard(k, reals[0]))
        if triton_binding.traced(k):  # timed as Inductor will launch it, not the runner
            return triton_binding.compiled_call(op, reals[0], sid), sid
        return cold.rotating([partial(op, *real, sid) for real in reals]), sid


def timing_site(
    k: KernelDecl, where: str, transposed: tuple[int, ...] = (), guard: bool = True
) -> tuple[Any, int]:
    """``k``'s bound op and a call site of its own for timing calls (past its first checks):
    a declined call raises :class:`Excluded` instead of running the subgraph. Free it with
    ``drop_site``. ``guard``: as the compiled site's (``needs_guard``; 12 us a native GEMM)."""

    def declined(*_: Any) -> Any:
        raise Excluded("declined the call (KernelUnsupported)")

    site = CallSite(k, f"autotune at {where}", where, "", declined, transposed=transposed)
    site.static, site.guard = True, guard
    past_first_checks(site)
    return bind(k), new_site(site)


def decide(
    runs: Sequence[tuple[str, Callable[[], Any]]],
    subgraph: Any,
    reals: Sequence[Sequence[Any]],
    device: str,
    budget: float,
    where: str,
    frozen: tuple[int, ...] = (),
) -> Decision:
    """Time the kernels' calls ``runs`` and the subgraph on real arguments (``reals``: one
    list per copy of the site's weights, matcher/cold.py, taken in turn); the fastest wins.
    ``runs`` are in priority order (ties go to the first); ``frozen``: the arguments that
    are constants of the graph (its weights, under Inductor's freezing)."""
    with torch.no_grad():
        timings = autotune.measure(runs, device, budget)
        timings.append(_subgraph_time(timings, subgraph, reals, device, budget, frozen))
    for t in timings:
        if t.us is None and t.name != KEEP and not t.note.startswith(autotune.NOT_TIMED_COLD):
            warnings.warn(
                f"pdlkit autotune: kernel {t.name} is not a candidate at {where}: {t.note}",
                stacklevel=3,
            )
    return Decision(autotune.fastest(timings, [n for n, _ in runs]), timings)


def _subgraph_time(
    kernels: Sequence[Timing],
    subgraph: Any,
    reals: Sequence[Sequence[Any]],
    device: str,
    budget: float,
    frozen: tuple[int, ...],
) -> Timing:
    """The replaced subgraph's time as Inductor would run it (see the module docstring).

    On the CPU the subgraph runs with the library calls Inductor makes for it
    (:mod:`pdlkit.matcher.lowered`: under freezing an int8 (PT2E) GEMM is oneDNN's int8 GEMM
    on a packed weight): their time alone bounds Inductor's from below, the whole run eagerly
    from above, and by default that run is the subgraph's time (the proxy); with
    ``PDLKIT_AUTOTUNE_SUBGRAPH=compile``, or on CUDA, a kernel between the bounds is compared
    with the subgraph compiled by Inductor, with its weights as constants under freezing
    (compiled once: timed on the first of ``reals`` alone where it has constants)."""
    times = [t.us for t in kernels if t.ran() and t.us is not None]
    best = min(times, default=None)
    freezing = bool(torch._inductor.config.freezing)
    constants = frozen if freezing else ()
    if device == "cpu":
        proxy, bound = autotune.subgraph_mode() == "proxy", None
        try:
            low = lowered.as_inductor_lowers(subgraph.module(), reals[0], constants, freezing)
            runs = [(low.module, reals[0])] + [(low.on(r), r) for r in reals[1:]]
            lower, upper = lowered.bounds(runs, budget, best)
        except Exception:  # a rewrite this subgraph does not take: Inductor's code is timed
            proxy = False
        else:
            floor = lower if low.faithful else None  # Inductor runs at least these calls
            # those calls again, for the whole-graph check's sweep (graph_guard.BELIEVABLE);
            # not oneDNN's int8 GEMMs: swept at 16 threads on a Xeon with AMX, bert-mini's
            # read 1.56x Inductor's whole graph (results/x86_library_sweep_xeon16_t16_*.md)
            swept = floor and not low.lowered
            bound = partial(lowered.extern_us, low.module, reals[0]) if swept else None
            if best is not None and best >= upper:
                return Timing(KEEP, upper, "eager; every kernel is slower", floor, extern=bound)
            if floor is not None and best is not None and best * (1 + autotune.MARGIN) < floor:
                note = "its library calls alone; a kernel is faster"
                return Timing(KEEP, floor, note, floor, extern=bound)
            proxy = proxy and low.faithful
        if proxy:
            note = "proxy: Inductor's library calls" + (", oneDNN int8" if low.lowered else "")
            return Timing(KEEP, upper, note + ", the rest eagerly", floor, extern=bound)
    fn = subgraph.compile(list(reals[0]), constants)
    if fn is None:
        return Timing(KEEP, None, f"Inductor failed: {subgraph.compile_error}")
    calls = [
        partial(
            fn, *[a for i, a in enumerate(r) if isinstance(a, torch.Tensor) and i not in constants]
        )
        for r in (reals[:1] if constants else reals)
    ]
    (t,) = autotune.measure([(KEEP, cold.rotating(calls))], device, budget)
    t.note = "Inductor, frozen weights" if constants else "Inductor"
    return t


def _template(a: Any) -> Any:
    """An argument's signature for the cache key, with None for a dynamic dim."""
    if isinstance(a, fx.Node):
        a = a.meta.get("val")
    if isinstance(a, list | tuple):
        return [_template(x) for x in a]
    if isinstance(a, torch.Tensor):
        dims = [d if isinstance(d, int) else None for d in a.shape]
        return {"dims": dims, "dtype": str(a.dtype), "device": a.device.type}
    if isinstance(a, float | int) and not isinstance(a, bool):
        # scales and zero points differ per layer, not in what they cost: one key for all
        return type(a).__name__
    return repr(a)


def _fill(t: Any, a: Any) -> Any:
    """``t`` with each dynamic dim replaced by the bucket of ``a``'s size there (``a``: a real
    tensor, or an FX node whose value's symbolic dims have hints)."""
    if isinstance(a, fx.Node):
        a = a.meta.get("val")
    if isinstance(t, dict) and isinstance(a, torch.Tensor):
        dims = [f"b{autotune.bucket(_hint(a.shape[i]))}" if d is None else d
                for i, d in enumerate(t["dims"])]  # fmt: skip
        return {**t, "dims": dims}
    if isinstance(t, list) and isinstance(a, list | tuple):
        return [_fill(x, y) for x, y in zip(t, a, strict=False)]
    return t


def _key(
    op: str, cands: Sequence[KernelDecl], sigs: list[Any], targets: list[str], copies: int = 1
) -> str:
    """A site's cache key; ``copies``: how many copies of its weights its timing rotated
    through (matcher/cold.py), by its power-of-two bucket: the same shapes in a model whose
    weights stay in the caches and in one whose weights do not are two decisions."""
    ids = [(k.name, k.version, k.digest) for k in cands]
    return autotune.site_key([op, ids, sigs, targets, f"weights x{autotune.bucket(copies)}"])


def _base(node: Any) -> fx.Node | None:
    """The graph input or constant ``node`` is, or is a view of (:data:`_VIEWS`), else None."""
    if not isinstance(node, fx.Node):
        return None
    if node.op in ("placeholder", "get_attr"):
        return node
    if node.op == "call_function" and node.target in _VIEWS and node.args:
        src = node.args[0]
        if isinstance(src, fx.Node) and src.op in ("placeholder", "get_attr"):
            return src
    return None


def _nodes(args: Any) -> Iterator[fx.Node]:
    """The FX nodes among ``args``, lists and tuples looked into."""
    for a in args:
        if isinstance(a, fx.Node):
            yield a
        elif isinstance(a, list | tuple):
            yield from _nodes(a)


class BucketChoice:
    """The ``CallSite.intercept`` of a site with dynamic dims: one decision per shape bucket
    (powers of two of each dynamic dim), taken at the first call in a bucket by timing the
    kernels and the replaced subgraph on that call's tensors (or read from the decision
    cache), then looked up per call by the buckets of its dims; no recompilation. The
    subgraph runs as the site's fallback (op by op, then Inductor's code per signature).
    ``cold_args``: the positions of the site's weights among a call's arguments and how many
    copies of them a timing rotates through (matcher/cold.py), as at compile time."""

    def __init__(
        self,
        prefix: tuple[str, list[KernelDecl], list[Any], list[str]],
        sym: tuple[tuple[int, int], ...],
        choices: dict[tuple[int, ...], str],
        where: str,
        cache: autotune.DecisionCache,
        budget: float,
        cold_args: tuple[tuple[int, ...], int] = ((), 1),
    ):
        self.prefix, self.sym, self.choices = prefix, sym, choices
        self.where, self.cache, self.budget = where, cache, budget
        self.weights, self.copies = cold_args
        self.inner: Callable[..., Any] | None = None  # first-call verification, if on
        self._lock = threading.Lock()
        self._siblings: dict[str, tuple[Any, int]] = {}

    def __call__(self, cs: Any, args: tuple[Any, ...], attempt: Callable[..., Any]) -> Any:
        buckets = tuple(autotune.bucket(args[i].shape[d]) for i, d in self.sym)
        choice = self.choices.get(buckets)
        if choice is None:
            with self._lock:
                choice = self.choices.get(buckets) or self._tune(cs, args, buckets)
        if choice == cs.kernel.name:
            return self.inner(cs, args, attempt) if self.inner else attempt(cs, args)
        if choice == KEEP:
            return fresh(cs.fallback(*args), args)
        op, sid = self._siblings[choice]
        return op(*args, sid)

    def _measure(self, cs: Any, cands: Sequence[KernelDecl], args: tuple[Any, ...]) -> Decision:
        runs, sites = [], []
        copied = [i for i in self.weights if cold.weighty(args[i])]
        reals = [list(args)] + [
            [cold.clone(a) if i in copied else a for i, a in enumerate(args)]
            for _ in range(self.copies - 1 if copied else 0)
        ]
        try:
            for k in cands:
                guard = cs.guard if k.name == cs.kernel.name else True  # a sibling: guarded
                op, sid = timing_site(k, self.where, guard=guard)
                runs.append((k.name, cold.rotating([partial(op, *r, sid) for r in reals])))
                sites.append(sid)
            device = autotune.device_of(args)
            return decide(runs, cs.fallback, reals, device, self.budget, self.where)
        finally:
            for sid in sites:
                drop_site(sid)

    def _tune(self, cs: Any, args: tuple[Any, ...], buckets: tuple[int, ...]) -> str:
        op_name, cands, templates, targets = self.prefix
        sigs = [_fill(t, a) for t, a in zip(templates, args, strict=True)]
        key = _key(op_name, cands, sigs, targets, self.copies)
        decision, _ = cached_or_measured(
            self.cache, key, True, lambda: self._measure(cs, cands, args)
        )
        choice = decision.choice
        if choice not in (KEEP, cs.kernel.name) and choice not in self._siblings:
            k = next((k for k in cands if k.name == choice), None)
            if k is None:  # a stale cache entry
                choice = cs.kernel.name
            else:  # calls in this bucket go to k, at a site of its own, falling back alike
                sid = new_site(CallSite(k, cs.pattern, cs.node, cs.user_line, cs.fallback))
                self._siblings[choice] = (bind(k), sid)
                weakref.finalize(self, drop_site, sid)
        self.choices[buckets] = choice
        return choice


def cached_or_measured(
    cache: autotune.DecisionCache, key: str, use_cache: bool, measure: Callable[[], Decision]
) -> tuple[Decision, float]:
    """The decision for ``key``: from the cache (``use_cache``), else measured (kernel calls
    not counted in ``stats()``; timings a busy host made untrusted, ``autotune.trusted``, get a
    second look that decides) and cached if trusted; and the seconds spent measuring."""
    decision = cache.get(key) if use_cache else None
    if decision is not None:
        count("tuning_hits", decision.choice)
        return decision, 0.0
    t0 = time.perf_counter()
    with uncounted():
        decision = measure()
        decision = decision if autotune.trusted(decision) else measure()  # a second look
    spent = time.perf_counter() - t0
    count("tuning_misses", decision.choice)
    count("tuning_us", decision.choice, int(spent * 1e6))
    if autotune.trusted(decision):
        cache.put(key, decision)
    else:  # a busy host: this compilation takes it, the next one measures again
        count("tuning_unsteady", decision.choice)
    return decision, spent


def _device(args: Sequence[Any]) -> str:
    return autotune.device_of(a.meta.get("val") if isinstance(a, fx.Node) else a for a in args)

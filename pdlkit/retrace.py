"""Dynamo's torch-level graph -> a pre-dispatch ATen graph, the level patterns are written at.

    before: linear = torch._C._nn.linear(x, w, b); gelu = torch._C._nn.gelu(linear)
    after:  linear = aten.linear.default(x, w, b); gelu = aten.gelu.default(linear)
            (every node with meta["val"]; torch.no_grad() / autocast regions as submodules)

Re-traced inside Dynamo's own fake mode, so that only Dynamo's symbolic dims stay symbolic.
A graph with static shapes is traced once per process: a second compilation of it (after
``torch._dynamo.reset()``, or a new ``optimize`` of the same model) gets a copy of the first
trace (see :func:`_reuse_key`), as the backend's CSE and canonicalization left it
(:func:`retrace_prepared`). That prepared trace is also kept on disk for the next process
(pdlkit/trace_store.py), where Inductor's own trace comes from its cache too.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any, cast

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._pytree import tree_map_only

from pdlkit import trace_store
from pdlkit.runtime_abi.binding_stats import count

Prepare = Callable[[fx.GraphModule], Any]  # an in-place pass on a fresh trace (retrace_prepared)


def _fake_inputs(gm: fx.GraphModule, example_inputs: list[Any]) -> list[Any]:
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    vals = [n.meta.get("example_value") for n in phs]
    if len(vals) == len(example_inputs) and all(v is not None for v in vals):
        # Dynamo's value for an opaque object (a process group, a device mesh, a torchbind
        # object) is already a FakeScriptObject; make_fx fakes the real one itself.
        from torch._library.fake_class_registry import FakeScriptObject

        pairs = zip(vals, example_inputs, strict=True)
        return [x if isinstance(v, FakeScriptObject) else v for v, x in pairs]
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = torch._guards.detect_fake_mode(example_inputs) or FakeTensorMode()
    return [mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in example_inputs]


def retrace(gm: fx.GraphModule, example_inputs: list[Any]) -> fx.GraphModule:
    """Dynamo's torch-level graph -> pre-dispatch ATen graph with ``meta["val"]`` on every node.

    A ``torch.no_grad()`` / ``torch.enable_grad()`` or ``torch.autocast(...)`` region becomes
    a call of a submodule, torch.export's form of it::

        before: _set_grad_enabled(False); linear_1 = aten.linear(...); _set_grad_enabled(True)
        after:  wrap_with_set_grad_enabled = higher_order.wrap_with_set_grad_enabled(
                    False, self.submod_1, ...)      # submod_1: linear_1 = aten.linear(...)

    so that no pass (CSE, canonicalization, matching) combines ops of different modes."""
    return retrace_prepared(gm, example_inputs)[0]


def retrace_prepared(
    gm: fx.GraphModule, example_inputs: list[Any], prepare: Prepare | None = None
) -> tuple[fx.GraphModule, Any]:
    """:func:`retrace`, then ``prepare(traced)``: a module-level pass that edits the graph in
    place and reads nothing but it (CSE, canonicalization), and its result. A reused trace
    is reused prepared (its graph and a copy of the result), keyed by the pass's name too:
    a second compilation does not run the pass again."""
    # on disk a graph's weights are kept by name (pdlkit/trace_store.py); in memory a trace
    # would hold the tensors of the model first traced: a frozen graph is not reused there
    disk = _with_pass(_reuse_key(gm, example_inputs), prepare)
    key = None if any(n.op == "get_attr" for n in gm.graph.nodes) else disk
    if key is not None:
        with _TRACED_LOCK:
            hit = _TRACED.get(key[0])
            if hit is not None:
                _TRACED.move_to_end(key[0])
        if hit is not None and _same_targets(hit[0], key[1]):
            fresh = _in_this_compilation(_copy(hit[1]), _fake_inputs(gm, example_inputs))
            return fresh, copy.copy(hit[2])
    disk = None if prepare is None else disk  # a prepared trace is what is kept
    kept = None if disk is None else _kept(gm, example_inputs, disk[0], prepare)
    if kept is not None:
        traced, result = kept
    else:
        traced = _trace(gm, example_inputs)
        result = prepare(traced) if prepare is not None else None
        if disk is not None:
            trace_store.save(trace_store.store_key(disk[0], prepare), traced, result, gm)
    if key is not None and not any(n.op == "get_attr" for n in traced.graph.nodes):
        with _TRACED_LOCK:  # the caller's passes edit a copy in place, never this one
            _TRACED[key[0]] = (key[1], traced, result)
            while len(_TRACED) > _TRACED_MAX:
                _TRACED.popitem(last=False)
        return _copy(traced), copy.copy(result)
    return traced, result


def _with_pass(key: tuple[str, tuple[Any, ...]] | None, prepare: Prepare | None) -> Any:
    """A reuse key with the prepare pass's name in it (a trace is reused prepared)."""
    if key is None or prepare is None:
        return key
    return (f"{key[0]}|{prepare.__module__}.{prepare.__qualname__}", key[1])


def _kept(
    gm: fx.GraphModule, example_inputs: list[Any], key: str, prepare: Prepare | None
) -> tuple[fx.GraphModule, Any] | None:
    """The prepared trace a process before this one kept on disk (pdlkit/trace_store.py),
    its values made in this compilation's fake mode; None where there is none."""
    mode = torch._guards.detect_fake_mode(_fake_inputs(gm, example_inputs))
    if mode is None:
        return None
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    outputs = tree_map_only(fx.Node, lambda n: n.meta.get("example_value"), out.args)
    kept = trace_store.load(trace_store.store_key(key, prepare), mode, outputs, gm)
    if kept is not None:
        count("traces_from_disk", "(whole graph)")
    return kept


def _trace(gm: fx.GraphModule, example_inputs: list[Any]) -> fx.GraphModule:
    import torch.fx.traceback as fx_traceback

    fake = _fake_inputs(gm, example_inputs)

    def run(*args: Any) -> Any:  # through the Interpreter, so user stack traces carry over
        return fx.Interpreter(gm).run(*args)

    # With Inductor's freezing on, Dynamo keeps parameters as real tensors on the module
    # (get_attr), not as graph inputs; they are constants of the traced graph then.
    mode = torch._guards.detect_fake_mode(fake)
    allow = mode.allow_non_fake_inputs if mode is not None else False
    try:
        if mode is not None:
            mode.allow_non_fake_inputs = True
        with fx_traceback.preserve_node_meta():
            traced = _make_fx(run, mode, fake)
        if not any(n.target in _mode_calls() for n in traced.graph.nodes):
            return traced
        _propagate_in_modes(traced)
    finally:
        if mode is not None:
            mode.allow_non_fake_inputs = allow
    return _wrap_mode_regions(traced)


def _make_fx(run: Callable[..., Any], mode: Any, fake: list[Any]) -> fx.GraphModule:
    """``run`` traced to pre-dispatch ATen on ``fake`` in ``mode`` (the compilation's fake
    mode), as AOTAutograd traces: the inputs made fake in ``mode`` first, as make_fx's
    ``tracing_mode="fake"`` makes them, but with what Dynamo memoized on them kept
    (:func:`_in_mode`), then traced in that mode. (make_fx's own conversion lost the symbolic
    value of each Python float that ``dynamic=True`` lifts to a 0-d tensor: ``.item()`` on it
    then failed, "Backend compiler failed with aten._local_scalar_dense", and Dynamo split
    the graph at every such float.)"""
    from torch._dispatch.python import enable_python_dispatcher
    from torch.fx.experimental.proxy_tensor import make_fx

    if mode is None:
        return make_fx(run, pre_dispatch=True, tracing_mode="fake")(*fake)
    tensors = iter(range(len(fake)))  # make_fx names its fake inputs' sources by tensor count
    inputs = [_in_mode(x, mode, tensors) for x in fake]
    with mode, enable_python_dispatcher():
        return make_fx(run, pre_dispatch=True)(*inputs)


def _in_mode(x: Any, mode: FakeTensorMode, tensors: Iterator[int]) -> Any:
    """``x`` as make_fx's fake mode makes it: a tensor as a fake tensor of ``mode`` (Dynamo's
    values belong to a fake mode of its own, the backend's to another with the same shape
    environment), its ``.item()`` symbol kept; an opaque object (a process group, a device
    mesh, a registered opaque type) as its fake object; anything else as it is."""
    from torch._dynamo.source import ConstantSource
    from torch._library.fake_class_registry import maybe_to_fake_obj

    if isinstance(x, FakeTensor) and x.fake_mode is mode:
        return x
    if isinstance(x, torch.Tensor):
        y = mode.from_tensor(x, source=ConstantSource(f"input{next(tensors)}"))
        if isinstance(x, FakeTensor) and x.item_memo is not None:
            y.item_memo = x.item_memo
        return y
    if isinstance(x, torch.ScriptObject) or _opaque(x, value=False):
        return x if _opaque(x, value=True) else maybe_to_fake_obj(mode, x)
    return x


def _opaque(x: Any, value: bool) -> bool:
    """Whether ``x`` is an opaque object (``value``: of an opaque value type, which make_fx
    passes as it is); False on a torch without opaque objects."""
    try:
        from torch._library import opaque_object as oo
    except ImportError:
        return False
    fn = getattr(oo, "is_opaque_value_type" if value else "is_opaque_value", None)
    return bool(fn(type(x) if value else x)) if fn is not None else False


# Re-traced graphs by what decides them (_reuse_key, and the prepare pass's name), the least
# recently used first, as (call targets, graph, the prepare pass's result). The trace is about
# two thirds of the pass on a second compilation of bert-mini (0.1 of 0.15 s).
# Process-wide on purpose (pdlkit/session.py): Dynamo's graph, not a backend, decides it.
_TRACED: OrderedDict[str, tuple[tuple[Any, ...], fx.GraphModule, Any]] = OrderedDict()
_TRACED_MAX = 16
_TRACED_LOCK = threading.Lock()


def _reuse_key(gm: fx.GraphModule, example_inputs: list[Any]) -> tuple[str, tuple[Any, ...]] | None:
    """What decides the re-trace of ``gm``: its code and source lines, its inputs' shapes,
    strides, dtypes, devices and requires_grad, its module attributes' (the weights under
    freezing) names and layouts, and the grad / inference mode; with the call targets,
    compared by identity on a hit. None where a trace is not reused: symbolic shapes (their
    symbols belong to one compilation), submodules, inputs or attributes that are not plain
    tensors."""
    h = hashlib.sha256(str(gm.graph).encode())
    targets = []
    phs = []
    for n in gm.graph.nodes:
        if n.op == "call_module":
            return None
        if n.op == "get_attr":
            t = trace_store.fetch(gm, str(n.target))
            if not _static_tensor(t):
                return None
            h.update(repr((n.target, t.shape, t.stride(), t.dtype, t.device)).encode())
        elif n.op == "placeholder":
            phs.append(n.meta.get("example_value"))
        elif n.op == "call_function":
            targets.append(n.target)
        h.update((n.meta.get("stack_trace") or "").encode())
    if len(phs) != len(example_inputs):
        return None
    for v, x in zip(phs, example_inputs, strict=True):
        for t in (v, x):
            if not _static_tensor(t):
                return None
            h.update(repr((t.shape, t.stride(), t.dtype, t.device, t.requires_grad)).encode())
    h.update(repr((torch.is_grad_enabled(), torch.is_inference_mode_enabled())).encode())
    return h.hexdigest(), tuple(targets)


def _static_tensor(t: Any) -> bool:
    return (
        type(t) in _PLAIN
        and t.layout == torch.strided
        and all(type(d) is int for d in (*t.shape, *t.stride()))
    )


_PLAIN = (torch.Tensor, torch.nn.Parameter, FakeTensor)


def _same_targets(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


def _copy(traced: fx.GraphModule) -> fx.GraphModule:
    """A graph module of its own over the same fake values: its nodes, their meta dicts and
    the dicts and lists in them (``nn_module_stack``, ...) are new, so that no pass editing
    the copy in place reaches the cached graph. A lazy one (Dynamo's kind): its Python code
    is generated when first run or read, not after every pass that edits it (CSE,
    canonicalization, substitution: about 4 ms each on gpt2)."""
    from torch.fx._lazy_graph_module import _LazyGraphModule

    graph = copy.deepcopy(traced.graph)
    for n in graph.nodes:
        n.meta = {k: copy.copy(v) if type(v) in (dict, list) else v for k, v in n.meta.items()}
    return _LazyGraphModule(traced, graph, type(traced).__name__)


def _in_this_compilation(traced: fx.GraphModule, fake: list[Any]) -> fx.GraphModule:
    """``traced``'s values made again in this compilation's fake mode (the one make_fx
    takes: Dynamo's tracing context's): kernel meta functions and Inductor run in that mode,
    and a value of an earlier one does not mix with it. Where every value is plain (no
    gradient: inference graphs) they are built directly on meta storage, tensors that shared
    a storage sharing one again (gpt2, 128 values: 0.003 s); otherwise one ``from_tensor``
    converter makes them all, so a view stays a view of its base (0.02 s, against 0.1 s to
    trace again). A value that several nodes share stays one value."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    mode = torch._guards.detect_fake_mode(fake) or FakeTensorMode(allow_non_fake_inputs=True)
    metas = [n.meta for n in traced.graph.nodes if "val" in n.meta]
    outside: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext
    if all(trace_store.plain_value(m["val"]) for m in metas):
        convert, outside = _rebuilder(mode), unset_fake_temporarily
    else:

        def convert(t: torch.Tensor) -> torch.Tensor:
            return mode.from_tensor(t, static_shapes=True)

    made: dict[int, torch.Tensor] = {}  # id(old) -> new; the old ones live in the cache

    def again(t: torch.Tensor) -> torch.Tensor:
        new = made.get(id(t))
        if new is None:
            new = made[id(t)] = convert(t)
        return new

    with outside():
        for m in metas:
            v = m["val"]
            m["val"] = (
                again(v) if isinstance(v, torch.Tensor) else tree_map_only(torch.Tensor, again, v)
            )
    return traced


def _rebuilder(mode: FakeTensorMode) -> Any:
    """Fake tensors of ``mode`` with the shapes, strides, offsets and dtypes of earlier ones,
    built directly on meta storage (a tenth of ``from_tensor``'s cost); tensors that shared
    a storage share one again, so a view still aliases its base. Call it with no fake mode
    active (``unset_fake_temporarily``): the meta tensors must be real ones."""
    storages: dict[int, Any] = {}

    def convert(t: torch.Tensor) -> torch.Tensor:
        old = t.untyped_storage()
        layout = (t.shape, t.stride(), t.storage_offset(), t.dtype)
        return trace_store.fake_on_meta(mode, storages, old._cdata, old.nbytes(), layout, t.device)

    return convert


def _mode_calls() -> tuple[Any, ...]:
    """The calls a pre-dispatch graph switches grad or autocast mode with."""
    from torch.amp.autocast_mode import _enter_autocast, _exit_autocast

    return (torch._C._set_grad_enabled, _enter_autocast, _exit_autocast)


def _propagate_in_modes(traced: fx.GraphModule) -> None:
    """Recompute every node's fake value with each region's mode switched on.

    Pre-dispatch tracing records a region's mode switches without making them (it must not
    change global state), so the values make_fx leaves are those of the computation without
    the modes: a linear under ``torch.autocast(dtype=torch.bfloat16)`` reads float32, and so
    does everything downstream of it, where bfloat16 arrives at run time."""
    from torch.amp.autocast_mode import _enter_autocast, _exit_autocast
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    entered: list[Any] = []

    class InModes(FakeTensorProp):
        def run_node(self, n: fx.Node) -> Any:
            out = super().run_node(n)
            if n.target is _enter_autocast:
                entered.append(out)
            elif n.target is _exit_autocast and entered:
                entered.pop()
            return out

    inputs = [n.meta["val"] for n in traced.graph.nodes if n.op == "placeholder"]
    prop = InModes(traced, torch._guards.detect_fake_mode(inputs))  # make_fx's own fake mode
    with torch.set_grad_enabled(torch.is_grad_enabled()):
        try:
            prop.propagate_dont_convert_inputs(*inputs)
        finally:  # an error inside a region leaves no autocast mode behind
            for m in reversed(entered):
                m.__exit__(None, None, None)


def _wrap_mode_regions(traced: fx.GraphModule) -> fx.GraphModule:
    from torch._export.passes.replace_autocast_with_hop_pass import (
        replace_autocast_with_hop_pass,
    )
    from torch._export.passes.replace_set_grad_with_hop_pass import (
        replace_set_grad_with_hop_pass,
    )

    traced, _ = replace_set_grad_with_hop_pass(traced, None)
    traced, _ = replace_autocast_with_hop_pass(traced, None)
    return traced


def mode_regions(gm: fx.GraphModule, grad_enabled: bool) -> list[tuple[fx.GraphModule, bool]]:
    """Each region of a re-traced graph whose ops run as plain ATen ops, nested ones too, as
    ``(submodule, grad enabled)``: ``torch.no_grad()`` / ``torch.enable_grad()`` regions, and
    ``torch.autocast(..., enabled=False)`` regions (``grad_enabled``: the enclosing graph's
    mode), whose ops run in their own dtypes as outside any autocast (transformers' rotary
    embeddings compute their frequencies in one). Regions with autocast on are left out:
    their ops run in the autocast dtype, which no kernel call there would."""
    out = []
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        if n.target is torch.ops.higher_order.wrap_with_set_grad_enabled:
            sub, enabled = n.args[1], bool(n.args[0])
        elif n.target is torch.ops.higher_order.wrap_with_autocast and n.args[2] is False:
            sub, enabled = n.args[4], grad_enabled
        else:
            continue
        region = getattr(gm, str(cast(fx.Node, sub).target))
        out.append((region, enabled))
        out.extend(mode_regions(region, enabled))
    return out


def ambient_autocast(example_inputs: list[Any]) -> str:
    """The ``torch.autocast(...)`` the whole graph runs under ("" if none)."""
    devices = {"cpu"} | {x.device.type for x in example_inputs if isinstance(x, torch.Tensor)}
    for device in sorted(devices):
        if torch.is_autocast_enabled(device):
            return f"torch.autocast({device!r}, dtype={torch.get_autocast_dtype(device)})"
    return ""

"""Re-traced graphs kept on disk, so that a new process skips the re-trace (pdlkit/retrace.py).

    before: retrace.py kept a static-shape graph's prepared trace in memory only; a server
            restarted over warm caches re-traced every graph: about 0.12 s of a 0.6-1.0 s
            second compile (bert-mini, GPT-2 on a 2-core Xeon), where Inductor's own trace
            comes from its disk cache
    after:  the prepared trace is written as JSON beside the decision cache
            (``<PDLKIT_CACHE_DIR or ~/.cache/pdlkit>/autotune/traces/<key>.json``) and read back
            in a new process: nodes, call targets, arguments, fake values, source lines, the
            canonicalization's notes and the prepare pass's result

Kept: graphs of static shapes without submodules whose every part has a plain form: torch.ops
overloads (read back by looking their names up) and ``operator`` functions as targets;
numbers, strings, dtypes, devices, layouts, memory formats, nodes and lists of them as
arguments; dense fake values without gradient. Module attributes (the weights under Inductor's
freezing, which make_fx reads as ``_tensor_constant<i>``) are kept as the names of Dynamo's
attributes they are, and taken from the reading compilation's Dynamo graph by those names, so a
trace never carries weights. Any other graph is simply not kept. The key covers Dynamo's graph
and inputs (``_reuse_key``; with attributes, their names and layouts), torch's version and the
source of the passes that made the trace, so a new torch or pdlkit traces afresh.

A file is read through :func:`trust.read_private_file` from the private cache folder and parsed
as data (no pickle, no code); one that does not parse, fails its checksum or was written for
another key is ignored with one warning, and the trace is made and written again. Its values
are checked against Dynamo's own outputs, and its attributes against Dynamo's, before use.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import operator
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.passes.shape_prop import _extract_tensor_metadata
from torch.utils._pytree import tree_leaves, tree_map_only

from pdlkit.errors import PdlkitError
from pdlkit.kept_json import KeptJson, Unreadable

FORMAT = 1
_OPERATORS = {f"operator.{n}": getattr(operator, n) for n in ("getitem", "add", "mul", "neg")}
# the meta kept as data (``val`` and ``tensor_meta`` are made again); ``nn_module_stack``,
# ``source_fn_stack`` and ``from_node`` hold classes and objects, and are not kept: pdlkit reads
# none of them, and Inductor's compile of a kept graph hits its own cache (the cache key is
# the graph's code) or names its kernels without them
_KEEP = ("stack_trace", "seq_nr", "original_aten", "pdlkit_canonical")
_NAMED = ("placeholder", "get_attr", "output")  # nodes whose target is a name, not a call


class Unkept(PdlkitError):
    """A part of a graph with no plain form: the graph is not kept."""


@functools.cache
def _code_digest() -> str:
    """The source of the modules that make a prepared trace (a change re-traces); read as
    files (retrace.py imports this module)."""
    import importlib.util

    h = hashlib.sha256(torch.__version__.encode())
    for name in ("pdlkit.retrace", "pdlkit.matcher.canonicalize", "pdlkit.matcher.cse"):
        spec = importlib.util.find_spec(name)
        h.update(Path(str(spec.origin if spec else name)).read_bytes())
    return h.hexdigest()


@functools.cache
def _source(fn: Callable[..., Any]) -> str:
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return repr(fn)


def store_key(reuse_key: str, prepare: Callable[..., Any] | None = None) -> str:
    """The file name of a trace: ``retrace._reuse_key``'s, torch's version, the source of
    the modules that trace and of the ``prepare`` pass (a change to any traces afresh)."""
    text = f"{reuse_key}|{_code_digest()}|{_source(prepare) if prepare else ''}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def fetch(module: torch.nn.Module, target: str) -> Any:
    """The attribute a get_attr node's dotted ``target`` names, or None."""
    obj: Any = module
    for part in target.split("."):
        obj = getattr(obj, part, None)
    return obj


# -- encoding -----------------------------------------------------------------------------------


def _constants(traced: fx.GraphModule, source: fx.GraphModule | None) -> dict[str, str]:
    """Each attribute the trace reads (make_fx's ``_tensor_constant<i>``: under freezing, the
    weights) -> the attribute of Dynamo's graph that is the same tensor, by which a later
    process finds its own; :class:`Unkept` where one is no such tensor."""
    names = {str(n.target) for n in traced.graph.nodes if n.op == "get_attr"}
    if not names:
        return {}
    if source is None:
        raise Unkept("module attributes, and no Dynamo graph to find them in")
    gets = [str(n.target) for n in source.graph.nodes if n.op == "get_attr"]
    theirs = {id(fetch(source, target)): target for target in gets}
    out = {}
    for name in sorted(names):
        t = fetch(traced, name)
        if not isinstance(t, torch.Tensor) or id(t) not in theirs:
            raise Unkept(f"module attribute {name}, not one of Dynamo's graph")
        out[name] = theirs[id(t)]
    return out


def _target(t: Any) -> str:
    if isinstance(t, torch._ops.OpOverload):  # any namespace: read back by lookup in torch.ops
        return f"op:{t.namespace}::{t._opname}.{t._overloadname}"
    name = f"operator.{getattr(t, '__name__', '')}"
    if _OPERATORS.get(name) is t:
        return name
    raise Unkept(f"target {t!r}")


def _arg(a: Any) -> Any:
    if a is None or type(a) in (bool, int, str):
        return a
    if type(a) is float:
        return {"f": repr(a)}
    if isinstance(a, fx.Node):
        return {"n": a.name}
    if isinstance(a, list) or type(a) is tuple:  # fx's immutable_list is a list
        return {"l" if isinstance(a, list) else "t": [_arg(x) for x in a]}
    for kind in (torch.dtype, torch.device, torch.layout, torch.memory_format):
        if isinstance(a, kind):
            return {kind.__name__: str(a)}
    if isinstance(a, torch._ops.OpOverload):
        return {"op": _target(a)}
    raise Unkept(f"argument {a!r}")


def _val(v: Any, storages: dict[int, int]) -> Any:
    """A fake value as data: tensors as [shape, stride, offset, dtype, device, storage,
    bytes], their storages numbered so that views alias again."""
    if isinstance(v, torch.Tensor):
        if not plain_value(v):
            raise Unkept("a value that is not a plain fake tensor of static shape")
        s = v.untyped_storage()
        idx = storages.setdefault(s._cdata, len(storages))
        return {"T": [list(v.shape), list(v.stride()), v.storage_offset(), str(v.dtype),
                      str(v.device), idx, s.nbytes()]}  # fmt: skip
    if v is None or type(v) in (bool, int):
        return v
    if type(v) in (list, tuple):
        return {"l" if type(v) is list else "t": [_val(x, storages) for x in v]}
    raise Unkept(f"value {v!r}")


def _node(n: fx.Node, storages: dict[int, int], texts: dict[str, int]) -> dict[str, Any]:
    meta = {k: _arg(n.meta[k]) for k in _KEEP if k in n.meta}
    if isinstance(meta.get("stack_trace"), str):  # one copy of each source line's text
        meta["stack_trace"] = texts.setdefault(meta["stack_trace"], len(texts))
    if "val" in n.meta:
        meta["val"] = _val(n.meta["val"], storages)
    if "tensor_meta" in n.meta:
        meta["tensor_meta"] = True
    target = n.target if n.op in _NAMED else _target(n.target)
    return {"op": n.op, "name": n.name, "target": target, "args": _arg(n.args),
            "kwargs": {k: _arg(v) for k, v in n.kwargs.items()}, "meta": meta}  # fmt: skip


def encode(
    traced: fx.GraphModule, result: Any, source: fx.GraphModule | None = None
) -> dict[str, Any]:
    """``traced`` and its prepare result as data; :class:`Unkept` where a part has none.
    ``source``: Dynamo's graph, whose attributes the trace's may be (:func:`_constants`)."""
    if any(n.op == "call_module" for n in traced.graph.nodes):
        raise Unkept("module calls")
    storages: dict[int, int] = {}
    texts: dict[str, int] = {}
    nodes = [_node(n, storages, texts) for n in traced.graph.nodes]
    if result is not None and not isinstance(result, Counter):
        raise Unkept("a prepare result that is not a Counter")
    return {"nodes": nodes, "texts": list(texts), "attrs": _constants(traced, source),
            "result": None if result is None else dict(result)}  # fmt: skip


# -- decoding -----------------------------------------------------------------------------------


def _resolve(name: Any) -> Any:
    if not isinstance(name, str):
        raise Unreadable(f"target {name!r}")
    if name in _OPERATORS:
        return _OPERATORS[name]
    if not name.startswith("op:") or "::" not in name:
        raise Unreadable(f"target {name!r}")
    ns, _, rest = name[3:].partition("::")
    opname, _, overload = rest.rpartition(".")
    try:
        op = getattr(getattr(getattr(torch.ops, ns), opname), overload)
    except (AttributeError, RuntimeError) as e:
        raise Unreadable(f"no operator {name[3:]} in this process") from e
    if not isinstance(op, torch._ops.OpOverload):
        raise Unreadable(f"target {name!r}")
    return op


_KINDS = {"dtype": torch.dtype, "layout": torch.layout, "memory_format": torch.memory_format}


def _dearg(a: Any, env: dict[str, fx.Node]) -> Any:
    if a is None or type(a) in (bool, int, str):
        return a
    if not isinstance(a, dict) or len(a) != 1:
        raise Unreadable(f"argument {a!r}")
    ((tag, v),) = a.items()
    if tag == "n":
        return env[v]
    if tag in ("l", "t"):
        items = [_dearg(x, env) for x in v]
        return items if tag == "l" else tuple(items)
    if tag == "f":
        return float(v)
    if tag == "device":
        return torch.device(v)
    if tag == "op":
        return _resolve(v)
    kind = _KINDS.get(tag)
    value = getattr(torch, str(v).removeprefix("torch."), None) if kind else None
    if kind is None or not isinstance(value, kind):
        raise Unreadable(f"argument {a!r}")
    return value


def plain_value(val: Any) -> bool:
    """Whether every tensor in ``val`` is a dense strided fake tensor of static shape that
    needs no gradient (no autograd history to make again) and holds no constant or
    conjugate / negative bit: what :func:`fake_on_meta` makes again (and a file keeps)."""
    leaves = (val,) if isinstance(val, torch.Tensor) else tree_leaves(val)
    return all(
        type(t) is FakeTensor
        and t.layout == torch.strided
        and not t.requires_grad
        and not t.is_quantized
        and not t.is_conj()
        and not t.is_neg()
        and t.constant is None
        and all(type(d) is int for d in (*t.shape, *t.stride(), t.storage_offset()))
        for t in leaves
        if isinstance(t, torch.Tensor)
    )


def fake_on_meta(
    mode: FakeTensorMode, storages: dict[int, Any], key: int, nbytes: int,
    layout: tuple[Any, Any, Any, torch.dtype], device: torch.device,
) -> FakeTensor:  # fmt: skip
    """A fake tensor of ``mode`` with ``layout`` (shape, stride, offset, dtype) on the meta
    storage ``storages[key]`` (``nbytes`` made the first time), built directly (a tenth of
    ``from_tensor``'s cost): tensors of one key share a storage, so a view aliases its base.
    Call it with no fake mode active: the meta tensors must be real ones."""
    storage = storages.get(key)
    if storage is None:
        storage = storages[key] = torch.UntypedStorage(nbytes, device="meta")
    shape, stride, offset, dtype = layout
    elem = torch.empty(0, dtype=dtype, device="meta")
    elem.set_(storage, offset, shape, stride)
    return FakeTensor(mode, elem, device)


class _Values:
    """Fake tensors of ``mode`` from :func:`_val`'s data (:func:`fake_on_meta`, storages by
    their index in the file). Build them with no fake mode active."""

    def __init__(self, mode: FakeTensorMode):
        self.mode = mode
        self.storages: dict[int, Any] = {}

    def __call__(self, v: Any) -> Any:
        if v is None or type(v) in (bool, int):
            return v
        if not isinstance(v, dict) or len(v) != 1:
            raise Unreadable(f"value {v!r}")
        ((tag, x),) = v.items()
        if tag in ("l", "t"):
            items = [self(y) for y in x]
            return items if tag == "l" else tuple(items)
        if tag != "T":
            raise Unreadable(f"value {v!r}")
        shape, stride, offset, dtype, device, idx, nbytes = x
        layout = (shape, stride, offset, _dearg({"dtype": dtype}, {}))
        return fake_on_meta(self.mode, self.storages, idx, nbytes, layout, torch.device(device))


def decode(
    data: dict[str, Any], mode: FakeTensorMode, source: fx.GraphModule | None = None
) -> tuple[fx.GraphModule, Any]:
    """:func:`encode`'s data as a graph module whose values are fake tensors of ``mode`` and
    whose attributes are ``source``'s tensors of the names kept (Dynamo's graph's now)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.fx._lazy_graph_module import _LazyGraphModule
    from torch.fx.experimental.proxy_tensor import PythonKeyTracer

    graph = fx.Graph(tracer_cls=PythonKeyTracer)  # make_fx's, as the traced graph has it
    env: dict[str, fx.Node] = {}
    values = _Values(mode)
    with unset_fake_temporarily():
        for nd in data["nodes"]:
            op = nd["op"]
            target = nd["target"] if op in _NAMED else _resolve(nd["target"])
            args = _dearg({"t": nd["args"]["t"]}, env)
            kwargs = {k: _dearg(v, env) for k, v in nd["kwargs"].items()}
            n = graph.create_node(op, target, args, kwargs, name=nd["name"])
            if n.name != nd["name"]:
                raise Unreadable(f"node {nd['name']!r} named {n.name!r}")
            meta = nd["meta"]
            for k in _KEEP:
                if k in meta:
                    n.meta[k] = _dearg(meta[k], env)
            if "stack_trace" in meta:
                n.meta["stack_trace"] = data["texts"][meta["stack_trace"]]
            if "val" in meta:
                n.meta["val"] = values(meta["val"])
                if meta.get("tensor_meta"):
                    n.meta["tensor_meta"] = tree_map_only(
                        torch.Tensor, _extract_tensor_metadata, n.meta["val"]
                    )
            env[n.name] = n
    graph.lint()
    root = _attributes(graph, data["attrs"], source)
    result = data["result"]
    return _LazyGraphModule(root, graph, "GraphModule"), None if result is None else Counter(result)


def _attributes(graph: fx.Graph, attrs: dict[str, str], source: Any) -> dict[str, Any]:
    """The kept graph's attributes: ``source``'s tensors named in ``attrs``, each of the
    layout its get_attr node's value was traced with."""
    root = {}
    for n in graph.nodes:
        if n.op != "get_attr":
            continue
        t = None if source is None else fetch(source, attrs.get(str(n.target), ""))
        v = n.meta.get("val")
        if (
            not isinstance(t, torch.Tensor)
            or not isinstance(v, torch.Tensor)
            or _spec(t) != _spec(v)
        ):
            raise Unreadable(f"attribute {n.target}: not a tensor of Dynamo's graph as kept")
        root[str(n.target)] = t
    return root


# -- the files ----------------------------------------------------------------------------------


MAX_FILES = 128  # kept graphs; the least recently written go first (bert-mini's: 117 KB)
FILES = KeptJson("traces", FORMAT, MAX_FILES, "kept trace")


def save(
    key: str, traced: fx.GraphModule, result: Any, source: fx.GraphModule | None = None
) -> bool:
    """Keep ``traced`` (and its prepare result) under ``key``; False where it has no plain
    form or the cache folder is not usable (nothing is written then). ``source``: Dynamo's
    graph, where the trace's attributes come from (:func:`_constants`)."""
    try:
        body = encode(traced, result, source)
    except Unkept:
        return False
    return FILES.write(key, body)


def load(
    key: str, mode: FakeTensorMode, outputs: Any, source: fx.GraphModule | None = None
) -> tuple[fx.GraphModule, Any] | None:
    """The graph kept under ``key`` with its values in ``mode``, or None (none kept, or one
    that is unusable: said once, and the caller traces and keeps it again). ``outputs``:
    Dynamo's output values, which the kept graph's must match in shape, stride and dtype;
    ``source``: Dynamo's graph, whose tensors the kept graph's attributes become."""
    data = FILES.read(key)
    if data is None:
        return None
    try:
        gm, result = decode(data, mode, source)
        _check_outputs(gm, outputs)
        return gm, result
    except (ValueError, KeyError, TypeError, IndexError, AttributeError, RuntimeError) as e:
        FILES.ignore(key, e)
        return None


def _spec(t: Any) -> Any:
    return (tuple(t.shape), tuple(t.stride()), t.dtype) if isinstance(t, torch.Tensor) else t


def _check_outputs(gm: fx.GraphModule, outputs: Any) -> None:
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    ours = [
        _spec(v.meta.get("val")) if isinstance(v, fx.Node) else v for v in tree_leaves(out.args)
    ]
    theirs = [_spec(v) for v in tree_leaves(outputs)]
    if ours != theirs:
        raise Unreadable("its outputs are not Dynamo's")

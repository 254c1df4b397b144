"""pdlkit inside ``torch.distributed``: DTensor graphs, functional collectives, rank agreement.

    before: torch.compile(tp_model, backend="pdlkit")   # DTensor parameters, a DeviceMesh input
            -> BackendCompilerFailed: ... '__obj_flatten__' on a FakeScriptObject
    after:  every rank's local GEMMs are kernel calls; the collectives stay with Inductor

What makes a distributed graph compile like any other:

* **Tensor subclasses (DTensor) are desugared** (:func:`compile_desugared`): the pre-dispatch
  re-trace cannot see through a DTensor (its ops dispatch below autograd), so the graph is
  first traced with the subclasses rebuilt from their local tensors, as AOT autograd does:
  the result is a graph over plain local tensors, with DTensor's sharded ops spelled as
  local ATen ops and ``_c10d_functional.*`` collectives (``all_reduce`` -> ``wait_tensor``).
  Opaque inputs (the ``DeviceMesh``, process groups) are constants of that trace, never
  fakified. The compiled function unwraps the real DTensors and wraps the outputs again.
  torchao's weight subclasses (``quantize_``'s ``Int8Tensor``) go the same way, traced at
  the pre-dispatch level where that works (:func:`_pre_dispatch`).
* **Collectives are never matched into** (:func:`is_collective`, used by
  ``matcher/to_mlir.py``): they and ops with opaque arguments stay outside the imported
  graph, so no replaced subgraph contains a collective. A kernel that declines a call runs
  its replaced subgraph, which is local computation only: ranks that take different paths
  still issue the same collectives in the same order, and cannot hang each other. Paths can
  differ between ranks where a decline depends on the rank's data (a kernel that declines
  NaN / inf inputs), on its shard's shape (uneven shards: a shape rule holds on one rank
  only, decided at compile time) or on a first-call verification (``verify="first_call"``
  switches a disagreeing site off on that rank); then only the numbers differ, by the
  kernel's tolerance. Making every call agree would cost a collective per call; it is not done.
* **Ranks agree before compiling** (:func:`checked_options`): the process group must be
  initialized; every rank's pattern and kernel files are hashed and compared through the
  process group's store with a bounded wait (``PDLKIT_DIST_TIMEOUT`` seconds, default 120),
  and a disagreement names the rank and the file on every rank; measured kernel choice
  (autotune) is off in graphs with collectives, because timings differ between ranks and a
  whole-graph timing run would issue its collectives a rank-dependent number of times.
* **FSDP2 parameters are not pre-packed** (:func:`without_prepack`): FSDP2 refills the
  gathered parameters in place without a version bump, which the pre-pack cache cannot see.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import warnings
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import torch
import torch.fx as fx
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from pdlkit import config
from pdlkit.errors import ConfigError
from pdlkit.runtime_abi.registry import Restricted

TIMEOUT_ENV = "PDLKIT_DIST_TIMEOUT"
_COLLECTIVE_NAMESPACES = frozenset(
    {"_c10d_functional", "c10d_functional", "_c10d_functional_autograd", "c10d", "_dtensor"}
)


class DistributedError(ConfigError):
    """A distributed compilation pdlkit cannot do as asked: no process group, ranks with
    different pattern or kernel files, a pattern that names a collective."""


# -- what is a collective ----------------------------------------------------------------------


def is_collective(node: fx.Node) -> bool:
    """Whether ``node`` calls a collective or a ``wait_tensor`` (``torch.ops._c10d_functional``
    and the other c10d namespaces)."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return False
    return target.namespace in _COLLECTIVE_NAMESPACES


def has_opaque_argument(node: fx.Node) -> bool:
    """Whether an op takes a script object or an opaque object (a process group, a mesh):
    the Torch dialect has no type for those, so such an op is not imported."""
    target = node.target
    schema = getattr(target, "_schema", None)
    if schema is not None and any(isinstance(a.type, torch._C.ClassType) for a in schema.arguments):
        return True
    return any(is_opaque_object(a) for a in (*node.args, *node.kwargs.values()))


def is_opaque_object(value: Any) -> bool:
    """A script object or opaque object, real or Dynamo's fake stand-in for one."""
    from torch._library.fake_class_registry import FakeScriptObject

    return isinstance(value, torch.ScriptObject | FakeScriptObject)


def collectives(gm: fx.GraphModule) -> list[fx.Node]:
    """The collective calls of ``gm``: ATen-level ops, or Dynamo's calls of
    ``torch.distributed._functional_collectives`` functions."""
    out = []
    for n in gm.graph.nodes:
        module = getattr(n.target, "__module__", None) or ""
        if is_collective(n) or (
            n.op == "call_function" and module.startswith("torch.distributed._functional_coll")
        ):
            out.append(n)
    return out


# -- DTensor (tensor subclass) graphs ----------------------------------------------------------


def _is_subclass(v: Any) -> bool:
    return isinstance(v, torch.Tensor) and is_traceable_wrapper_subclass(v)


def is_torchao(t: Any) -> bool:
    """Whether ``t`` is one of torchao's tensor subclasses (``quantize_``'s weights)."""
    return type(t).__module__.split(".")[0] == "torchao"


def subclass_weights(model: Any) -> list[str]:
    """A note on a module whose parameters or buffers are torchao tensor subclasses
    (``quantize_`` makes its weights ``Int8Tensor`` and the like), shown when nothing matched:
    their ops reach the graph as the subclass dispatches them, and the shipped patterns take
    only the int8 dynamic and weight-only configs' linears on CUDA (matcher/canonical_int8.py,
    patterns/cuda/torchao_weight_only.pdl.mlir). Empty for other tensors (a DTensor's graph
    is matched as its local ops) and for a model that is not a module."""
    if not isinstance(model, torch.nn.Module):
        return []
    kinds = Counter(
        f"{type(t).__module__}.{type(t).__qualname__}"
        for t in [*model.parameters(), *model.buffers()]
        if is_torchao(t)
    )
    if not kinds:
        return []
    found = ", ".join(f"{name} x{n}" for name, n in kinds.most_common())
    return [
        f"the model's weights are torchao tensor subclasses ({found}): their ops reach the "
        "graph as the subclass dispatches them; pdlkit's shipped patterns take the linears of "
        "torchao's Int8DynamicActivationInt8WeightConfig and Int8WeightOnlyConfig on CUDA "
        "only, and otherwise int8 graphs as PT2E or `pdlkit.quantization.quantize` makes them"
    ]


def has_subclass_inputs(gm: fx.GraphModule, example_inputs: list[Any]) -> bool:
    """Whether Dynamo's graph takes a tensor subclass (a DTensor parameter or input)."""
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    vals = [n.meta.get("example_value") for n in phs]
    return any(_is_subclass(v) for v in (*vals, *example_inputs))


@dataclass(frozen=True)
class _Sub:
    """How to rebuild one subclass value from its parts."""

    cls: type
    inner: dict[str, Any]  # attribute -> _Sub, ("leaf", i) or ("const", object)
    ctx: Any
    size: tuple[Any, ...]
    stride: tuple[Any, ...]


def _flatten(
    v: Any, real: Any, leaves: list[Any], paths: list[tuple[Any, ...]], path: tuple
) -> Any:
    """A description of ``v`` whose tensors are numbered leaves; opaque parts come from
    ``real`` (the real mesh, never a fake stand-in)."""
    if _is_subclass(v):
        attrs, ctx = v.__tensor_flatten__()
        inner = {}
        for a in attrs:
            part, real_part = getattr(v, a), getattr(real, a, None)
            if isinstance(part, torch.Tensor):
                inner[a] = _flatten(part, real_part, leaves, paths, (*path, a))
            else:
                inner[a] = ("const", real_part if real_part is not None else part)
        return _Sub(type(v), inner, ctx, tuple(v.size()), tuple(v.stride()))
    if isinstance(v, torch.Tensor):
        leaves.append(v)
        paths.append(path)
        return ("leaf", len(leaves) - 1)
    return ("const", real)


def _rebuild(spec: Any, plain: Any) -> Any:
    if isinstance(spec, _Sub):
        inner = {k: _rebuild(s, plain) for k, s in spec.inner.items()}
        return spec.cls.__tensor_unflatten__(inner, spec.ctx, spec.size, spec.stride)  # type: ignore[attr-defined]
    kind, x = spec
    return plain[x] if kind == "leaf" else x


def _leaf(arg: Any, path: tuple[Any, ...]) -> Any:
    for a in path[1:]:
        arg = getattr(arg, a)
    return arg


@dataclass
class Desugared:
    """Dynamo's graph over local tensors, and how to call it with Dynamo's arguments."""

    gm: fx.GraphModule
    inputs: list[Any]  # the real local tensors (and SymInts) of the example inputs
    in_paths: list[tuple[Any, ...]]  # leaf i = getattr chain path[1:] of argument path[0]
    out_specs: list[Any]  # per output: None (plain, one leaf) or a _Sub over its leaves

    def call(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` (compiled from :attr:`gm`) as Dynamo calls it: DTensors in, DTensors out."""
        paths, specs = self.in_paths, self.out_specs

        def run(*args: Any) -> Any:
            outs = fn(*[_leaf(args[p[0]], p) for p in paths])
            if all(s is None for s in specs):
                return outs
            return _unflatten_outputs(list(outs), specs)

        return run


def _unflatten_outputs(flat: list[Any], specs: list[Any]) -> tuple[Any, ...]:
    out, i = [], 0
    for s in specs:
        if s is None:
            out.append(flat[i])
            i += 1
        else:
            n = _count_leaves(s)
            out.append(_rebuild(s, flat[i : i + n]))
            i += n
    return tuple(out)


def _count_leaves(spec: Any) -> int:
    if isinstance(spec, _Sub):
        return sum(_count_leaves(s) for s in spec.inner.values())
    return 1 if spec[0] == "leaf" else 0


def _renumber(spec: Any, start: int) -> Any:
    if isinstance(spec, _Sub):
        return replace(spec, inner={k: _renumber(s, start) for k, s in spec.inner.items()})
    return ("leaf", spec[1] - start) if spec[0] == "leaf" else spec


def _pre_dispatch(f: Callable[..., Any], leaves: list[Any], vals: list[Any]) -> Any:
    """The desugared graph at the pre-dispatch level, where every subclass input is torchao's
    (``Int8Tensor`` and the like, whose linear is a ``__torch_function__`` over plain
    tensors): ``scaled_dot_product_attention`` stays one op there, and torchao's own
    ``choose_qparams_affine`` / ``quantize_affine`` ops show, where the post-dispatch trace
    spells them as their backend's ops. None where some input is another subclass (a
    DTensor dispatches below autograd) or the trace leaves a subclass value in the graph."""
    from torch.fx.experimental.proxy_tensor import make_fx

    subs = [v for v in vals if _is_subclass(v)]
    if not subs or not all(is_torchao(v) for v in subs):
        return None
    try:
        traced = make_fx(f, tracing_mode="fake", pre_dispatch=True)(*leaves)
    except Exception:  # the post-dispatch trace, as for any subclass
        return None
    if any(_is_subclass(n.meta.get("val")) for n in traced.graph.nodes):
        return None
    return traced


def desugar(gm: fx.GraphModule, example_inputs: list[Any]) -> Desugared:
    """Trace ``gm`` over the local tensors of its subclass inputs (see the module's doc).

    Before: ``linear(DTensor x, DTensor w, DTensor b)`` -> ``redistribute`` -> ``to_local``.
    After: ``addmm(b_local, x_local, t(w_local))`` -> ``_c10d_functional.all_reduce`` ->
    ``wait_tensor``, as each rank runs it. Raises :class:`DistributedError` for what cannot
    be traced this way (a subclass output whose size is symbolic)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    fake_vals = [n.meta.get("example_value") for n in phs]
    if len(fake_vals) != len(example_inputs) or any(v is None for v in fake_vals):
        from torch._subclasses.fake_tensor import FakeTensorMode

        mode0 = torch._guards.detect_fake_mode(example_inputs) or FakeTensorMode()
        fake_vals = [
            mode0.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in example_inputs
        ]
    leaves: list[Any] = []
    paths: list[tuple[Any, ...]] = []
    specs = [
        _flatten(v, real, leaves, paths, (i,))
        for i, (v, real) in enumerate(zip(fake_vals, example_inputs, strict=True))
    ]
    out_specs: list[Any] = []

    def f(*plain: Any) -> list[Any]:
        args = [_rebuild(s, plain) for s in specs]
        outs = fx.Interpreter(gm).run(*args)
        flat: list[Any] = []
        out_specs.clear()
        for o in outs if isinstance(outs, tuple | list) else (outs,):
            if _is_subclass(o):
                start = len(flat)
                spec = _flatten(o, o, flat, [], ())
                out_specs.append(_renumber(spec, start))
            else:
                out_specs.append(None)
                flat.append(o)
        return flat

    mode = torch._guards.detect_fake_mode(leaves)
    allow = mode.allow_non_fake_inputs if mode is not None else False
    try:
        if mode is not None:
            mode.allow_non_fake_inputs = True
        traced = _pre_dispatch(f, leaves, fake_vals) or make_fx(f, tracing_mode="fake")(*leaves)
    finally:
        if mode is not None:
            mode.allow_non_fake_inputs = allow
    for s in out_specs:
        if s is not None and not all(isinstance(d, int) for d in (*s.size, *s.stride)):
            raise DistributedError(
                f"a {s.cls.__name__} output with a symbolic size ({list(s.size)}): pdlkit "
                "re-traces tensor-subclass graphs with static shapes only; compile with dynamic=False"
            )
    for n, v in zip((n for n in traced.graph.nodes if n.op == "placeholder"), leaves, strict=True):
        n.meta["example_value"] = n.meta.get("val", v)  # the re-trace reuses Dynamo's fake mode
    real = [_leaf(example_inputs[p[0]], p) for p in paths]
    return Desugared(traced, real, paths, list(out_specs))


def _needs_grad(example_inputs: list[Any]) -> bool:
    return torch.is_grad_enabled() and any(
        isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs
    )


def nothing_substituted(*args: Any) -> Any:
    """What a backend returns for a desugared graph in which nothing was substituted, in
    place of its code (:func:`compile_desugared` compiles Dynamo's graph instead)."""
    raise AssertionError("a marker, not code: compile_desugared compiles Dynamo's graph")


def compile_desugared(
    backend: Callable[..., Any],
    gm: fx.GraphModule,
    example_inputs: list[Any],
    plain: Callable[[], Callable[..., Any]] | None = None,
    **kw: Any,
) -> Callable[..., Any]:
    """Compile a graph with tensor-subclass inputs (DTensor, torchao's int8 weights):
    desugared, then through ``backend`` like any graph of plain tensors; where ``backend``
    substituted nothing (it returns :func:`nothing_substituted`), ``plain()``: Dynamo's graph
    as ``torch.compile`` compiles it, the numbers and Inductor's cache entries its own. A graph
    that needs gradients goes to Inductor whole, with a warning: the desugaring trace runs
    below autograd (inference only)."""
    from torch._inductor.compile_fx import compile_fx

    if _needs_grad(example_inputs):
        warnings.warn(
            "pdlkit: a graph with DTensor inputs that needs gradients is compiled by Inductor "
            "alone (pdlkit substitutes DTensor graphs for inference: run under torch.no_grad())",
            stacklevel=3,
        )
        return cast(Callable[..., Any], compile_fx(gm, example_inputs))
    d = desugar(gm, example_inputs)
    fn = backend(d.gm, d.inputs, **kw)
    if fn is nothing_substituted:
        assert plain is not None, "a backend marks nothing substituted only when given plain"
        return plain()
    return d.call(fn)


# -- checks every rank makes before substituting ------------------------------------------------


def _world() -> tuple[int, int] | None:
    """(rank, world size) of the default process group, None when there is none."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return None
    return dist.get_rank(), dist.get_world_size()


def check_process_group(gm: fx.GraphModule) -> None:
    """A graph with collectives needs an initialized process group for each group it names."""
    nodes = collectives(gm)
    if not nodes:
        return
    if _world() is None:
        raise DistributedError(
            f"the graph calls {nodes[0].target} (node {nodes[0].name!r}) but torch.distributed's "
            "default process group is not initialized: call torch.distributed.init_process_group"
            "(...) on every rank before the first call of the compiled model"
        )
    from torch.distributed.distributed_c10d import _resolve_process_group

    for n in nodes:
        schema = n.target._schema  # type: ignore[union-attr]
        for i, a in enumerate(schema.arguments):
            if a.name != "group_name":
                continue
            name = n.args[i] if i < len(n.args) else n.kwargs.get("group_name")
            try:
                _resolve_process_group(cast(Any, name))
            except (RuntimeError, ValueError) as e:
                raise DistributedError(
                    f"the graph calls {n.target} (node {n.name!r}) on process group {name!r}, "
                    "which this process does not have: create it on every rank before compiling"
                ) from e


_COLLECTIVE_NAME = re.compile(
    r'"(?:torch\.)?_?c10d(?:_functional)?(?:_autograd)?\.\w+"|"wait_tensor"'
)
_PATTERN_START = re.compile(r"pdl\.pattern\s+@(\w+)|^\s*Pattern\s+(\w+)")


def _collective_patterns(plan: Any) -> list[str]:
    """``file:line`` of each enabled pattern that names a collective op. Collectives import
    as ``torch.operator`` with the op's name as an attribute, so the names are read from the
    pattern files' text (PDL or PDLL), at the line that names them."""
    enabled = {p.name for p in plan.patterns.patterns if p.enabled}
    out = []
    for f in plan.patterns.files:
        current = None
        for i, line in enumerate(Path(f).read_text().splitlines(), 1):
            start = _PATTERN_START.search(line)
            if start:
                current = start.group(1) or start.group(2)
            hit = _COLLECTIVE_NAME.search(line.split("//")[0])
            if hit and current in enabled:
                out.append(
                    f"{f}:{i}: pattern {current!r} matches the collective {hit.group(0)}: "
                    "collectives stay with Inductor (no kernel declares one), so this pattern "
                    "never matches; match the ops before or after the collective instead, or "
                    "disable the pattern in a manifest"
                )
    return out


def plan_files(opts: Any) -> dict[str, str]:
    """sha256 of every pattern and kernel file this compilation loads, by a name that does
    not depend on where the folder is (``patterns[0]/x86/qlinear.pdl.mlir``)."""
    out: dict[str, str] = {}
    kinds = (
        ("patterns", config.pattern_paths(opts.patterns)),
        ("kernels", config.kernel_paths(opts.kernels)),
    )
    for kind, roots in kinds:
        for i, root in enumerate(roots):
            for f in _files(root, kind == "kernels"):
                rel = f.name if root.is_file() else str(f.relative_to(root))
                out[f"{kind}[{i}]/{rel}"] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


def _files(root: Path, sources: bool) -> Iterable[Path]:
    yield from config.files_under([root])
    if sources and root.is_dir():  # native kernels' C sources are part of the kernel set
        yield from config.files_under([root], (".c", ".h", ".cc", ".cpp"))


_AGREED: dict[tuple[int, str], None] = {}
_ATTEMPTS: dict[int, int] = {}  # per process group: checks begun (each uses fresh store keys)


def _timeout() -> float:
    raw = os.environ.get(TIMEOUT_ENV, "120")
    try:
        value = float(raw)
    except ValueError:
        raise DistributedError(f"{TIMEOUT_ENV}={raw!r} is not a number of seconds") from None
    if value <= 0:
        raise DistributedError(f"{TIMEOUT_ENV}={raw!r} must be positive")
    return value


def agree_on_files(files: dict[str, str], what: str = "pattern and kernel files") -> None:
    """Every rank of the default group publishes ``files`` (name -> sha256) in the group's
    store and compares with rank 0's; a rank that does not publish within the timeout and
    any difference are a :class:`DistributedError` naming the rank and the file. Done once
    per process group and file set."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _get_default_store

    world = _world()
    if world is None or world[1] == 1:
        return
    rank, size = world
    digest = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()
    group_id = id(dist.group.WORLD)
    if (group_id, digest) in _AGREED:
        return
    seq = _ATTEMPTS.get(group_id, 0)  # every rank begins the same checks in the same order
    _ATTEMPTS[group_id] = seq + 1
    store = _get_default_store()
    key = f"pdlkit/plan/{seq}/"
    store.set(key + str(rank), json.dumps(files, sort_keys=True))
    keys = [key + str(r) for r in range(size)]
    seconds = _timeout()
    try:
        store.wait(keys, timedelta(seconds=seconds))
    except (RuntimeError, dist.DistStoreError) as e:
        missing = [r for r, k in enumerate(keys) if not store.check([k])]
        raise DistributedError(
            f"rank {rank}: rank(s) {missing} did not reach pdlkit's compile-time check of the "
            f"{what} within {seconds:g} s ({TIMEOUT_ENV}); did they fail to compile, or "
            "compile with another backend?"
        ) from e
    theirs = {r: json.loads(store.get(k)) for r, k in enumerate(keys)}
    problems = _differences(theirs)
    if problems:
        raise DistributedError(
            f"rank {rank}: ranks disagree on the {what} (every rank must load the same ones; "
            f"check {config.PATTERN_ENV} / {config.KERNEL_ENV} and the options): "
            + "; ".join(problems[:8])
            + (f"; and {len(problems) - 8} more" if len(problems) > 8 else "")
        )
    _AGREED[(group_id, digest)] = None


def _differences(by_rank: dict[int, dict[str, str]]) -> list[str]:
    base = by_rank[0]
    out = []
    for r, files in sorted(by_rank.items()):
        for name in sorted(set(base) | set(files)):
            a, b = base.get(name), files.get(name)
            if a == b:
                continue
            if a is None:
                out.append(f"rank {r} loads {name}, rank 0 does not")
            elif b is None:
                out.append(f"rank 0 loads {name}, rank {r} does not")
            else:
                out.append(f"{name} differs between rank 0 ({a[:12]}) and rank {r} ({b[:12]})")
    return out


# -- FSDP2: parameters refilled in place ----------------------------------------------------------


def fsdp_managed_inputs(gm: fx.GraphModule) -> list[str]:
    """Dynamo's inputs that are parameters of modules managed by FSDP2 (``fully_shard``)."""
    out = []
    for n in gm.graph.nodes:
        if n.op != "placeholder":
            continue
        source = getattr(n.meta.get("grapharg"), "source", None)
        while source is not None:
            if type(source).__name__ == "FSDPNNModuleSource":
                out.append(n.name)
                break
            source = getattr(source, "base", None)
    return out


_STALE = (
    "FSDP2 refills the gathered parameters in place without a version bump, so a weight "
    "pre-packed once would go stale after an optimizer step or a load_state_dict"
)


def without_prepack(registry: Any) -> Any:
    """``registry`` offering only kernels that pre-pack nothing; the others are passed over
    with the reason (near misses in ``explain``)."""
    return Restricted(
        registry, lambda k: f"pre-packs its weight, and {_STALE}" if k.prepack else None
    )


def checked_options(gm: fx.GraphModule, opts: Any, plan: Any) -> tuple[Any, Any]:
    """``(opts, plan)`` for this graph: with FSDP2-managed parameters, kernels that pre-pack
    are not offered; for a graph with collectives, after the checks every rank makes
    together (the module's doc), with autotune off. Other graphs' unchanged."""
    if fsdp_managed_inputs(gm):
        plan = replace(plan, registry=without_prepack(plan.registry))
    if not collectives(gm):
        return opts, plan
    check_process_group(gm)
    agree_on_files(plan_files(opts))
    named = _collective_patterns(plan)
    if named:  # the same files on every rank (checked above): every rank raises this
        raise DistributedError("; ".join(named))
    return replace(opts, autotune="off"), plan

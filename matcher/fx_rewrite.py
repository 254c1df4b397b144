"""The FX rewrite: substitution records (matcher/match.py) replayed on the FX graph.

    before: linear = aten.linear(x, w, b); gelu = aten.gelu(linear); return (gelu,)
    after:  linear_gelu = pdlkit.linear_gelu_numba(x, w, b, 'none', <site id>); return (linear_gelu,)

Each record becomes one call of the kernel's ``torch.ops.pdlkit`` op whose last argument is
its call site's id (runtime_abi/sites.py): the site holds the replaced subgraph (the per-call
fallback, runtime_abi/fallback.py), the verification and per-bucket dispatch wrapped around
each call, and what explain and errors name (pattern, node, the user's source line). What
the calls replaced is erased when nothing else reads it; the graph is linted.
"""

from __future__ import annotations

import hashlib
import operator
from typing import Any, cast

import torch
import torch.fx as fx
from pdlkit.matcher.canonicalize import weight_views
from pdlkit.matcher.match import MatchSession
from pdlkit.matcher.records import Const, ListRef, NodeRef, Record, Ref, SubRef, root_of
from pdlkit.matcher.report import Substitution, describe_value
from pdlkit.runtime_abi.binding import CallSite, bind, needs_guard, new_site
from pdlkit.runtime_abi.fallback import ReplacedSubgraph, SubgraphSpec
from pdlkit.runtime_abi.verify import FirstCallVerifier, resolve_mode


def fallback_module(gm: fx.GraphModule, s: MatchSession, rec: Record) -> ReplacedSubgraph:
    bindings: list[tuple[int, int | None, fx.Node]] = []
    for i, r in enumerate(rec.args):
        if isinstance(r, ListRef):
            bindings += [
                (i, j, s.fx_node(x))
                for j, x in enumerate(r.items)
                if isinstance(x, NodeRef | SubRef)
            ]
        elif isinstance(r, NodeRef | SubRef):
            bindings.append((i, None, s.fx_node(r)))
    nodes = tuple((n, n.op, n.target, n.args, dict(n.kwargs)) for n in rec.slice)
    return ReplacedSubgraph(
        gm, SubgraphSpec(tuple(bindings), nodes, tuple(rec.outputs), len(rec.args))
    )


def _intercept(rec: Record, mode: str | None) -> Any:
    """What wraps each call of the site: per-bucket choice (dynamic dims), first-call
    verification of the kernel it runs, both, or neither."""
    verifier = (
        FirstCallVerifier(rec.pattern.tolerance, rec.pattern.timeout)
        if mode == "first_call"
        else None
    )
    if rec.dispatch is None:
        return verifier
    rec.dispatch.inner = verifier
    return rec.dispatch


def _fingerprint(gm: fx.GraphModule) -> str:
    """What makes two compiled graphs' call sites interchangeable: the graph's text, its
    inputs' shapes and dtypes, and the identity of its constants (with Inductor's freezing,
    the weights: two models of one architecture must not share sites then).

    Not graph_guard.graph_key: that one keys a verdict cached on disk for later processes,
    so it holds no object identity (and names the kernels and the inputs' devices)."""
    h = hashlib.sha256(str(gm.graph).encode())
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            v = n.meta.get("val")
            h.update(repr((getattr(v, "shape", v), getattr(v, "dtype", None))).encode())
        elif n.op == "get_attr":
            obj: Any = gm
            for part in str(n.target).split("."):
                obj = getattr(obj, part, None)
            h.update(f"{n.target}={id(obj)}".encode())
    return h.hexdigest()


def _site_key(graph_id: str, rec: Record, site: CallSite) -> int:
    """A call site's id, stable across compilations of the same graph (binding.new_site):
    the constant Inductor's FX graph cache sees is then the same, and a recompile after
    ``torch._dynamo.reset()`` finds the code it compiled before."""
    k = rec.kernel
    text = "|".join(
        map(
            str,
            (
                graph_id,
                site.node,
                k.name,
                k.version,
                k.digest,
                rec.pattern.where,
                site.verify,
                type(site.intercept).__name__,
                rec.pattern.tolerance,
                site.transposed,
                site.guard,
            ),
        )  # fmt: skip
    )
    return int(hashlib.sha256(text.encode()).hexdigest()[:15], 16) | (1 << 61)


def _user_line(node: fx.Node) -> str:
    trace = node.meta.get("stack_trace") or ""
    lines = [ln.strip() for ln in trace.strip().splitlines() if ln.strip().startswith("File ")]
    if not lines:
        return ""
    last = lines[-1]  # File "model.py", line 12, in forward
    try:
        file = last.split('"')[1]
        line = last.split(", line ")[1].split(",")[0]
        return f"{file}:{line}"
    except IndexError:
        return last


def _call_goes(
    graph: fx.Graph, s: MatchSession, rec: Record, outs_of: dict[int, list[fx.Node]]
) -> Any:
    """Where a record's kernel call is inserted (see ``MatchSession._placement``)."""
    if rec.after is None:  # before the first root
        return graph.inserting_before(min(map(root_of, rec.outputs), key=s.order.__getitem__))
    a = rec.after  # right after an argument computed after the first root
    return graph.inserting_after(outs_of[a.record][-1] if isinstance(a, SubRef) else s.fx_node(a))


def rewrite_fx(gm: fx.GraphModule, s: MatchSession, verify: bool | str) -> list[Substitution]:
    """Replay ``s.records`` on ``gm`` (the graph they were matched on), in place; one
    :class:`Substitution` (for the report) per record."""
    graph = gm.graph
    mode = resolve_mode(verify)
    fallbacks = [fallback_module(gm, s, rec) for rec in s.records]  # before any edit
    outs_of: dict[int, list[fx.Node]] = {}
    subs: list[Substitution] = []
    views: list[fx.Node] = []  # canonical t(weight) nodes that call sites took over

    def arg(r: Ref) -> Any:
        if isinstance(r, Const):
            return r.value
        if isinstance(r, ListRef):
            return [arg(x) for x in r.items]
        if isinstance(r, SubRef):
            return outs_of[r.record][r.index]
        return s.fx_node(r)

    graph_id = _fingerprint(gm)  # before any edit
    for k, rec in enumerate(s.records):
        anchor = max(rec.outputs, key=lambda n: s.order.get(n, -1))
        root = cast(fx.Node, anchor.args[0]) if anchor.target is operator.getitem else anchor
        args = [arg(r) for r in rec.args]
        transposed = weight_views(rec.kernel, args)
        for i in transposed:
            views.append(cast(fx.Node, args[i]))
            args[i] = views[-1].args[0]  # the parameter; the site transposes it
        site = CallSite(
            kernel=rec.kernel,
            pattern=f"{rec.pattern.name} ({rec.pattern.where})",
            node=root.name,
            user_line=_user_line(root),
            fallback=fallbacks[k],
            verify=mode == "strict",
            intercept=_intercept(rec, mode),
            guard=needs_guard(rec.kernel, [s.example(r) for r in rec.args]),
            transposed=transposed,
        )
        op = bind(rec.kernel)
        with _call_goes(graph, s, rec, outs_of):
            call = graph.call_function(
                op, (*args, new_site(site, gm, _site_key(graph_id, rec, site)))
            )
        outs = _take_over(graph, call, root, rec.outputs)
        outs_of[k] = outs
        subs.append(
            Substitution(
                pattern=rec.pattern.name,
                pattern_where=rec.pattern.where,
                op=rec.op,
                kernel=rec.kernel.name,
                kernel_source=rec.kernel.source,
                root=root.name,
                replaced=[],
                args=[describe_value(a) if not isinstance(a, list) else repr(a) for a in args],
                user_line=site.user_line,
                passed_over=rec.passed_over,
                tuning=rec.tuning,
            )
        )
    _erase_replaced(graph, s, views, subs)
    graph.lint()
    return subs


def _take_over(
    graph: fx.Graph, call: fx.Node, root: fx.Node, outputs: list[fx.Node]
) -> list[fx.Node]:
    """Make ``call`` (and a getitem per output, for several) compute ``outputs``' values:
    their meta moves over and their users read the call instead."""
    call.meta.update(
        {k: v for k, v in root.meta.items() if k in ("stack_trace", "nn_module_stack")}
    )
    vals = [o.meta.get("val") for o in outputs]
    if len(outputs) == 1:
        call.meta["val"] = vals[0]
        outs = [call]
    else:
        call.meta["val"] = tuple(vals)
        outs = []
        for j, v in enumerate(vals):
            with graph.inserting_after(outs[-1] if outs else call):
                g = graph.call_function(operator.getitem, (call, j))
            g.meta["val"] = v
            outs.append(g)
    for orig, new in zip(outputs, outs, strict=True):
        orig.replace_all_uses_with(new)
    return outs


def _erase_replaced(
    graph: fx.Graph, s: MatchSession, views: list[fx.Node], subs: list[Substitution]
) -> None:
    """Erase what the calls left dead, and name it in each substitution's ``replaced``.
    Only what a substitution replaced can have become dead; the rest is Inductor's to clean."""
    for n in sorted(
        {n for rec in s.records for n in rec.slice}, key=s.order.__getitem__, reverse=True
    ):
        if not n.users and (not n.is_impure() or _deterministic(n)):
            graph.erase_node(n)
    for n in dict.fromkeys(views):
        if not n.users:
            graph.erase_node(n)
    alive = set(graph.nodes)
    for rec, sub in zip(s.records, subs, strict=True):
        sub.replaced = [n.name for n in reversed(rec.slice) if n not in alive]


def _deterministic(n: fx.Node) -> bool:
    """An op FX counts impure (every nondeterministic-seeded op) that is deterministic here:
    ``aten.dropout(x, p, train=False)``, the identity, and ``scaled_dot_product_attention``
    with dropout_p 0 (its default). A pattern that reads through one (linear -> dropout ->
    add, QKV -> SDPA -> quantize) leaves it dead, and with it what fed it, in the graph users
    see."""
    aten = torch.ops.aten
    if n.target is aten.dropout.default:
        return n.args[2:3] == (False,)
    if n.target is aten.scaled_dot_product_attention.default:
        p = n.args[4] if len(n.args) > 4 else n.kwargs.get("dropout_p", 0.0)
        return isinstance(p, float | int) and p == 0.0
    return False

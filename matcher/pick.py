"""Kernel choice: which kernel runs at a match, by the registry's rules and, with autotune on,
by measurement (matcher/choose.py).

    before: pdlkit_call("linear_gelu", x, w, b, gelu) matched at gelu_3
    after:  Choice(kernel=linear_gelu_onednn, tuning="linear_gelu_onednn 41 us, ...")
            or Choice(None, kept="...") when the replaced subgraph measured faster

The registry's candidates (device, dtypes, ISA, shape rules, a manifest's pin) are kept
where their meta function agrees with the outputs they replace; the first of them runs,
unless a :class:`~pdlkit.matcher.choose.Tuner` times them and the subgraph on the site's
shapes and weights. (The whole graph's last word is matcher/graph_guard.py's.)
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any, cast

import torch
import torch.fx as fx
from pdlkit.matcher.choose import Tuner
from pdlkit.matcher.fx_rewrite import fallback_module
from pdlkit.matcher.match import Choice, MatchSession
from pdlkit.matcher.records import Record
from pdlkit.runtime_abi import triton_binding
from pdlkit.runtime_abi.autotune import KEEP
from pdlkit.runtime_abi.capability import Target
from pdlkit.runtime_abi.kernel import KernelDecl
from pdlkit.runtime_abi.registry import KernelRegistry
from torch.fx.experimental.symbolic_shapes import statically_known_true


class RegistryChoice:
    """:class:`~pdlkit.matcher.match.KernelChoice` for one graph: the registry's eligible
    kernels, measured by ``tuner`` when there is one (None: static priority)."""

    def __init__(
        self,
        gm: fx.GraphModule,
        registry: KernelRegistry,
        target: Target,
        tuner: Tuner | None = None,
    ):
        self.registry = registry
        self.target = target
        self.tuner = tuner
        self.fake_mode = torch._guards.detect_fake_mode([n.meta.get("val") for n in gm.graph.nodes])
        self._meta_seen: dict[tuple[Any, ...], str] = {}

    def eligible(
        self, op: str, pin: str | None, args: list[Any], examples: list[Any], outputs: list[fx.Node]
    ) -> tuple[list[KernelDecl], list[str]] | str:
        """The eligible kernels whose meta function agrees, and the kernels passed over
        with why; or why no kernel can run here. Not a kernel that would keep the pack of a
        tensor the graph computes (:func:`computed_packed`)."""
        found, passed_over = self.registry.candidates(op, examples, self.target, pin)
        cands, computed = constant_packs(found, args)
        passed_over = [*passed_over, *computed]
        if not cands:
            return f"no eligible kernel for {op!r}: {'; '.join(passed_over)}"
        agree = [k for k in cands if not self._meta_mismatch(k, examples, outputs)]
        if not agree:
            return self._meta_mismatch(cands[0], examples, outputs)
        return agree, passed_over

    def choose(
        self, s: MatchSession, rec: Record, agree: list[KernelDecl], examples: list[Any], at: str
    ) -> Choice:
        """The first eligible kernel, or with a tuner the fastest of them and the replaced
        subgraph (a pinned kernel is measured all the same, so that explain can say what the
        pin costs, and runs unless the subgraph is faster)."""
        if self.tuner is None:
            return Choice(agree[0])
        pin = rec.pattern.kernel
        args = [s.fx_arg(r) for r in rec.args]
        if pin is not None:
            others, _ = self.registry.candidates(rec.op, examples, self.target)
            others, _ = constant_packs(others, args)
            agree = [
                k for k in others if not self._meta_mismatch(k, examples, rec.outputs)
            ] or agree
        fallback = fallback_module(s.gm, s, rec)
        decision = self.tuner.choose(rec.op, agree, args, fallback, rec.slice, at, pin)
        if decision.choice == KEEP:
            return Choice(None, kept=decision.describe())
        k = next(k for k in agree if k.name == decision.choice)
        dispatch = None
        # dynamic dims: the other shape buckets choose at run time; not for a kernel Inductor
        # launches in a graph checked whole per bucket (matcher/graph_buckets.py): the
        # intercept would make it an opaque call (pdlkit's runner, its Python launcher: a
        # Llama-2 prefill at 512 tokens on an H200 ran 3.3 ms, 0.6 ms traced), and the
        # graph's verdict per bucket takes Inductor's code where the kernels lose
        if pin is None and not (self.tuner.per_bucket and triton_binding.traced(k)):
            dispatch = self.tuner.dispatcher(rec.op, agree, args, rec.slice, at, decision)
        return Choice(k, decision.describe(), dispatch)

    def _meta_mismatch(self, k: KernelDecl, examples: list[Any], outputs: list[fx.Node]) -> str:
        """Why the kernel's meta function disagrees with the replaced outputs ("" = it agrees).

        Fake-tensor dispatch is the costly part, and models repeat the same GEMM shapes, so
        answers are remembered per kernel and argument signature for this graph."""
        want = [o.meta.get("val") for o in outputs]
        key = (k.name, k.version, _signature(examples), _signature(want))
        known = self._meta_seen.get(key)
        if known is None:
            known = self._meta_seen[key] = self._meta_check(k, examples, want)
        return known

    def _meta_check(self, k: KernelDecl, examples: list[Any], want: list[Any]) -> str:
        try:
            with self.fake_mode if self.fake_mode is not None else contextlib.nullcontext():
                got = k.meta(*examples)
        except Exception as e:
            return f"kernel {k.name}: meta function raised {type(e).__name__}: {e}"
        got = list(got) if isinstance(got, tuple | list) else [got]
        if len(got) != len(want):
            return f"kernel {k.name} returns {len(got)} value(s), the pattern replaces {len(want)}"
        for g, w in zip(got, want, strict=True):
            if not isinstance(w, torch.Tensor) or not isinstance(g, torch.Tensor):
                continue
            same = (
                g.dtype == w.dtype
                and g.dim() == w.dim()
                and all(
                    statically_known_true(a == b) for a, b in zip(g.shape, w.shape, strict=True)
                )
            )
            if not same:
                return (
                    f"kernel {k.name}: meta function gives {list(g.shape)} {g.dtype}, "
                    f"the replaced subgraph produces {list(w.shape)} {w.dtype}"
                )
        return ""


def _view(n: fx.Node) -> bool:
    """Whether ``n`` is a view of its first argument (its op's schema says that its result
    aliases that argument: ``t``, ``numpy_T``, ``permute``, ``view``, ...), not a cast (``to``
    is annotated so too, but a cast to another dtype is a new tensor at each call)."""
    if n.op != "call_function" or getattr(n.target, "_opname", "") == "to":
        return False
    schema = getattr(n.target, "_schema", None)
    info = schema.returns[0].alias_info if schema is not None and schema.returns else None
    return info is not None and not info.is_write and isinstance(n.args[0], fx.Node)


def computed_packed(k: KernelDecl, args: Sequence[Any]) -> str:
    """Why ``k`` cannot run at a site whose arguments are ``args`` (FX nodes or constants),
    "" where it can: a kernel that pre-packs a tensor (``prepack_arg``, ``prepack_with``)
    keeps the pack for the next call, so that tensor must be a graph input (a parameter or
    buffer, as Dynamo lifts them) or a constant, or a view of one. A tensor the graph computes
    (torchao's ``dequantize_affine`` of an int8 weight, a cast) is a new value at each call,
    and Inductor writes it into a buffer it may reuse for the next layer's: the pack found
    there was another layer's (bert-mini with torchao's IntxWeightOnlyConfig in bf16 and
    ``linear_bf16``: largest error 0.66, cosine 0.19 on a 2-layer Llama)."""
    if k.prepack is None:
        return ""
    for name in (k.prepack_arg, *k.prepack_with):
        i = k.params.index(name) if name in k.params else len(args)
        node = args[i] if i < len(args) else None
        root = node
        while isinstance(root, fx.Node) and _view(root):
            root = cast(fx.Node, root.args[0])
        if isinstance(root, fx.Node) and root.op not in ("placeholder", "get_attr"):
            assert isinstance(node, fx.Node)
            view = f"{node.name}, a view of " if node is not root else ""
            return (
                f"kernel {k.name} pre-packs {name}, which the graph computes at each call "
                f"({view}{root.name} = {root.target}): not a constant"
            )
    return ""


def constant_packs(
    kernels: list[KernelDecl], args: Sequence[Any]
) -> tuple[list[KernelDecl], list[str]]:
    """(the kernels that may run at a site whose arguments are ``args``, why each other may
    not): :func:`computed_packed` for each."""
    whys = {k.name: computed_packed(k, args) for k in kernels}
    return [k for k in kernels if not whys[k.name]], [w for w in whys.values() if w]


def _signature(values: Sequence[Any]) -> tuple[Any, ...]:
    out: list[Any] = []
    for v in values:
        if isinstance(v, torch.Tensor):
            shape: tuple[Any, ...] = tuple(v.shape)
            if not all(type(d) is int for d in shape):
                shape = tuple(str(d) for d in shape)  # SymInts do not hash
            out.append((shape, v.dtype))
        else:
            out.append(repr(v))
    return tuple(out)

"""Gradients for kernels that declare a ``backward``, and which graphs need them.

A kernel declared with ``backward=`` is bound a second time, as ``<name>_grad`` with its
backward registered through ``torch.library.register_autograd``, for graphs that need
gradients: AOT autograd traces that backward into the backward graph. Inference graphs
call the plain op, which has no Python autograd layer (about 20 us per call less). In a graph
that needs gradients, a kernel without one is not eligible for any call whose tensor
arguments require grad (the registry says so in ``explain``); a graph where nothing is
eligible compiles exactly as under Inductor.

    @pdlkit.kernel(op="linear", meta=meta, backward=linear_backward, setup_context=save)
    def linear_k(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor: ...
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.fx as fx
from pdlkit.runtime_abi.kernel import KernelDecl

_TRAINING: contextvars.ContextVar[bool] = contextvars.ContextVar("pdlkit_training", default=False)


def training() -> bool:
    """Whether the graph being substituted now needs gradients (see :func:`training_graph`)."""
    return _TRAINING.get()


def register(decl: KernelDecl, qualname: str, lib: Any) -> None:
    """Register ``decl.backward`` for the bound op ``qualname`` (whose last argument is the
    call site, an int that gets no gradient)."""
    assert decl.backward is not None
    user_backward, user_setup = decl.backward, decl.setup_context

    def setup_context(ctx: Any, inputs: Sequence[Any], output: Any) -> None:
        args = tuple(inputs[:-1])
        if user_setup is not None:
            user_setup(ctx, args, output)
        else:
            ctx.inputs, ctx.output = args, output

    def backward(ctx: Any, *grads: Any) -> tuple[Any, ...]:
        out = user_backward(ctx, *grads)
        out = tuple(out) if isinstance(out, tuple | list) else (out,)
        if len(out) != len(decl.params):
            raise RuntimeError(
                f"pdlkit kernel {decl.name!r} ({decl.source}): backward returned {len(out)} "
                f"gradient(s), the kernel has {len(decl.params)} parameters {decl.params}"
            )
        return (*out, None)

    torch.library.register_autograd(qualname, backward, setup_context=setup_context, lib=lib)


def grad_inputs(example_inputs: Sequence[Any]) -> list[int]:
    """Positions of graph inputs that need a gradient (none when grad mode is off)."""
    if not torch.is_grad_enabled():
        return []
    return [
        i for i, v in enumerate(example_inputs) if isinstance(v, torch.Tensor) and v.requires_grad
    ]


@contextmanager
def training_graph(gm: fx.GraphModule, positions: Sequence[int]) -> Iterator[int]:
    """While active, every node's ``meta["val"]`` that depends on a grad-requiring input
    requires grad, so that kernel selection sees which arguments need a gradient (the
    re-trace's fake values do not carry it), and kernels bind with their backward when
    any input needs a gradient. Yields how many nodes were marked."""
    want = set(positions)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    needs: set[fx.Node] = {n for i, n in enumerate(placeholders) if i in want}
    for n in gm.graph.nodes:
        if n.op not in ("placeholder", "output") and any(a in needs for a in n.all_input_nodes):
            needs.add(n)
    marked: list[torch.Tensor] = []
    for n in needs:
        vals = n.meta.get("val")
        for v in vals if isinstance(vals, tuple | list) else (vals,):
            if (
                isinstance(v, torch.Tensor)
                and not v.requires_grad
                and (v.is_floating_point() or v.is_complex())
                and v.is_leaf
            ):
                v.requires_grad_(True)
                marked.append(v)
    token = _TRAINING.set(bool(want))
    try:
        yield len(marked)
    finally:
        _TRAINING.reset(token)
        for v in marked:
            v.requires_grad_(False)


def needs_backward(decl: KernelDecl, args: Sequence[Any], params: Sequence[str]) -> str | None:
    """Why ``decl`` cannot take these arguments in a graph that needs gradients, or None."""
    if decl.backward is not None:
        return None
    for name, a in zip(params, args, strict=False):
        if isinstance(a, torch.Tensor) and a.requires_grad:
            return f"has no backward, and {name} needs a gradient"
    return None

"""Kernels that Inductor launches: Triton kernels traced into the compiled graph.

    before: the compiled graph calls ``torch.ops.pdlkit.<kernel>(..., site)``, an opaque op;
            Inductor's code calls pdlkit's Python runner, which launches each Triton kernel
            through Triton's Python launcher (an int8 GEMM: 121-125 us of host time per call
            on the H100 machine's host)
    after:  for a kernel declared ``@launched_by_inductor(...)``, AOT autograd traces the
            kernel's body (torch ops and ``torch.library.wrap_triton`` launches) into the
            graph; Inductor sees ``triton_kernel_wrapper_functional`` nodes, compiles them as
            user-defined Triton kernels and launches them from its own generated code, next to
            its own kernels (and inside its CUDA graphs when those are on): 41-58 us for that
            GEMM as a whole compiled graph (benchmarks/results/cuda_decode.md)

This is how ``torch.library.triton_op`` works (torch 2.6 to 2.13: a ``torch_dispatch`` rule
for ``FunctionalTensorMode`` that runs the op's Python body under the mode, so that AOT
autograd records its torch ops and ``wrap_triton`` launches). pdlkit applies the same rule to
the op :mod:`pdlkit.runtime_abi.binding` defines, instead of calling ``triton_op``, so that the
op keeps its low-level binding (the ``pdlkit_site`` argument, the per-call runner for eager
calls, ``register_fake`` from the meta function) and the rule decides per call site, at
compile time, what the graph gets:

* the kernel's body, traced (the usual case);
* the replaced subgraph, traced, when the kernel declines these arguments: its shape rules
  fail on the traced tensors, or it raises :class:`KernelUnsupported` while being traced
  (a warning says so once per site). The decision is made once per compiled shape; a later
  call with other shapes is another compilation (Dynamo's guards), never a per-call fallback;
* the opaque op, run by the per-call runner as before, where the site needs per-call work:
  ``verify`` (first-call comparison), an ``intercept`` (per-bucket kernel choice under
  dynamic shapes, verification, bisect), or a graph being exported.

What the traced path gives up, and how it is covered: no per-call fallback (so only kernels
whose declines depend on shapes and dtypes alone may be declared this way: nothing read
from tensor data on the host, no pre-pack); output checks happen once, at trace time
(shapes and dtypes against the meta function; the outputs are fresh tensors the body
allocates); ``pdlkit.stats()`` counts no calls of traced kernels (Inductor's code does not
call back into pdlkit). Under Triton's interpreter (``TRITON_INTERPRET=1``) nothing is traced:
Inductor cannot launch interpreted kernels, so the op stays opaque.

Kernel files launch through :func:`launch`, which returns the ``wrap_triton`` wrapper only
while a dispatch mode traces the body, and the plain kernel otherwise (an eager call pays no
higher-order-op dispatch).
"""

from __future__ import annotations

import importlib
import os
import threading
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from pdlkit.runtime_abi.kernel import KernelDecl, KernelDeclarationError, KernelUnsupported
from pdlkit.runtime_abi.outputs import KernelCallError, as_list
from pdlkit.runtime_abi.sites import site, transpose_args

_ATTR = "__pdlkit_launched_by_inductor__"
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Launched:
    """What a kernel declared with :func:`launched_by_inductor` says about itself."""

    kernels: tuple[str, ...]  # the modules whose @triton.jit kernels its body launches


def launched_by_inductor(*kernels: str) -> Callable[[F], F]:
    """Mark a kernel function (under ``@pdlkit.kernel``) whose body is torch ops and Triton
    launches made through :func:`launch`, so that compiled graphs trace into it.

    ``kernels`` name the modules holding the ``@triton.jit`` kernels the body launches: their
    source joins AOT autograd's cache key for the op, as ``torch.library.triton_op`` arranges
    (a body of torch ops alone names none).
    The body may raise :class:`KernelUnsupported` only for reasons its arguments' shapes,
    strides and dtypes decide; it must read no tensor data on the host."""

    def mark(fn: F) -> F:
        setattr(fn, _ATTR, Launched(kernels))
        return fn

    return mark


def launched(decl: KernelDecl) -> Launched | None:
    return getattr(decl.fn, _ATTR, None)


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def traced(decl: KernelDecl) -> bool:
    """Whether compiled graphs trace into ``decl`` (and Inductor launches its kernels)."""
    return launched(decl) is not None and not interpreting()


def launch(kernel: Any) -> Any:
    """``kernel`` as a kernel body launches it: ``kernel[grid](...)`` is recorded in the graph
    while a dispatch mode traces the body, and runs at once otherwise."""
    if torch._C._len_torch_dispatch_stack() == 0 or interpreting():
        return kernel
    return torch.library.wrap_triton(kernel)


def size_hint(n: Any) -> int:
    """A size as a traced body's choices read it (tiles, which kernel path): where the graph
    has dynamic shapes, the symbolic size's value in this compilation, as Inductor's own
    templates choose their configs, so that the choice adds no guard on the size. Each such
    guard is a recompilation of the model's frame as the size crosses it (an int8 Llama-2
    prefill on an H200, compiled with ``dynamic=True``: four graphs for four prompt lengths,
    the tile and split-K choices by M), and past Dynamo's recompile limit the frame runs
    eagerly. The body stays correct for every size (its grid and masks follow the symbolic
    size; only the choice is fixed): never allocate by a hint. A plain int is returned as it
    is; a symbol without a hint (data-dependent) is guarded on, as before."""
    hint = getattr(getattr(n, "node", None), "hint", None)
    return int(hint) if hint is not None else int(n)


def compile_apart(gm: torch.fx.GraphModule, inputs: Sequence[Any]) -> Any:
    """Inductor's code for ``gm``, compiled outside the tracing context of a compilation in
    progress (pdlkit times sites while Dynamo compiles the model): nothing of this compile may
    reach that frame's fake mode, shape env or guards.

        before: compile_fx inside the backend faked ``inputs`` in Dynamo's fake mode: symbols
                without a source in its shape env, and Dynamo's guards failed on them
                (IndexError in produce_guards; an H200, Llama prefill 8 x 512)
        after:  a fake mode and shape env of its own"""
    from torch._inductor.compile_fx import compile_fx

    with torch._guards.tracing(None):
        return compile_fx(gm, list(inputs))


def compiled_call(op: Any, args: Sequence[Any], sid: int) -> Callable[[], Any]:
    """``op(*args, sid)`` as Inductor compiles it, for timing a traced kernel as the model
    will run it: through Inductor's launcher, not pdlkit's runner and Triton's Python
    launcher, whose host time (tens of microseconds a launch) would decide every
    decode-shaped comparison. Compiled here, before any timing; a kernel that fails to
    compile (it declines these arguments) gives a call that raises why."""
    import torch.fx as fx

    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    g = fx.Graph()
    inputs = iter([g.placeholder(f"a{i}") for i in range(len(tensors))])
    op_args = [next(inputs) if isinstance(a, torch.Tensor) else a for a in args]
    g.output(g.call_function(op, (*op_args, sid)))
    try:
        fn: Callable[..., Any] = compile_apart(fx.GraphModule({}, g), tensors)
    except Exception as e:
        error = e

        def refuse() -> Any:
            raise error

        return refuse
    return lambda: fn(*tensors)


# -- registration ---------------------------------------------------------------------------------


def register(op: Any, decl: KernelDecl, lib: torch.library.Library) -> None:
    """Let compiled graphs trace into ``op``, the op ``binding.bind`` defined for ``decl``.
    Nothing happens for a kernel not declared :func:`launched_by_inductor`."""
    spec = launched(decl)
    if spec is None or interpreting():
        return
    problems = []
    if decl.prepack is not None:
        problems.append("it pre-packs a weight (a per-call cache lookup)")
    problems += [
        f"{name}'s shape rule needs {rule.align}-byte alignment (a per-call data pointer check)"
        for name, rule in decl.shapes.items()
        if rule.align is not None
    ]
    if problems:
        raise KernelDeclarationError(
            f"{decl.source}: kernel {decl.name!r} is declared launched_by_inductor, but "
            + "; ".join(problems)
            + ": Inductor's code cannot run that per call"
        )
    from torch._subclasses.functional_tensor import FunctionalTensorMode

    torch.library.register_torch_dispatch(op, FunctionalTensorMode, _rule(decl), lib=lib)
    _note_kernels(op, spec)


def _note_kernels(op: Any, spec: Launched) -> None:
    """Key AOT autograd's cache on the Triton source the body launches (torch >= 2.10 reads
    ``triton_ops_to_kernels``; older versions have no such cache key and need nothing)."""
    table = getattr(torch._library.triton, "triton_ops_to_kernels", None)
    if table is None or not spec.kernels:
        return
    from triton.runtime.jit import JITFunction

    modules = [importlib.import_module(name) for name in spec.kernels]
    table[op._name] = [k for m in modules for k in vars(m).values() if isinstance(k, JITFunction)]


def _rule(decl: KernelDecl) -> Callable[..., Any]:
    def rule(mode: Any, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        if any(not _traceable(t) for t in types):
            return NotImplemented  # a tensor subclass: let it handle the op first
        cs = site(args[-1]) if not kwargs and type(args[-1]) is int else None
        if cs is None or cs.intercept is not None or cs.verify or _exporting():
            return mode.__torch_dispatch__(func, types, args, kwargs)  # stays opaque
        with mode:
            return inline(decl, cs, tuple(args[:-1]))

    return rule


def _traceable(t: type) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor
    from torch._subclasses.functional_tensor import FunctionalTensor

    return t in (torch.Tensor, FunctionalTensor) or issubclass(t, FakeTensor)


def _exporting() -> bool:
    try:
        from torch.export._trace import custom_triton_ops_decomposition_disabled
    except ImportError:  # a torch that decomposes triton ops under export too
        return False
    return bool(custom_triton_ops_decomposition_disabled())


# -- the traced body ------------------------------------------------------------------------------


def inline(decl: KernelDecl, cs: Any, args: tuple[Any, ...]) -> Any:
    """What the graph computes for one call of ``decl`` at site ``cs``, traced under the
    active mode: the kernel's body, or the replaced subgraph where the kernel declines."""
    if cs.transposed:
        args = transpose_args(args, cs.transposed)
    why = violation(decl, args)
    if why is None:
        try:
            out = decl.fn(*args)
        except KernelUnsupported as e:
            why = str(e) or "KernelUnsupported"
        else:
            _check(decl, cs, args, out)
            return out
    fallback = cs.fallback
    out = getattr(fallback, "module", lambda: fallback)()(*args)  # autotune's sites raise
    _declined(decl, cs, why)
    return out


def violation(decl: KernelDecl, args: Sequence[Any]) -> str | None:
    """Why these traced arguments break the kernel's shape rules, or None. A symbolic dim's
    divisibility and a stride are decided on the traced tensors; Dynamo guards them, so a
    later call that differs compiles again instead of running a wrong kernel."""
    for name, arg in zip(decl.params, args, strict=False):
        rule = decl.shapes.get(name)
        if rule is None or not isinstance(arg, torch.Tensor):
            continue
        if rule.rank is not None and arg.dim() not in rule.rank:
            return f"{name} has rank {arg.dim()}, needs {' or '.join(map(str, rule.rank))}"
        for d, k in rule.divisible:
            if not -arg.dim() <= d < arg.dim():
                return f"{name} has no dim {d}"
            if arg.shape[d] % k != 0:
                return f"{name} dim {d} is {arg.shape[d]}, not a multiple of {k}"
        if rule.contiguous and not arg.is_contiguous():
            return f"{name} is not contiguous"
    return None


def _check(decl: KernelDecl, cs: Any, args: Sequence[Any], out: Any) -> None:
    """The body's outputs against the meta function, once, at trace time."""
    got, want = as_list(out), as_list(decl.meta(*args))
    if len(got) != len(want) or any(
        not isinstance(g, torch.Tensor) or g.dtype != w.dtype or g.shape != w.shape
        for g, w in zip(got, want, strict=False)
    ):
        have = [(tuple(g.shape), g.dtype) if isinstance(g, torch.Tensor) else g for g in got]
        need = [(tuple(w.shape), w.dtype) for w in want]
        raise KernelCallError(
            f"pdlkit kernel {decl.name!r} ({decl.source}) traced at {cs.where()} returns "
            f"{have}; its meta function declares {need}"
        )


_WARNED: set[tuple[str, str]] = set()
_WARN_LOCK = threading.Lock()


def _declined(decl: KernelDecl, cs: Any, why: str) -> None:
    key = (decl.name, cs.where())
    with _WARN_LOCK:
        if key in _WARNED:
            return
        _WARNED.add(key)
    warnings.warn(
        f"pdlkit: kernel {decl.name} declined {cs.where()} at compile time ({why}); "
        "the replaced ops are compiled there instead",
        stacklevel=2,
    )

"""Bind kernels as ``torch.library`` custom ops, with run-time guards and per-call fallback.

Every kernel becomes ``torch.ops.pdlkit.<name>`` whose schema is the kernel's own plus a
trailing ``int pdlkit_site``: the call site that the substitution created. The site knows
the pattern, the FX node and the replaced subgraph, so that

* a kernel that raises is reported with its name and the user's source line,
* a kernel that raises :class:`KernelUnsupported` is replaced, for that call, by the
  replaced subgraph (per-call fallback),
* outputs whose shape or dtype disagree with the kernel's meta function, or that share
  memory with an input, are an error, never a silently wrong number
  (:mod:`pdlkit.runtime_abi.outputs`),
* ``verify=True`` compares the first call of every site against the replaced subgraph
  (a mismatch is an error); ``verify="first_call"`` does it per shape and switches a
  failing substitution off for that shape instead (:mod:`pdlkit.runtime_abi.verify`),
* a site lives as long as the compiled graph that calls it (:mod:`pdlkit.runtime_abi.sites`),
* a call from compiled code skips the dispatcher when nothing could observe the dispatch
  (``_SiteOp``, at the end of this file); every other call goes through it.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from pdlkit.runtime_abi import binding_stats, outputs, sites, triton_binding
from pdlkit.runtime_abi.autograd import register, training
from pdlkit.runtime_abi.binding_stats import count
from pdlkit.runtime_abi.kernel import KernelDecl, KernelUnsupported
from pdlkit.runtime_abi.outputs import KernelCallError, check, recheck
from pdlkit.runtime_abi.prepack import CACHE as PREPACK
from pdlkit.runtime_abi.prepack import attrs_key_of, storage_of, version_of
from pdlkit.runtime_abi.sites import _SITES, CallSite, site, transpose_args
from pdlkit.runtime_abi.verify import strict

_SITE_ARG = "pdlkit_site"
_CHECK_FIRST = 8
CHECK_EVERY = 1 if os.environ.get("PDLKIT_CHECK_EVERY_CALL") == "1" else 64

# what other modules (abi_check.py, matcher/) read from here
_as_list, _meta_of, _fresh = outputs.as_list, outputs.meta_of, outputs.fresh
new_site, drop_site = sites.new_site, sites.drop_site


def past_first_checks(cs: CallSite) -> None:
    """Let ``cs`` run as after its first calls, but for one: its next call checks its output
    in full (and sets ``CallSite.expect``, against which later calls compare), the calls after
    it take the direct path, as a model's calls do once past their first (a timing site:
    matcher/choose.py; a graph timed whole: :class:`DeferredChecks`)."""
    cs.calls = max(cs.calls, _CHECK_FIRST - 1)


class DeferredChecks:
    """The first-call output checks of graphs timed as wholes, put off to the model's calls.

    before: a site checks its output in full (runtime_abi/outputs.py ``check``) on its first
            ``_CHECK_FIRST`` calls, through the general path, so a graph's first calls ran
            1-1.5 ms slower (bert-mini BF16, 25 sites, 1 thread, the AMD EPYC: 23.4 against
            21.6 ms; a third of a 3.5 ms graph at 16 threads), and the whole-graph check
            (matcher/graph_guard.py) timed those calls as the graph's
    after:  while timed, the sites of each graph given to :meth:`add` run as after their
            first calls, but for the very first (which sets ``CallSite.expect``); the
            sampled checks every ``CHECK_EVERY`` calls still run, as in the model. On
            :meth:`restore` their call counts are put back, so the model's own first calls
            check in full."""

    def __init__(self) -> None:
        self._saved: list[tuple[CallSite, int]] = []

    def add(self, owner: Any) -> None:
        """Put off the first checks of the sites whose compiled graph is ``owner``'s."""
        for cs in sites.owned(owner):
            self._saved.append((cs, cs.calls))
            past_first_checks(cs)

    def restore(self) -> None:
        for cs, calls in reversed(self._saved):
            cs.calls = calls
        self._saved.clear()


# -- binding ------------------------------------------------------------------------------------

# (name, version, op, schema, digest, with backward) -> op
_BOUND: dict[tuple[str, int, str, str, str, bool], Any] = {}
_TAKEN: set[str] = set()
_LIB = torch.library.Library("pdlkit", "FRAGMENT")  # must live as long as the process
_BIND_LOCK = threading.Lock()


def needs_guard(decl: KernelDecl, args: Sequence[Any]) -> bool:
    """Whether a call site must check the shape rules per call: contiguity and alignment
    are properties of each call's tensors, and symbolic dims are only known per call."""
    for name, arg in zip(decl.params, args, strict=False):
        rule = decl.shapes.get(name)
        if rule is None or not isinstance(arg, torch.Tensor):
            continue
        if rule.contiguous or rule.align is not None:
            return True
        if any(
            not isinstance(arg.shape[d], int)
            for d, _ in rule.divisible
            if -arg.dim() <= d < arg.dim()
        ):
            return True
    return False


def _guard(decl: KernelDecl, args: Sequence[Any]) -> str | None:
    """Why this call's tensors break the kernel's shape rules (checked per call: at
    compile time only what was provable was checked), or None."""
    for name, arg in zip(decl.params, args, strict=False):
        rule = decl.shapes.get(name)
        if rule is not None and isinstance(arg, torch.Tensor):
            why = rule.violation(arg)
            if why:
                return f"{name} {why}"
    return None


def _attrs(decl: KernelDecl, args: Sequence[Any]) -> dict[str, Any]:
    return {
        n: a for n, a in zip(decl.params, args, strict=False) if not isinstance(a, torch.Tensor)
    }


def _packed_args(
    decl: KernelDecl,
    at: int,
    args: tuple[Any, ...],
    cs: CallSite | None,
    view_of: torch.Tensor | None = None,
) -> tuple[Any, ...]:
    """``args`` with the weight at position ``at`` replaced by its packed form; ``view_of``:
    the argument the site transposed into that weight (the pre-pack cache's key)."""
    assert decl.prepack is not None
    w = args[at]
    if not isinstance(w, torch.Tensor):
        return args
    # a site's non-tensor arguments are compile-time constants: key them once
    key = cs.attrs_key if cs is not None else None
    if key is None:
        key = attrs_key_of(_attrs(decl, args))
        if cs is not None:
            cs.attrs_key = key
    with_ = {n: a for n, a in zip(decl.params, args, strict=False) if n in decl.prepack_with}
    if any(not isinstance(t, torch.Tensor) for t in with_.values()):
        raise TypeError(f"prepack_with {sorted(with_)} must be tensors")

    def attrs() -> dict[str, Any]:
        return {**_attrs(decl, args), **with_}

    others = tuple(with_.values())
    packed = PREPACK.get(decl.name, decl.prepack, w, attrs, key, others, view_of)
    if cs is not None:
        cs.packed = _memo(w, others, packed)
    return (*args[:at], packed, *args[at + 1 :])


def _memo(w: torch.Tensor, others: tuple[torch.Tensor, ...], packed: Any) -> Any:
    """``CallSite.packed`` for a weight (and its prepack_with tensors) just packed, or None
    where the direct path could not recognize them (views, tensors without a storage)."""
    tensors = (w, *others)
    storages = [storage_of(t) for t in tensors]
    if any(t._base is not None or t.is_inference() for t in tensors) or any(
        s is None for s in storages
    ):  # (an inference tensor's version the direct path could not compare)
        return None
    try:
        refs = [
            (weakref.ref(t), version_of(t), weakref.ref(s))
            for t, s in zip(tensors, storages, strict=True)
        ]
        return (*refs[0], weakref.ref(packed), tuple(refs[1:]))
    except TypeError:  # a packed form that cannot be weakly referenced (a tuple)
        return None


class _Threads:
    """Whether kernels have run on more than one thread. Compiling a fallback traces, and
    tracing patches ``torch.nn.Module.__call__`` process-wide, so fallbacks are compiled
    only while one thread runs kernels (see ``runtime_abi.fallback.ReplacedSubgraph``)."""

    __slots__ = ("first", "many")

    def __init__(self) -> None:
        self.first: int | None = None
        self.many = False

    def note(self, ident: int) -> None:
        if self.first is None:
            self.first = ident
        elif ident != self.first:
            self.many = True


THREADS = _Threads()


def many_threads() -> bool:
    return THREADS.many


def _kernel_counts() -> dict[tuple[str, str], int]:
    """This thread's counters, fetched on its first kernel call, which is also when the
    thread is noted: later calls find them in ``LOCAL.k`` and pay nothing for the noting."""
    THREADS.note(threading.get_ident())
    counts = getattr(binding_stats.LOCAL, "c", None)
    if counts is None:
        counts = binding_stats.new_counter()
    binding_stats.LOCAL.k = counts
    return counts


def forget_threads() -> None:
    """Start over as if no kernel had run on any thread (for tests; threads that already
    ran kernels and are still alive are not noted again)."""
    THREADS.first, THREADS.many = None, False
    binding_stats.LOCAL.__dict__.pop("k", None)


def _failed(decl: KernelDecl, cs: CallSite | None, e: Exception) -> KernelCallError:
    where = cs.where() if cs else "a direct call"
    return KernelCallError(
        f"pdlkit kernel {decl.name!r} ({decl.source}) failed at {where}: {type(e).__name__}: {e}"
    )


def _same(
    memo: tuple[tuple[Any, int, Any], ...], args: tuple[Any, ...], at: tuple[int, ...]
) -> bool:
    """Whether the prepack_with tensors of a call are those the site's packed form was made
    from, at the same versions, over the same storages."""
    for (ref, version, storage), i in zip(memo, at, strict=True):
        t = args[i]
        if ref() is not t or version_of(t) != version or storage() is not t.untyped_storage():
            return False
    return True


_Fn = Callable[..., Any]
_Ints = tuple[int, ...]


def _raised(
    decl: KernelDecl,
    cs: CallSite | None,
    kargs: tuple[Any, ...],
    e: Exception,
    fall_back: _Fn,
) -> Any:
    """What a kernel call that raised ``e`` gives: the replaced subgraph's result, for this
    call only, where the kernel declined (:class:`KernelUnsupported`) at a call site; else
    the error, naming the kernel and the site. Called from the caller's ``except`` block."""
    if not isinstance(e, KernelUnsupported):
        raise _failed(decl, cs, e) from e
    if cs is None:
        raise e
    return fall_back(cs, kargs)


def _prepack_at(decl: KernelDecl) -> tuple[int, tuple[int, ...]]:
    """The positions of the weight a kernel pre-packs (-1: none) and of its prepack_with."""
    at = decl.params.index(decl.prepack_arg) if decl.prepack_arg is not None else -1
    return at, tuple(decl.params.index(n) for n in decl.prepack_with)


def _runner(
    decl: KernelDecl,
) -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., Callable[..., Any]]]:
    """The Python body of ``torch.ops.pdlkit.<kernel>``, as ``(run, enter, direct)``:
    ``run(*args, site)`` is what the dispatcher calls; ``enter(call_site, args)`` is the
    same call for a caller that already found the site; ``direct(nargs, tensors, lists)``
    makes the op's ``__call__`` for the direct path (see ``_SiteOp``). Every call goes
    through them, so what they read from the declaration is bound once, in the factories
    below, as free variables of the closures (as cheap as locals; attribute loads are not)."""
    sites, enter = _SITES, _enter_of(decl)

    def run(*args: Any) -> Any:
        return enter(sites.get(args[-1]), args[:-1])

    def direct(nargs: int, tensors: tuple[int, ...], lists: tuple[int, ...]) -> Callable[..., Any]:
        return _direct_of(decl, enter, nargs, tensors, lists)

    return run, enter, direct


def _fall_back_of(name: str) -> _Fn:
    """``fall_back(call_site, args)``: the replaced subgraph's result, for this call only."""
    threads, get_ident = THREADS, threading.get_ident

    def fall_back(cs: CallSite, kargs: tuple[Any, ...]) -> Any:
        threads.note(get_ident())  # before the fallback may compile (see _Threads)
        count("fallbacks", name)  # this call only: the next one tries the kernel again
        return _fresh(cs.fallback(*kargs), kargs)

    return fall_back


def _enter_of(decl: KernelDecl) -> _Fn:
    """``enter(call_site, args)``: the general path of a kernel call (``_runner``)."""
    fn, name, shapes, prepack = decl.fn, decl.name, decl.shapes, decl.prepack
    fall_back = _fall_back_of(name)
    calls_key = ("kernel_calls", name)
    check_first, check_every = _CHECK_FIRST, CHECK_EVERY
    threads, get_ident, local = THREADS, threading.get_ident, binding_stats.LOCAL
    pack_at, _ = _prepack_at(decl)

    def attempt(cs: CallSite | None, kargs: tuple[Any, ...]) -> Any:
        return enter(cs, kargs, False)  # what an intercept calls to run the kernel

    # one frame for the common call: the prologue and the kernel call are one function
    def enter(cs: CallSite | None, kargs: tuple[Any, ...], prologue: bool = True) -> Any:
        of = None  # the weight a transposed weight was made from (_packed_args)
        if prologue and cs is not None:
            if cs.transposed:
                of = kargs[pack_at] if pack_at in cs.transposed else None
                kargs = transpose_args(kargs, cs.transposed)
            if cs.intercept is not None:  # verification, or a site bisect switched off
                threads.note(get_ident())  # the intercept may compile the replaced subgraph
                return cs.intercept(cs, kargs, attempt)
            if cs.verify and not cs.verified:
                return strict(cs, kargs, attempt)
        if shapes and cs is not None and cs.guard and _guard(decl, kargs) is not None:
            return fall_back(cs, kargs)  # outside the kernel's shape rules
        try:
            out = (
                fn(*_packed_args(decl, pack_at, kargs, cs, of))
                if prepack is not None
                else fn(*kargs)
            )
        except Exception as e:  # declined (KernelUnsupported: fall back) or failed
            return _raised(decl, cs, kargs, e, fall_back)
        try:  # binding_stats.count, inlined
            counts = local.k
        except AttributeError:
            counts = _kernel_counts()
        counts[calls_key] = counts.get(calls_key, 0) + 1
        if cs is None:
            counts[("calls_without_site", name)] = counts.get(("calls_without_site", name), 0) + 1
            check(decl, cs, kargs, out)
            return out
        cs.calls += 1
        # The whole output check costs more than dispatch itself, so a site runs it on its
        # first calls and then every CHECK_EVERY-th, its turn set by its phase (sites.py;
        # verify=True or PDLKIT_CHECK_EVERY_CALL=1: on all); every other call compares
        # shapes and dtypes, as the direct path does.
        n = cs.calls
        if n <= check_first or (n + cs.phase) % check_every == 0 or cs.verify:
            check(decl, cs, kargs, out)
            return out
        try:
            exp = cs.expect
            declared = exp is not None and out.dtype is exp[1] and out.shape == exp[0]
        except AttributeError:  # not a tensor
            declared = False
        if not declared:
            recheck(decl, cs, kargs, out)
        return out

    return enter


# One frame for a whole compiled call: after each GEMM the interpreter's working set is cold,
# and every frame, attribute and lock costs several times its warm price (measured on bert-mini:
# about 40 us per call through enter(), against 7-10 us warm).
def _direct_of(decl: KernelDecl, enter: _Fn, nargs: int, tensors: _Ints, lists: _Ints) -> _Fn:
    """The op's ``__call__`` for the direct path (``_SiteOp``), one frame for the common call."""
    fn, shapes, prepack, fall_back = decl.fn, decl.shapes, decl.prepack, _fall_back_of(decl.name)
    calls_key, hits_key = ("kernel_calls", decl.name), ("prepack_hits", decl.name)
    sites, check_first, check_every, local = _SITES, _CHECK_FIRST, CHECK_EVERY, binding_stats.LOCAL
    pack_at, with_at = _prepack_at(decl)

    def __call__(op: Any, /, *args: Any, **kwargs: Any) -> Any:
        if (
            kwargs
            or len(args) != nargs
            or _dispatch_modes()
            or _function_modes()
            or _profiling()
            or _functorch_level() is not None
            or _jit_tracing() is not None
            or (cs := sites.get(sid) if type(sid := args[-1]) is int else None) is None
        ):  # something could observe the dispatch, or a site this process did not create
            return op._op(*args, **kwargs)
        grad = _grad_enabled()
        for i in tensors:  # a plain tensor, not meta, that autograd need not record; or None
            a = args[i]
            if (a.is_meta or (grad and a.requires_grad)) if type(a) in _PLAIN else a is not None:
                return op._op(*args)  # or a subclass, or something the schema would refuse
        for i in lists:
            if type(args[i]) is not list or any(
                type(a) not in _PLAIN or a.is_meta or (grad and a.requires_grad)
                for a in args[i]
                if a is not None
            ):
                return op._op(*args)
        kargs = args[:-1]
        n = cs.calls + 1
        if (
            n <= check_first
            or (n + cs.phase) % check_every == 0
            or cs.transposed
            or cs.intercept is not None
            or cs.verify
            or (shapes and cs.guard)
        ):
            return enter(cs, kargs)  # checks, guards, verification: the general path
        call_args = kargs
        if prepack is not None:
            w, memo = kargs[pack_at], cs.packed
            packed = (
                memo[3]()
                if memo is not None
                and w is not None
                and memo[0]() is w
                and memo[1] == w._version
                and memo[2]() is w.untyped_storage()  # not replaced by `weight.data = new`
                and (not memo[4] or _same(memo[4], kargs, with_at))
                else None
            )
            if packed is None:
                return enter(cs, kargs)  # packs, or finds it in the cache; remembers it
            call_args = (*kargs[:pack_at], packed, *kargs[pack_at + 1 :])
        try:
            out = fn(*call_args)
        except Exception as e:  # declined (KernelUnsupported: fall back) or failed
            return _raised(decl, cs, kargs, e, fall_back)
        try:
            counts = local.k
        except AttributeError:
            counts = _kernel_counts()
        counts[calls_key] = counts.get(calls_key, 0) + 1
        if prepack is not None:
            counts[hits_key] = counts.get(hits_key, 0) + 1
        cs.calls = n
        try:  # the declared output of a static site: one dtype and one shape comparison
            exp = cs.expect
            declared = exp is not None and out.dtype is exp[1] and out.shape == exp[0]
        except AttributeError:  # not a tensor
            declared = False
        if not declared:
            recheck(decl, cs, kargs, out)  # a dynamic graph, or an output not as declared
        return out

    return __call__


def bind(decl: KernelDecl) -> Any:
    """The ``torch.ops.pdlkit.*`` overload for ``decl``, created on first use.

    A kernel whose file changed gets a fresh op name (``name_2``...), so a graph compiled
    before the change keeps calling the code it was compiled with; unchanged code (the same
    file bytes, wherever loaded from) reuses its op.
    """
    grad = decl.backward is not None and training()  # inference ops skip autograd
    key = (decl.name, decl.version, decl.op, decl.schema, decl.digest, grad)
    with _BIND_LOCK:
        op = _BOUND.get(key)
        if op is not None:
            return op
        base = decl.name if decl.version == 1 else f"{decl.name}_v{decl.version}"
        base += "_grad" if grad else ""
        name = base
        n = 1
        while name in _TAKEN:
            n += 1
            name = f"{base}_{n}"
        params, _, ret = decl.schema.rpartition(") -> ")
        sep = ", " if params != "(" else ""
        schema = f"{params}{sep}int {_SITE_ARG}) -> {ret}"

        impl, _, direct = _runner(decl)

        def fake(*args: Any) -> Any:
            cs = site(args[-1])
            if cs is not None and cs.transposed:
                return decl.meta(*transpose_args(args[:-1], cs.transposed))
            return decl.meta(*args[:-1])

        # The low-level torch.library API: a CompositeExplicitAutograd kernel is one Python
        # call from the dispatcher (about 3 us), where custom_op's autograd and Dynamo
        # wrappers add about 16 us per call. Dynamo, AOT and Inductor see the same opaque op.
        _LIB.define(f"{name}{schema}")
        _LIB.impl(name, impl, "CompositeExplicitAutograd")
        _register_fake(f"pdlkit::{name}", fake)
        if grad:
            register(decl, f"pdlkit::{name}", _LIB)
        _TAKEN.add(name)
        op = getattr(torch.ops.pdlkit, name).default
        if not grad:  # compiled graphs trace into a kernel Inductor launches (triton_binding.py)
            triton_binding.register(op, decl, _LIB)
        _call_sites_directly(op, direct)
        _BOUND[key] = op
        return op


def _register_fake(qualname: str, fake: Callable[..., Any]) -> None:
    """``torch.library.register_fake(qualname, fake, lib=_LIB)`` without its caller lookup.

    The public call records its caller's ``file:line`` through ``inspect.getframeinfo``,
    whose ``inspect.getmodule`` walks every module imported since its last walk: 25 ms for
    each op's first binding in a process that loaded transformers and Inductor's generated
    code (bert-mini BF16, a second compile in a new process: 51 of pdlkit's 130 ms). The
    holder below is what the public call registers with; a torch without it (or with another
    signature) gets the public call."""
    try:
        holder = torch._library.simple_registry.singleton.find(qualname).fake_impl
        handle = holder.register(fake, f"{__file__}:bind", lib=_LIB)
    except (AttributeError, TypeError):
        torch.library.register_fake(qualname, fake, lib=_LIB)
        return
    _LIB._registration_handles.append(handle)


# -- the direct path ------------------------------------------------------------------------------
#
# The dispatcher's call into a Python kernel (argument parsing against the schema, a boxed
# call, conversion of the result) costs 4-6 us per call on the CPU, more than the runner and
# many small kernels together. Inductor's generated code and FX graphs call a substituted
# kernel as ``torch.ops.pdlkit.<name>.default(..., site)``, with real tensors whose types the
# schema was already checked against when the graph was traced. When nothing could observe
# or redirect the dispatch (no dispatch or torch-function mode, no functorch transform, no
# profiler or JIT tracer, no tensor subclass or meta tensor, no autograd to record), the call
# goes straight to the runner; every other call, and every call with a site this process did
# not create, goes through the dispatcher exactly as before.

_dispatch_modes = torch._C._len_torch_dispatch_stack
_function_modes = torch._C._is_torch_function_mode_enabled
_functorch_level = torch._C._functorch.peek_interpreter_stack
_profiling = torch._C._autograd._profiler_enabled
_jit_tracing = torch._C._get_tracing_state
_grad_enabled = torch.is_grad_enabled
# nn.Parameter is a subclass only in name: it overrides neither __torch_function__ nor
# __torch_dispatch__ (Inductor passes parameters to kernels unless weights are frozen)
_PLAIN = frozenset({torch.Tensor, torch.nn.Parameter})


class _SiteOp(torch._ops.OpOverload):
    """A ``torch.ops.pdlkit`` overload whose compiled call sites may skip the dispatcher.
    Each op gets its own subclass whose ``__call__`` is made by ``_runner``'s ``direct``."""


def _call_sites_directly(op: Any, direct: Callable[..., Callable[..., Any]]) -> None:
    # torch itself specialises overloads by subclass (TorchBindOpOverload); a torch whose
    # OpOverload changed shape keeps the plain dispatcher path
    if type(op) is not torch._ops.OpOverload:
        return
    kinds = [str(arg.type) for arg in op._schema.arguments]
    call = direct(
        len(kinds),
        tuple(i for i, k in enumerate(kinds) if k in ("Tensor", "Tensor?")),
        tuple(i for i, k in enumerate(kinds) if k in ("Tensor[]", "Tensor?[]")),
    )
    op.__class__ = type(
        f"_SiteOp_{op._schema.name.split('::')[-1]}", (_SiteOp,), {"__call__": call}
    )

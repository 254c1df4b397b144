"""Call sites: one per substitution in a compiled graph, found by the integer id that the
graph's code passes to ``torch.ops.pdlkit.<kernel>`` (see ``binding.py``).

A site made for a graph module (``new_site``'s owner) lives as long as that module: the
module holds what the site calls back into (its replaced subgraph, which reads the module's
parameters), the registry holds the site, and the module's end removes the site's id. The
compile session that made the module holds it (the compiled code need not: pdlkit/session.py),
so a model's sites go when its backend does (``torch._dynamo.reset()`` and the optimized
model dropped).

The id -> site table is process-wide on purpose: compiled code passes the id through a
``torch.ops.pdlkit`` op whose one Python body serves every graph that calls that kernel.
Which sites a compilation made is its compile session's to say (pdlkit/session.py, through
:func:`noting`), never a diff of this table.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch
from pdlkit.runtime_abi.kernel import KernelDecl
from pdlkit.runtime_abi.outputs import KernelCallError


# slots: the direct path reads several fields per call; a weak reference slot: a compile
# session (pdlkit/session.py) lists its sites without keeping them alive
@dataclass(slots=True, weakref_slot=True)
class CallSite:
    """One substitution in one compiled graph."""

    kernel: KernelDecl
    pattern: str  # "name (file:line)"
    node: str  # the FX node the kernel call replaced
    user_line: str  # the user's source line, from Dynamo's stack trace, or ""
    fallback: Callable[..., Any]  # the replaced subgraph, called with the kernel's arguments
    verify: bool = False
    verified: bool = False
    calls: int = 0
    guard: bool = True  # False when the shape rules were proven at compile time
    attrs_key: tuple[Any, ...] | None = None
    # arguments the graph passes un-transposed (a canonical ``t(weight)``), transposed here as
    # a view of the parameter so that pre-packing keys a stable tensor (see canonicalize.py)
    transposed: tuple[int, ...] = ()
    # wraps each call as intercept(site, args, attempt) where attempt(site, args) runs the
    # kernel: first-call verification (runtime_abi/verify.py) and bisect use it
    intercept: Callable[..., Any] | None = None
    # the last pre-packed weight: (weakref to the weight, its version, weakref to its
    # storage, weakref to the packed form, ((weakref, version, weakref to the storage) of
    # each prepack_with tensor)), so that the direct path skips the cache's lookup; weak, so
    # that the cache's evictions and a freed weight still free the packed form. The storage
    # catches ``weight.data = new``, which keeps the tensor and its version.
    packed: tuple[Any, int, Any, Any, tuple[tuple[Any, int, Any], ...]] | None = field(
        default=None, repr=False
    )
    # True when the site's graph has no dynamic shape: every call has the same shapes, so
    # every call compares its output with ``expect``, the one (shape, dtype) declared
    static: bool = False
    expect: tuple[torch.Size, torch.dtype] | None = field(default=None, repr=False)
    # the site's sampled output checks (binding.py) fall on its calls n with
    # (n + phase) % CHECK_EVERY == 0: a graph's sites take turns (new_site)
    phase: int = 0
    _expected: dict[tuple[Any, ...], list[tuple[torch.Size, torch.dtype]]] = field(
        default_factory=dict, repr=False
    )

    def where(self) -> str:
        at = f" at {self.user_line}" if self.user_line else ""
        return f"call site {self.node}{at} (pattern {self.pattern})"


# Every live call site by id: compiled code passes the id. A site made for a graph module
# (new_site's owner) is removed when that module is freed, so that sites die with their graph.
_SITES: dict[int, CallSite] = {}
# a stable key (new_site) -> the live sites registered under it, the latest last: compiled
# code of any of their graphs runs the latest, and an older one takes over when it is freed
_KEYED: dict[int, list[CallSite]] = {}
_SITE_IDS = itertools.count(1)
# re-entrant: an owner's finalizer may run (garbage collection) while this thread holds it
_SITES_LOCK = threading.RLock()
_OWNED = "_pdlkit_call_sites"  # the owner's attribute that holds its sites' fallbacks


@dataclass
class Noted:
    """What one compilation registered: its graphs' call sites (weakly: each graph module owns
    its own) and those graph modules (strongly: the compile session keeps them, see
    pdlkit/session.py)."""

    sites: list[weakref.ref[CallSite]] = field(default_factory=list)
    owners: list[Any] = field(default_factory=list)

    def live(self) -> bool:
        return any(r() is not None for r in self.sites)


# The compile session whose graph is being compiled in this context (pdlkit/session.py): a
# site registered for a graph module is noted there too, with the module.
_NOTING: ContextVar[Noted | None] = ContextVar("pdlkit_sites", default=None)


@contextlib.contextmanager
def noting(into: Noted) -> Iterator[None]:
    """Note each graph's call site registered in the block, and its graph module, in ``into``."""
    token = _NOTING.set(into)
    try:
        yield
    finally:
        _NOTING.reset(token)


class _Owned(list[Any]):
    """What a graph module owns of its call sites: their replaced subgraphs (which read the
    module's parameters, so they must not keep it alive from the registry) and their ids,
    removed from the registry when this list is freed with the module. A copy of the
    module (deepcopy, pickling) shares or drops it: the sites belong to the one compiled
    graph whose code passes their ids."""

    def __init__(self, static: bool) -> None:
        super().__init__()
        self.static = static
        self.ids: list[tuple[int, CallSite]] = []
        weakref.finalize(self, _forget, self.ids)

    def __deepcopy__(self, memo: dict[int, Any]) -> _Owned:
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return _Owned, (False,)


def _forget(ids: list[tuple[int, CallSite]]) -> None:
    with _SITES_LOCK:
        for sid, cs in ids:
            under = _KEYED.get(sid)
            if under is not None:  # a stable key: the latest live site left takes it
                if cs in under:
                    under.remove(cs)
                if under:
                    _SITES[sid] = under[-1]
                    continue
                del _KEYED[sid]
            if _SITES.get(sid) is cs:
                del _SITES[sid]


class _WeakFallback:
    """A site's replaced subgraph, reached through a weak reference: its owner holds it."""

    __slots__ = ("_ref",)

    def __init__(self, fallback: Callable[..., Any]) -> None:
        self._ref = weakref.ref(fallback)

    def _target(self) -> Any:
        fallback = self._ref()
        if fallback is None:
            raise KernelCallError("pdlkit: a call site outlived the graph module that owned it")
        return fallback

    def __call__(self, *args: Any) -> Any:
        return self._target()(*args)

    def __getattr__(self, name: str) -> Any:  # compiled_signatures, compile, ...
        if name == "_ref":  # not set yet (a copy being made)
            raise AttributeError(name)
        return getattr(self._target(), name)


def new_site(site: CallSite, owner: Any = None, key: int | None = None) -> int:
    """Register ``site``; its id is what compiled code passes: ``key`` where given (an id
    stable across compilations of the same graph; a later site under the same key takes
    over), else a new one. ``owner``, the graph module whose code calls it, decides how
    long it lives: the site is removed when that module is freed (Dynamo keeps the module
    of eager code generation with its compiled frame; Inductor's compiled function keeps
    the module it compiled). Without an owner the site lives until :func:`drop_site`."""
    owned = None
    if owner is not None:
        owned = owner.__dict__.get(_OWNED)
        if owned is None:
            owned = _Owned(_static_shapes(owner))
            setattr(owner, _OWNED, owned)
        owned.append(site.fallback)
        site.fallback = _WeakFallback(site.fallback)
        site.static = owned.static
        # one phase per site of the graph, so that no call of the graph runs all their
        # sampled checks at once (int8 bert-mini's 17 sites, 1 thread, the 2-core Xeon:
        # every 64th call 0.8 ms slower of 5; taking turns, one call in four 0.05-0.09 ms)
        site.phase = len(owned.ids)
    with _SITES_LOCK:
        sid = next(_SITE_IDS) if key is None else key
        _SITES.pop(sid, None)  # a later site under a key: last in registration order
        _SITES[sid] = site
        if key is not None and owned is not None:
            _KEYED.setdefault(key, []).append(site)
        if owned is not None:
            owned.ids.append((sid, site))
    into = _NOTING.get()
    if into is not None and owned is not None:
        into.sites.append(weakref.ref(site))
        if not any(o is owner for o in into.owners):
            into.owners.append(owner)
    return sid


def owned(owner: Any) -> list[CallSite]:
    """The call sites registered with ``owner`` (:func:`new_site`), in registration order."""
    mine = owner.__dict__.get(_OWNED) if hasattr(owner, "__dict__") else None
    return [cs for _, cs in mine.ids] if mine is not None else []


def site(sid: int) -> CallSite | None:
    return _SITES.get(sid)


def drop_site(sid: int) -> None:
    """Forget a call site (one made only to time a kernel: runtime_abi/autotune.py)."""
    with _SITES_LOCK:
        _SITES.pop(sid, None)


def transpose_args(args: Sequence[Any], which: tuple[int, ...]) -> tuple[Any, ...]:
    """A call's arguments with those at ``which`` transposed (``CallSite.transposed``)."""
    return tuple(a.t() if i in which else a for i, a in enumerate(args))


def _static_shapes(gm: Any) -> bool:
    """Whether no value in the graph has a symbolic size (dynamic or data-dependent)."""
    graph = getattr(gm, "graph", None)
    if graph is None:
        return False
    for node in graph.nodes:
        for v in torch.utils._pytree.tree_leaves(node.meta.get("val")):
            if isinstance(v, torch.SymInt) or (
                isinstance(v, torch.Tensor) and not all(type(d) is int for d in v.shape)
            ):
                return False
    return True

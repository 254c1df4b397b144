"""The bounded pre-pack cache: constant weights packed once per kernel.

Keyed by the weight tensor's identity *and* its version counter, so an in-place update
(``weight.add_(...)``, ``load_state_dict``) makes the next call pack again; an entry is
used only while the weight still has the storage it was packed from, so that replacing it
(``module.weight.data = new``, ``set_``, which keep the tensor and its version) packs again
too. Entries die with their tensor (weakref) and are evicted least-recently-used beyond
``max_bytes`` (``PDLKIT_PREPACK_BYTES``: bytes, or a size such as ``1GiB``, ``512M``,
``64KiB``; default 1 GiB). Hits, misses and evictions are counted in ``pdlkit.stats()``.
Threads that miss on the same key at once pack it once: the others wait for that result
(a weight is never packed twice concurrently).
"""

from __future__ import annotations

import os
import re
import sys
import threading
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import torch
from pdlkit.runtime_abi.binding_stats import count

_DEFAULT_BYTES = 1 << 30
ENV = "PDLKIT_PREPACK_BYTES"


def _units() -> dict[str, int]:
    """K, M, G, T and KiB ... TiB are powers of 1024; KB ... TB powers of 1000; B: bytes."""
    units = {"": 1, "b": 1}
    for i, k in enumerate("kmgt", start=1):
        units |= {k: 1024**i, f"{k}ib": 1024**i, f"{k}b": 1000**i}
    return units


_UNITS = _units()
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?)\s*([a-z]*)\s*", re.IGNORECASE)
_SIZES = "bytes (1073741824) or a size with a unit: 1GiB, 512M, 64KiB, 2GB"


def parse_bytes(text: str) -> int:
    """A size in bytes from ``"1073741824"``, ``"1GiB"``, ``"512M"``, ``"1.5 GB"``: K, M, G,
    T and KiB ... TiB are powers of 1024, KB ... TB powers of 1000, case-insensitive."""
    m = _SIZE.fullmatch(text)
    unit = _UNITS.get(m.group(2).lower()) if m else None
    if m is None or unit is None:
        raise ValueError(f"{text!r} is not a size; expected {_SIZES}")
    return int(float(m.group(1)) * unit)


def _max_bytes_from_env() -> int:
    """``PDLKIT_PREPACK_BYTES``, or the default; a value that is no size warns (naming the
    variable and what it takes) and leaves the default: importing pdlkit never fails on it."""
    text = os.environ.get(ENV, "").strip()
    if not text:
        return _DEFAULT_BYTES
    try:
        return parse_bytes(text)
    except ValueError:
        warnings.warn(
            f"pdlkit: {ENV}={text!r} is not a size; expected {_SIZES} "
            "(K/M/G and KiB/MiB/GiB are powers of 1024, KB/MB/GB of 1000); "
            "the pre-pack cache keeps its default bound of 1 GiB",
            RuntimeWarning,
            stacklevel=2,
        )
        return _DEFAULT_BYTES


def _nbytes(x: Any) -> int:
    if isinstance(x, torch.Tensor):
        try:
            return x.untyped_storage().nbytes()
        except (RuntimeError, NotImplementedError):  # opaque (e.g. mkldnn) tensors
            return x.element_size() * x.numel()
    if isinstance(x, tuple | list):
        return sum(_nbytes(v) for v in x)
    return sys.getsizeof(x)


def attrs_key_of(attrs: Mapping[str, Any]) -> tuple[Any, ...]:
    return tuple(sorted((k, repr(v)) for k, v in attrs.items()))


def storage_of(t: torch.Tensor) -> Any:
    """The tensor's storage object (the same Python object while the storage lives, so a
    weak reference to it dies with it), or None for tensors without one."""
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError):  # opaque (e.g. mkldnn) tensors
        return None


def version_of(t: torch.Tensor) -> int:
    """``t._version``; -1 for an inference tensor (made under ``torch.inference_mode()``),
    which keeps no version counter (reading it raises): what the caches keyed by it see of an
    inference tensor is its identity, storage and data pointer; a write in place into it,
    possible only in inference mode, is not seen."""
    try:
        return t._version
    except RuntimeError:  # "Inference tensors do not track version counter"
        return -1


def _storage_refs(tensors: tuple[torch.Tensor, ...]) -> tuple[Any, ...]:
    refs = []
    for t in tensors:
        s = storage_of(t)
        try:
            refs.append(weakref.ref(s) if s is not None else None)
        except TypeError:  # a storage that cannot be weakly referenced: not checked
            refs.append(None)
    return tuple(refs)


def _same_storages(refs: tuple[Any, ...], tensors: tuple[torch.Tensor, ...]) -> bool:
    """Whether each tensor still has the storage its entry was packed from."""
    return all(r is None or r() is storage_of(t) for r, t in zip(refs, tensors, strict=True))


def _identity(t: torch.Tensor) -> tuple[Any, Any, int]:
    """``(owner, geometry, version)`` of a packed tensor. A view (a weight canonicalized to
    ``t(w)``, made afresh by each call) is keyed by its base parameter and its geometry, so it
    packs once like the parameter would."""
    base = t._base
    if base is None:
        return t, None, version_of(t)
    return base, (t.shape, t.stride(), t.storage_offset()), version_of(t)


def _identity_of_view(t: torch.Tensor, of: torch.Tensor | None) -> tuple[Any, Any, int]:
    """``_identity(t)`` where ``t`` is a view of ``of`` (a call site's transpose of the
    weight it was given) made where autograd does not track views, inside a dispatch mode
    (AOTAutograd runs a compiled graph's first call under one): ``t._base`` is None there
    and its version counter a fresh one. Keyed as the tracked view would be, by ``of``'s
    base parameter, ``t``'s geometry and the parameter's version, so that the first call's
    pack is the one later calls find."""
    if of is None or t._base is not None or storage_of(t) is not storage_of(of):
        return _identity(t)
    base = of._base if of._base is not None else of
    return base, (t.shape, t.stride(), t.storage_offset()), version_of(base)


class PrepackCache:
    def __init__(self, max_bytes: int | None = None):
        self.max_bytes = max_bytes if max_bytes is not None else _max_bytes_from_env()
        # re-entrant: a weight's finalizer may run (garbage collection) while this thread
        # holds the lock
        self._lock = threading.RLock()
        self._inflight: dict[tuple[Any, ...], threading.Event] = {}
        # key -> (packed, its size, weak references to the storages it was packed from)
        self._entries: OrderedDict[tuple[Any, ...], tuple[Any, int, tuple[Any, ...]]] = (
            OrderedDict()
        )
        self._bytes = 0
        self._finalizers: dict[int, Any] = {}

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def get(
        self,
        kernel: str,
        pack: Callable[[Any, Mapping[str, Any]], Any],
        weight: torch.Tensor,
        attrs: Mapping[str, Any] | Callable[[], Mapping[str, Any]],
        attrs_key: tuple[Any, ...] | None = None,
        with_: tuple[torch.Tensor, ...] = (),
        view_of: torch.Tensor | None = None,
    ) -> Any:
        """The packed weight; ``attrs_key`` (see :func:`attrs_key`) may be computed once by
        a caller whose attributes never change, such as a call site, which may then pass
        ``attrs`` as a function that builds them (only a miss needs them). ``with_``: the
        further tensors the packed form is made from (a kernel's ``prepack_with``), keyed
        like the weight. ``view_of``: the tensor ``weight`` is a view of, where the caller
        made that view (see :func:`_identity_of_view`)."""
        if attrs_key is None:
            attrs_key = attrs_key_of(attrs() if callable(attrs) else attrs)
        owner, *ident = _identity_of_view(weight, view_of)
        others = tuple(_identity(t) for t in with_)
        key = (kernel, id(owner), *ident, attrs_key, tuple((id(o), *i) for o, *i in others))
        tensors = (weight, *with_)
        while True:
            with self._lock:
                hit = self._entries.get(key)
                if hit is not None and _same_storages(hit[2], tensors):
                    self._entries.move_to_end(key)
                    count("prepack_hits", kernel)
                    return hit[0]
                busy = self._inflight.get(key)
                if busy is None:
                    mine = self._inflight[key] = threading.Event()
                    break
            busy.wait()  # another thread packs this key; then look again
        try:
            # outside the lock: packing can be slow
            packed = pack(weight, attrs() if callable(attrs) else attrs)
            size = _nbytes(packed)
            with self._lock:
                count("prepack_misses", kernel)
                # older versions of the same tensor (or the same view of it)
                self._drop(lambda k: k[:3] == key[:3])
                if size <= self.max_bytes:
                    self._entries[key] = (packed, size, _storage_refs(tensors))
                    self._bytes += size
                    self._watch(owner)
                    for o, *_ in others:
                        self._watch(o)
                    while self._bytes > self.max_bytes:
                        old, (_, n, _) = self._entries.popitem(last=False)
                        self._bytes -= n
                        count("prepack_evictions", old[0])
        finally:  # cached (or failed) before the waiters look again
            with self._lock:
                del self._inflight[key]
            mine.set()
        return packed

    def _watch(self, weight: torch.Tensor) -> None:
        wid = id(weight)
        if wid not in self._finalizers:
            self._finalizers[wid] = weakref.finalize(weight, self._forget, wid)

    def _forget(self, wid: int) -> None:
        with self._lock:
            self._finalizers.pop(wid, None)
            self._drop(lambda k: k[1] == wid or any(o[0] == wid for o in k[5]))

    def _drop(self, pred: Callable[[tuple[Any, ...]], bool]) -> None:
        for k in [k for k in self._entries if pred(k)]:
            _, n, _ = self._entries.pop(k)
            self._bytes -= n

    def release(self, kernels: set[str]) -> int:
        """Free the packed weights of ``kernels`` (a recompilation no longer uses them);
        returns how many entries were freed. A graph still calling one packs again."""
        with self._lock:
            before = len(self._entries)
            self._drop(lambda k: k[0] in kernels)
            return before - len(self._entries)

    def kernels(self) -> set[str]:
        """The kernels that hold packed weights now."""
        with self._lock:
            return {k[0] for k in self._entries}

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0


CACHE = PrepackCache()

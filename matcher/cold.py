"""Timing a site as the model runs it: its weights where the rest of the model leaves them.

    before: each candidate was timed by calling it again and again on the same weights, which
            stayed in the core's caches between calls; in the model every other layer's
            weights pass through the caches between two calls of a site. On a 2-core Xeon with
            AMX, BERT-base BF16 on 1 thread (170 MB of weights): pdlkit's AMX GEMM measured
            0.78x oneDNN's time at 128x768x768 and won those 49 sites, yet with its weights out
            of the caches it runs 0.94-1.12x oneDNN's (five runs); the model ran 0.857-0.897x
            BF16 Inductor with that choice and 0.810-0.841x with oneDNN at every site
    after:  each timed call takes the next of ``n`` copies of the site's weights (its arguments
            that are graph inputs or constants, :data:`MIN_BYTES` or more, views of them
            included), the copies adding up to the model's own constant bytes (at most
            :data:`CAP_BYTES`, :data:`MAX_COPIES` copies): as in the model, a call finds its
            weights where the other weights' traffic left them. Kernels pack each copy once,
            outside the timing (:class:`Rotation`'s warm-up)

Only on the CPU (a GPU's weights come from its memory at every call of a large model either
way, and its caches are flushed by the timing itself); the copies exist while the site is timed.
``benchmarks/x86_cold_weights.py`` shows the two timings side by side per shape.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

# an argument smaller than this is not copied (a bias, a scale: little of a call's traffic)
MIN_BYTES = 64 << 10
# the copies of one site's weights add up to at most this many bytes (past a core's L2 and
# much of its share of L3): each copy is packed by each candidate, so this is what the timing
# costs; on the 2-core Xeon with AMX, BERT-base int8 1x128, the tuning of its 6 distinct sites
# took 0.3-0.4 s with the weights in the caches, 2.5 s with 32 MiB of copies, 6.3-6.7 s with
# 128 MiB, and 32 MiB gave the same choices as 128 at BERT-base's BF16 sites
CAP_BYTES = 32 << 20
# ... and are at most this many (each kernel packs each copy once)
MAX_COPIES = 64


def model_bytes(tensors: Iterable[Any]) -> int:
    """The bytes of the distinct CPU storages among ``tensors`` (the graph's inputs, its
    parameters among them, and its constants): the weights a call of the model reads."""
    seen: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.device.type == "cpu" and not t.is_meta:
            try:
                storage = t.untyped_storage()
            except (RuntimeError, NotImplementedError):  # opaque tensors (oneDNN's, sparse)
                continue
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def copies(site_bytes: int, total_bytes: int) -> int:
    """How many copies of a site's weights (``site_bytes``) a timing rotates through for a
    model whose weights add up to ``total_bytes``: 1 (no copies) where the model's weights
    are no more than the site's own."""
    if site_bytes <= 0:
        return 1
    wanted = math.ceil(min(total_bytes, CAP_BYTES) / site_bytes)
    return max(1, min(MAX_COPIES, wanted))


def weighty(value: Any) -> bool:
    """Whether ``value`` is a weight a timing copies: a CPU tensor of :data:`MIN_BYTES` or
    more with a storage of its own."""
    return (
        isinstance(value, torch.Tensor)
        and value.device.type == "cpu"
        and value.layout == torch.strided
        and value.nbytes >= MIN_BYTES
    )


def clone(value: torch.Tensor) -> torch.Tensor:
    """A copy of ``value`` with its strides, not requiring a gradient."""
    with torch.no_grad():
        return value.detach().clone(memory_format=torch.preserve_format)


class Rotation:
    """A call for :func:`pdlkit.runtime_abi.autotune.measure` that runs the next of ``calls``
    each time; :meth:`warm_up` (run by ``measure`` before it times anything) runs each once,
    so that packing a copy's weight is never timed."""

    def __init__(self, calls: Sequence[Callable[[], Any]]):
        self.calls = list(calls)
        self._next = itertools.cycle(self.calls)

    def warm_up(self) -> None:
        for call in self.calls:
            call()

    def __call__(self) -> Any:
        return next(self._next)()


def rotating(calls: Sequence[Callable[[], Any]]) -> Callable[[], Any]:
    """``calls[0]`` where there is one call, else a :class:`Rotation` of them."""
    return calls[0] if len(calls) == 1 else Rotation(calls)

"""Reference semantics of logical ops: what a pattern means, independent of any kernel.

``pdlkit abi-check`` runs every kernel against the reference of the op it implements, on
the reference's example inputs. Declare one next to your kernels::

    @pdlkit.reference("linear_relu", examples=lambda dtype: [(x, w, b), ...])
    def linear_relu(x, w, b):
        return torch.relu(torch.nn.functional.linear(x, w, b))
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

Examples = Callable[[torch.dtype], Iterable[tuple[Any, ...]]]


@dataclass(frozen=True)
class Reference:
    op: str
    fn: Callable[..., Any]
    examples: Examples


_REFERENCES: dict[str, Reference] = {}
_LOCK = threading.Lock()


def reference(op: str, *, examples: Examples) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register ``fn`` as the semantics of logical op ``op`` (the last file loaded wins)."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        with _LOCK:
            _REFERENCES[op] = Reference(op, fn, examples)
        return fn

    return wrap


def lookup(op: str) -> Reference | None:
    return _REFERENCES.get(op)

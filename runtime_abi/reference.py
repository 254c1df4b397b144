"""Reference semantics of logical ops, the older form: ``@pdlkit.reference(op, examples=...)``.

before: @pdlkit.reference("linear_relu", examples=...) put fn in a global table (the last
        file loaded won) and kernels repeated the op's parameters, types and meta
after:  it declares an untyped :class:`~pdlkit.runtime_abi.ops.LogicalOp` (names only),
        found in its file like any op; ``@pdlkit.op`` with annotations and ``meta=`` is
        the form that kernels can ``implements=`` (see :mod:`pdlkit.runtime_abi.ops`)

@pdlkit.reference("linear_relu", examples=lambda dtype: [(x, w, b), ...])
def linear_relu(x, w, b):
    return torch.relu(torch.nn.functional.linear(x, w, b))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pdlkit.runtime_abi.ops import Examples, LogicalOp, declare_op, lookup

__all__ = ["Examples", "lookup", "reference"]


def reference(op: str, *, examples: Examples) -> Callable[[Callable[..., Any]], LogicalOp]:
    """Declare ``fn`` as the semantics of logical op ``op`` (its annotations, if complete, and
    no meta: names only)."""

    def wrap(fn: Callable[..., Any]) -> LogicalOp:
        return declare_op(fn, name=op, examples=examples, typed=False)

    return wrap

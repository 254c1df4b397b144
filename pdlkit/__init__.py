"""pdlkit: substitute matched subgraphs of PyTorch models with custom kernels.

    import pdlkit
    compiled = torch.compile(model, backend="pdlkit")     # or pdlkit.optimize(model, ...)
    print(pdlkit.explain(model, x))                       # what was substituted, and why not

Importing pdlkit registers the ``"pdlkit"`` Dynamo backend.
"""

from __future__ import annotations

from pdlkit.backend import PdlkitBackend, PdlkitError, explain, optimize, pdlkit_backend
from pdlkit.bisection import bisect
from pdlkit.runtime_abi.binding import KernelCallError
from pdlkit.runtime_abi.binding_stats import stats
from pdlkit.runtime_abi.kernel import KernelDeclarationError, KernelUnsupported, kernel
from pdlkit.runtime_abi.reference import reference

__version__ = "0.1.0"

__all__ = [
    "KernelCallError",
    "KernelDeclarationError",
    "KernelUnsupported",
    "PdlkitBackend",
    "PdlkitError",
    "bisect",
    "explain",
    "kernel",
    "optimize",
    "reference",
    "stats",
]


def _register() -> None:
    from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend

    if "pdlkit" not in _COMPILER_FNS:
        register_backend(compiler_fn=pdlkit_backend, name="pdlkit")


_register()

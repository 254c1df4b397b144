"""pdlkit: substitute matched subgraphs of PyTorch models with custom kernels.

    import pdlkit
    compiled = torch.compile(model, backend="pdlkit")     # or pdlkit.optimize(model, ...)
    print(pdlkit.explain(model, x))                       # what was substituted, and why not

The ``"pdlkit"`` Dynamo backend is declared as a ``torch_dynamo_backends`` entry point, so
``torch.compile(model, backend="pdlkit")`` finds it without ``import pdlkit``; where pdlkit
runs without its installed metadata, importing it registers the backend. The names below
are imported on first use (``import pdlkit`` itself does not import torch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pdlkit.lazy import lazy_names

__version__ = "0.1.0"

_EXPORTS = {
    "ConfigError": "pdlkit.errors",
    "KernelCallError": "pdlkit.runtime_abi.binding",
    "KernelDeclarationError": "pdlkit.runtime_abi.kernel",
    "KernelUnsupported": "pdlkit.runtime_abi.kernel",
    "PdlkitBackend": "pdlkit.backend",
    "PdlkitError": "pdlkit.errors",
    "bisect": "pdlkit.bisection",
    "explain": "pdlkit.backend",
    "kernel": "pdlkit.runtime_abi.kernel",
    "op": "pdlkit.runtime_abi.ops",
    "optimize": "pdlkit.backend",
    "pdlkit_backend": "pdlkit.backend",
    "reference": "pdlkit.runtime_abi.reference",
    "stats": "pdlkit.runtime_abi.binding_stats",
}

__all__ = [
    "ConfigError",
    "KernelCallError",
    "KernelDeclarationError",
    "KernelUnsupported",
    "PdlkitBackend",
    "PdlkitError",
    "bisect",
    "explain",
    "kernel",
    "op",
    "optimize",
    "reference",
    "stats",
]

if TYPE_CHECKING:
    from pdlkit.backend import PdlkitBackend, explain, optimize
    from pdlkit.backend import pdlkit_backend as pdlkit_backend
    from pdlkit.bisection import bisect
    from pdlkit.errors import ConfigError, PdlkitError
    from pdlkit.runtime_abi.binding import KernelCallError
    from pdlkit.runtime_abi.binding_stats import stats
    from pdlkit.runtime_abi.kernel import KernelDeclarationError, KernelUnsupported, kernel
    from pdlkit.runtime_abi.ops import op
    from pdlkit.runtime_abi.reference import reference


__getattr__ = lazy_names(__name__, _EXPORTS, globals())


def _declared_as_entry_point() -> bool:
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        eps = distribution("pdlkit").entry_points
    except PackageNotFoundError:
        return False
    return any(ep.group == "torch_dynamo_backends" and ep.name == "pdlkit" for ep in eps)


def _register() -> None:
    """Register the backend by name when torch cannot find it through the entry point
    (registering it here as well would make torch's own entry-point load a duplicate)."""
    if _declared_as_entry_point():
        return
    from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend

    from pdlkit.backend import pdlkit_backend

    if "pdlkit" not in _COMPILER_FNS:
        register_backend(compiler_fn=pdlkit_backend, name="pdlkit")


_register()

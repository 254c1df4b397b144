"""Optional dependencies: one clear message naming what is missing, never a deep ImportError.

* ``torch-mlir`` (the pattern matcher): without it the ``"pdlkit"`` backend warns once and
  compiles with Inductor alone; ``explain`` and ``pdlkit check`` report it.
* ``numba``, ``cupy``, ``triton``, ... imported by a kernel file: that file's kernels are
  skipped with one warning naming the package; every other kernel still loads.
* ``mlir-pdll`` (for ``*.pdll`` pattern files): the pattern loader names it and the Debian
  package that provides it.
"""

from __future__ import annotations

import importlib

from pdlkit.errors import PdlkitError

INSTALL = {
    "torch_mlir": "pip install torch-mlir==20261001",
    "numba": "pip install numba",
    "cupy": "pip install 'pdlkit[cuda]' (cupy-cuda13x)",
    "triton": "pip install triton",
    "torchao": "pip install 'pdlkit[quant]' (torchao)",
}
PACKAGE = {"torch_mlir": "torch-mlir"}


class MissingDependency(PdlkitError, RuntimeError):
    """An optional dependency is not installed; the message names it and how to install it."""

    def __init__(self, module: str, purpose: str, detail: str = ""):
        self.module = module
        top = module.split(".")[0]
        hint = INSTALL.get(top, f"pip install {top}")
        package = PACKAGE.get(top, top)
        state = f"which cannot be imported ({detail})" if detail else "which is not installed"
        super().__init__(f"{purpose} needs {package}, {state}: {hint}")


def require(module: str, purpose: str) -> None:
    """Import ``module`` or raise :class:`MissingDependency` saying what needs it."""
    try:
        importlib.import_module(module)
    except ImportError as e:
        raise MissingDependency(module, purpose, str(e)) from e


def require_matcher() -> None:
    """The pattern matcher's dependency (torch-mlir's MLIR bindings and FX importer)."""
    require("torch_mlir.ir", "pdlkit's pattern matcher")
    require("torch_mlir.extras.fx_importer", "pdlkit's pattern matcher")


def missing_module(e: ImportError) -> str | None:
    """The top-level module an ImportError says is missing, when it is one that cannot be
    imported at all (not a broken import inside an installed package)."""
    name = getattr(e, "name", None)
    if not name:
        return None
    top = name.split(".")[0]
    try:
        importlib.import_module(top)
    except ImportError:
        return top
    return None

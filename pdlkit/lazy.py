"""A package's names imported on first use (PEP 562): ``pdlkit`` and ``pdlkit.matcher``.

before: from pdlkit.backend import optimize        # at import: torch, Inductor, ...
after:  __getattr__ = lazy_names("pdlkit", {"optimize": "pdlkit.backend"}, globals())
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(
    package: str, homes: Mapping[str, str], namespace: dict[str, Any]
) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: ``homes[name]``'s ``name``, imported on first
    use and kept in ``namespace`` (the package's globals), so that later reads skip it."""

    def __getattr__(name: str) -> Any:
        module = homes.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    return __getattr__

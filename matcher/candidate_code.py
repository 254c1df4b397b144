"""The code Inductor loads for a graph compiled only to be timed, unloaded when it loses.

before: Inductor keeps every output module it loads (``sys.modules``, ``PyCodeCache``), and
        under ``freezing`` a module holds the graph's constants, its packed weights among
        them. The whole-graph check compiles two to four graphs and runs one, so the losers'
        constants stayed: BERT-base int8-dynamic on the EPYC held 205 MB more after
        ``pdlkit.optimize`` than with ``autotune="off"`` (benchmarks/x86_memory.py)
after:  :class:`Loaded` notes the modules each candidate's compile loaded; :meth:`unload`
        takes the losers' out of Inductor's registries, so that they are freed with the
        losers' code. The winner keeps its module through its own functions, even one it
        shares with a loser; a later compile of the same code loads it again from disk.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any


def _loaded() -> dict[int, ModuleType]:
    from torch._inductor.codecache import PyCodeCache

    return {id(m): m for m in getattr(PyCodeCache, "modules", [])}


class Loaded:
    """The output modules loaded by each candidate's compile, by candidate name."""

    def __init__(self) -> None:
        self.by_name: dict[str, dict[int, ModuleType]] = {}

    def tracked(self, name: str, make: Callable[[], Any]) -> Callable[[], Any]:
        """``make`` (a candidate's compile), noting the modules it loads under ``name``."""

        def run() -> Any:
            before = _loaded()
            try:
                return make()
            finally:
                new = {i: m for i, m in _loaded().items() if i not in before}
                self.by_name.setdefault(name, {}).update(new)

        return run

    def unload(self, winner: str) -> int:
        """Take the modules that only candidates other than ``winner`` loaded out of
        Inductor's registries; returns how many."""
        keep = self.by_name.get(winner, {})
        gone = {
            i: m
            for n, ms in self.by_name.items()
            if n != winner
            for i, m in ms.items()
            if i not in keep
        }
        if gone:
            _forget(gone)
        return len(gone)


def _forget(gone: dict[int, ModuleType]) -> None:
    from torch._inductor.codecache import PyCodeCache

    modules = getattr(PyCodeCache, "modules", None)
    if isinstance(modules, list):
        modules[:] = [m for m in modules if id(m) not in gone]
    no_attr = getattr(PyCodeCache, "modules_no_attr", None)
    for m in gone.values():
        if sys.modules.get(m.__name__) is m:
            del sys.modules[m.__name__]
        path = getattr(m, "__file__", None)
        if isinstance(no_attr, dict) and no_attr.get(path) is m:
            del no_attr[path]

"""No import cycles between pdlkit's modules, function-local imports counted.

A function-local import may delay an optional dependency or start-up cost; it must not hide
a cycle (module A importing B inside a function because B imports A).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {
    "pdlkit": "pdlkit",
    "matcher": "pdlkit.matcher",
    "runtime_abi": "pdlkit.runtime_abi",
    "quantization": "pdlkit.quantization",
}


def _modules() -> dict[str, Path]:
    out = {}
    for folder, package in PACKAGES.items():
        for f in (ROOT / folder).glob("*.py"):
            out[package if f.stem == "__init__" else f"{package}.{f.stem}"] = f
    return out


def _imports(tree: ast.Module, known: dict[str, Path]) -> set[str]:
    """The pdlkit modules a module imports anywhere (not under ``if TYPE_CHECKING:``)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.ImportFrom) and (child.module or "").startswith("pdlkit"):
                for alias in child.names:
                    name = f"{child.module}.{alias.name}"
                    found.add(name if name in known else str(child.module))
            elif isinstance(child, ast.Import):
                found.update(a.name for a in child.names if a.name.startswith("pdlkit"))
            visit(child)

    visit(tree)
    return {m for m in found if m in known}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return out


def test_no_import_cycles_among_pdlkit_modules() -> None:
    known = _modules()
    graph = {m: _imports(ast.parse(f.read_text()), known) - {m} for m, f in known.items()}
    # the package imports its public names lazily (pdlkit.__getattr__): not an edge back
    graph["pdlkit"] = set()
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle_through_a_function_local_import() -> None:
    known = {"pdlkit.a": Path("a.py"), "pdlkit.b": Path("b.py")}
    a = ast.parse("from pdlkit import b\n")
    b = ast.parse("def f():\n    from pdlkit import a\n")
    graph = {"pdlkit.a": _imports(a, known), "pdlkit.b": _imports(b, known)}
    assert _cycles(graph) == [["pdlkit.a", "pdlkit.b"]]


def test_matching_imports_nothing_from_runtime_abi() -> None:
    """Matching (the MLIR session producing records) asks kernel choice through a protocol;
    kernel choice (pick.py) and the FX rewrite (fx_rewrite.py) are where runtime_abi comes in."""
    known = _modules()
    for name in ("pdlkit.matcher.match", "pdlkit.matcher.match_context", "pdlkit.matcher.records"):
        imported = _imports(ast.parse(known[name].read_text()), known)
        assert not {m for m in imported if m.startswith("pdlkit.runtime_abi")}, name

"""tui imports in one direction: no module of it imports, at module level or inside a
function, one that imports it back (grimp reads every import, deferred ones and
``TYPE_CHECKING`` ones too), and no module hides an import from the graph behind
``importlib``. A circle here was a widget reaching up to its screen, or a help screen reading the
bindings of the screen that opens it."""

from __future__ import annotations

from pathlib import Path

import grimp

TUI = Path(__file__).resolve().parents[2] / "tui"


def _cycles(graph: grimp.ImportGraph, package: str) -> list[list[str]]:
    """The strongly connected components of more than one module under ``package``."""
    modules = sorted(m for m in graph.modules if m == package or m.startswith(package + "."))
    inside = set(modules)
    edges = {m: sorted(graph.find_modules_directly_imported_by(m) & inside) for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm; the graph is small
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for m in modules:
        if m not in index:
            visit(m)
    return found


def test_tui_has_no_import_circles() -> None:
    graph = grimp.build_graph("tui", "engine", "profiles", "cli")
    assert _cycles(graph, "tui") == []


def test_tui_imports_no_module_by_name() -> None:
    hidden = [
        str(p.relative_to(TUI.parent))
        for p in sorted(TUI.rglob("*.py"))
        if "import_module(" in p.read_text() or "__import__(" in p.read_text()
    ]
    assert hidden == []

"""Architecture checks that `make lint` runs through import-linter, and the size limits.

`AcyclicFilesContract` is an import-linter contract type (registered in pyproject.toml's
`contract_types`): no import circle between two files of the project, counting module-level and
deferred (function-level) imports alike, TYPE_CHECKING imports aside. A circle between files
means neither can be read, tested or moved without the other; the layers contracts only see
circles that cross a layer.

`oversized` lists the classes and functions past the project's size limits; tests/test_architecture.py
asserts it is empty.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from importlinter.application import output
from importlinter.domain import fields
from importlinter.domain.contract import Contract, ContractCheck

MAX_CLASS_LINES = 300
MAX_FUNCTION_LINES = 80
# (path relative to the repository, qualified name): the one function allowed past the limit.
SIZE_EXCEPTIONS = {("engine/trainer/train.py", "main")}


def import_cycles(graph: Any, packages: Iterable[str]) -> list[list[str]]:
    """Every strongly connected component of two or more modules (or a module importing itself)."""
    prefixes = tuple(packages)
    modules = sorted(
        m for m in graph.modules if m in prefixes or m.startswith(tuple(p + "." for p in prefixes))
    )
    inside = set(modules)
    edges = {
        m: sorted(i for i in graph.find_modules_directly_imported_by(m) if i in inside)
        for m in modules
    }
    return [c for c in _strongly_connected(modules, edges) if len(c) > 1 or c[0] in edges[c[0]]]


def _strongly_connected(nodes: list[str], edges: dict[str, list[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative (no recursion limit on long chains)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in nodes:
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(edges[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        component.append(top)
                        if top == node:
                            break
                    found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = counter
                counter += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(edges[child])))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return sorted(found)


class AcyclicFilesContract(Contract):
    """No import circle between the files of `packages` (a list of top-level packages)."""

    packages = fields.ListField(subfield=fields.StringField())

    def check(self, graph: Any, verbose: bool) -> ContractCheck:
        cycles = import_cycles(graph, [str(p) for p in self.packages])  # type: ignore[attr-defined]
        chains = {tuple(c): _one_chain(graph, c) for c in cycles}
        return ContractCheck(kept=not cycles, metadata={"cycles": cycles, "chains": chains})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for cycle in check.metadata["cycles"]:
            chain = check.metadata["chains"][tuple(cycle)]
            output.print_error(f"Import circle between {len(cycle)} files:", bold=True)
            output.print_error("    " + " -> ".join(chain))
            output.new_line()


def _one_chain(graph: Any, cycle: list[str]) -> list[str]:
    """One concrete circle through the component's first module, for the message."""
    start = cycle[0]
    members = set(cycle)
    for nxt in sorted(graph.find_modules_directly_imported_by(start)):
        if nxt not in members:
            continue
        back = graph.find_shortest_chain(importer=nxt, imported=start)
        if back:
            return [start, *back]
    return cycle


def oversized(root: Path, packages: Iterable[str]) -> list[str]:
    """Classes over MAX_CLASS_LINES and functions over MAX_FUNCTION_LINES, as 'path:line name (n)'."""
    found: list[str] = []
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    limit = MAX_CLASS_LINES
                elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    limit = MAX_FUNCTION_LINES
                else:
                    continue
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > limit and (rel, node.name) not in SIZE_EXCEPTIONS:
                    found.append(f"{rel}:{node.lineno} {node.name} ({lines} lines, limit {limit})")
    return found

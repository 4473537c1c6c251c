"""No import cycles among the modules of ``app/`` (issue 16, done-when 3).

The import graph is read with ``ast`` (nothing is imported): an edge ``a -> b`` for every ``import b`` and
``from b import x`` of module ``a`` (``from pkg import mod`` names the submodule ``pkg.mod`` when it is
one), relative imports resolved. ``MODULE_LEVEL`` reads the statements that run at import time (the
module body, including ``if``/``try`` blocks, but not ``if TYPE_CHECKING:``, which never runs);
``DEFERRED`` adds the imports inside functions, a common way of hiding a cycle rather than removing it.

A cycle is reported as its path, e.g. ``app.placement.request -> app.placement.selectors ->
app.placement.request``. ``ALLOWED`` would list a known cycle with the issue that owns it; it is empty
and should stay so.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

APP = Path(__file__).resolve().parent.parent / "app"
ALLOWED: dict[frozenset[str], str] = {}  # frozenset of a cycle's modules -> owning issue


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(APP.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES: dict[str, Path] = {_module_name(p): p for p in APP.rglob("*.py")}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(body: list[ast.stmt], deferred: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                yield from _import_nodes(node.body, deferred)
            yield from _import_nodes(node.orelse, deferred)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from _import_nodes(block, deferred)
        elif isinstance(node, (ast.With, ast.AsyncWith, ast.For, ast.While)):
            yield from _import_nodes(node.body, deferred)
        elif deferred and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield from _import_nodes(node.body, deferred)


def _known(name: str) -> str | None:
    """The app module ``name`` is, or is inside (``app.x.y.Z`` -> ``app.x.y``); None outside app."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(deferred: bool) -> dict[str, set[str]]:
    """module -> the app modules it imports (module level, or also inside functions)."""
    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets: set[str] = set()
        for node in _import_nodes(ast.parse(path.read_text()).body, deferred):
            if isinstance(node, ast.Import):
                targets.update(t for a in node.names if (t := _known(a.name)))
                continue
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                target = f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else _known(base)
                if target:
                    targets.add(target)
        targets.discard(module)
        graph[module] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (as a path that returns to its start) per strongly connected component of ``graph``
    with more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(component)
    return [_path_in(graph, c) for c in components]


def _path_in(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A cycle through the smallest module of ``component`` (breadth-first back to it)."""
    start = min(component)
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & component):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if child not in previous:
                    previous[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"no cycle in {component}")  # pragma: no cover: a component has one


def test_the_graph_sees_the_app() -> None:
    graph = import_graph(deferred=False)
    assert len(graph) > 100
    assert "app.placement.model" in graph["app.placement.pipeline"]  # a plain ``from x import y``
    assert "app.placement.filters.lease" in graph["app.placement.pipeline"]  # ``from pkg import module``
    assert "app.placement.plugins" not in graph["app.placement.options"]  # under TYPE_CHECKING only


def test_cycles_are_found_and_named() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e2"}, "e2": {"e"}}
    assert sorted(cycles(graph)) == [["a", "b", "c", "a"], ["e", "e2", "e"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("deferred", [False, True], ids=["module-level", "with-deferred-imports"])
def test_no_import_cycle_in_app(deferred: bool) -> None:
    found = [c for c in cycles(import_graph(deferred)) if frozenset(c) not in ALLOWED]
    assert not found, "import cycles in app/:\n" + "\n".join(" -> ".join(c) for c in found)

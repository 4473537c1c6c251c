"""No import cycle inside app/fleet: the graph of fleet module imports (module level and inside
functions alike) is acyclic, so every module can be read, tested and moved without its importers."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FLEET = ROOT / "app" / "fleet"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(sources: dict[str, str]) -> dict[str, set[str]]:
    """``{module: {fleet modules it imports}}``; ``from package import module`` counts as the module."""
    graph: dict[str, set[str]] = {name: set() for name in sources}
    for name, source in sources.items():
        for node in ast.walk(ast.parse(source)):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [
                    f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in sources else node.module
                    for alias in node.names
                ]
            graph[name] |= {target for target in targets if target in sources and target != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle found by a depth-first walk (each as the path that closes it)."""
    found: list[list[str]] = []
    state: dict[str, int] = {}  # 1 on the stack, 2 done

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                found.append(stack[stack.index(nxt) :] + [node, nxt] if nxt in stack else [node, nxt])
            elif nxt not in state:
                visit(nxt, stack + [node])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    return found


def test_no_import_cycle_in_fleet() -> None:
    sources = {module_name(path): path.read_text(encoding="utf-8") for path in FLEET.rglob("*.py")}
    graph = import_graph(sources)
    assert "app.fleet.requirements.os" in graph["app.fleet.requirements"]
    assert cycles(graph) == []


def test_a_cycle_is_found() -> None:
    sources = {
        "app.fleet.a": "from app.fleet.b import x",
        "app.fleet.b": "def f():\n    from app.fleet import c",
        "app.fleet.c": "import app.fleet.a",
        "app.fleet.d": "from app.fleet.a import y",
    }
    assert cycles(import_graph(sources)) == [["app.fleet.a", "app.fleet.b", "app.fleet.c", "app.fleet.a"]]

"""The layers of docs/architecture.md, checked on the source: routers hold no transaction code (the
service layer opens every transaction), ``app/db`` imports no domain module, and the lock order is
written once (app/db/locks.py) and stated as such in the architecture page."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from app.db.locks import LOCK_ORDER

ROOT = Path(__file__).resolve().parents[1]
API = ROOT / "app" / "api"
DB = ROOT / "app" / "db"

# What opens a transaction or a connection: engine.begin()/connect(), conn.begin(), and the helpers.
TRANSACTION_CALLS = frozenset({"begin", "connect", "begin_nested"})
TRANSACTION_NAMES = frozenset({"in_transaction", "read_only", "AsyncSession"})
# Files of app/api that still open one, and why; the list only shrinks.
NOT_YET = {
    "guard.py": "middleware, not a router: the key lookup in autocommit before the body is read",
}
DOMAIN = ("app.capacity", "app.inventory", "app.quota", "app.iam", "app.placement", "app.fleet")
DB_NOT_YET: dict[str, set[str]] = {}


def _api_files() -> list[Path]:
    return sorted(p for p in API.glob("*.py") if p.name not in NOT_YET)


def _transaction_code(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in TRANSACTION_CALLS:
            found.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Name) and node.id in TRANSACTION_NAMES:
            found.append(f"line {node.lineno}: {node.id}")
        elif isinstance(node, ast.ImportFrom) and node.module == "app.db.tx":
            found.append(f"line {node.lineno}: from app.db.tx import ...")
    return found


def test_the_router_files_are_found() -> None:
    names = {p.name for p in _api_files()}
    assert {"inventory.py", "quota.py", "iam.py", "placement.py", "health.py"} <= names


@pytest.mark.parametrize("path", _api_files(), ids=lambda p: p.name)
def test_a_router_opens_no_transaction(path: Path) -> None:
    assert _transaction_code(ast.parse(path.read_text())) == []


def test_the_check_sees_a_transaction() -> None:
    code = (
        "async def f(svc):\n    async with svc.engine.begin() as conn:\n        return await read_only(x)\n"
    )
    assert _transaction_code(ast.parse(code)) == ["line 2: .begin", "line 3: read_only"]


def _imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


@pytest.mark.parametrize("path", sorted(DB.glob("*.py")), ids=lambda p: p.name)
def test_db_imports_no_domain_module(path: Path) -> None:
    domain = {m for m in _imports(path) if m.startswith(DOMAIN)}
    assert domain <= DB_NOT_YET.get(path.name, set())


def test_the_lock_order_is_written_once_and_documented() -> None:
    order = " -> ".join(LOCK_ORDER)
    assert LOCK_ORDER[:3] == ("reservations", "pool lease", "pools") and LOCK_ORDER[-2] == "quota_usage"
    assert order in (ROOT / "docs" / "architecture.md").read_text()
    for path in (ROOT / "app").rglob("*.py"):  # no module defines a lock helper of its own
        tree = ast.parse(path.read_text())
        defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
        if path != DB / "locks.py":
            helpers = {
                "lock_pool",
                "lock_node",
                "lock_node_in_order",
                "lock_reservation",
                "pool_lease",
                "wait_for_pool_lease",
            }
            assert not defined & helpers, path


@pytest.mark.parametrize("package", ["inventory", "quota", "iam"])
def test_a_lower_service_uses_capacity_only_for_its_wake_edges(package: str) -> None:
    for path in sorted((ROOT / "app" / package).glob("*.py")):
        capacity = {m for m in _imports(path) if m == "app.capacity" or m.startswith("app.capacity.")}
        assert capacity <= {"app.capacity.edges"}, path


def test_nothing_imports_the_api() -> None:
    for path in sorted((ROOT / "app").rglob("*.py")):
        if API in path.parents or path.name in ("main.py", "cli.py", "openapi.py"):
            continue
        assert not {m for m in _imports(path) if m.startswith("app.api")}, path


CAPACITY = ROOT / "app" / "capacity"
# app/capacity's rooms (docs/architecture.md): what each may not import. Planning and the guarded commit
# never see each other; the commit knows neither the reservation service nor the placers above it.
ROOM_RULES = {
    "planning": (
        "app.capacity.commit.single",
        "app.capacity.placing",
        "app.capacity.reservations",
        "app.capacity.queue.worker",
        "app.capacity.controllers",
    ),
    "commit": (
        "app.capacity.planning",
        "app.capacity.placing",
        "app.capacity.reservations",
        "app.capacity.queue.worker",
        "app.capacity.controllers",
    ),
}


def test_capacity_is_in_rooms() -> None:
    rooms = {p.name for p in CAPACITY.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert {"planning", "commit", "placing", "reservations", "queue", "controllers"} <= rooms


@pytest.mark.parametrize("room", sorted(ROOM_RULES))
def test_a_capacity_room_imports_only_what_it_may(room: str) -> None:
    for path in sorted((CAPACITY / room).rglob("*.py")):
        forbidden = {m for m in _imports(path) if m.startswith(ROOM_RULES[room])}
        assert not forbidden, f"{path.relative_to(ROOT)} imports {sorted(forbidden)}"


def test_no_module_imports_another_modules_private_names() -> None:
    found = []
    for path in sorted((ROOT / "app").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("app"):
                names = [a.name for a in node.names]
                private = [n for n in names if n.startswith("_") and not n.startswith("__")]
                if private:
                    found.append(f"{path.relative_to(ROOT)}: from {node.module} import {', '.join(private)}")
    assert found == []


MAX_MODULE_LINES = 500  # docs/architecture.md, "Folder layout": a module holds one concern


def test_no_module_is_over_500_lines() -> None:
    long = {
        str(path.relative_to(ROOT)): n
        for path in sorted((ROOT / "app").rglob("*.py"))
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}

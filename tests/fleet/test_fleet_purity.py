"""Every fleet module but the declared I/O edges is pure: no database, web, HTTP, SSH, socket or
process library, no clock, no files (docs/explain.md's explain and build are pure functions; issue 16).

The modules are discovered (every ``*.py`` under app/fleet, packages included), so a new module is held
to the rule without being listed; the edges are declared once, in ``app.fleet.IO_EDGES``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from app.fleet import IO_EDGES

ROOT = Path(__file__).resolve().parents[2]
FLEET = ROOT / "app" / "fleet"

FORBIDDEN_MODULES = (
    "sqlalchemy",
    "asyncpg",
    "psycopg",
    "fastapi",
    "starlette",
    "httpx",
    "requests",
    "urllib.request",
    "asyncssh",
    "paramiko",
    "socket",
    "ssl",
    "subprocess",
    "asyncio",
    "time",
    "os",
    "shutil",
    "tempfile",
    "random",
    "secrets",
    "app.db",
    "app.api",
    "app.capacity",
    "app.settings",
    *IO_EDGES,
)
"""Imports a pure fleet module may not make (a module or anything below it)."""

CLOCK_CALLS = {("datetime", "now"), ("datetime", "utcnow"), ("datetime", "today"), ("date", "today")}
FILE_CALLS = {"read_text", "write_text", "read_bytes", "write_bytes", "open", "exists", "samefile"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


PURE = sorted((path for path in FLEET.rglob("*.py") if module_name(path) not in IO_EDGES), key=module_name)


def impurities(source: str) -> list[str]:
    """What in ``source`` a pure module may not do: forbidden imports (at any depth, also inside
    functions), clock calls (``datetime.now()``...), and file access (``open(...)``, ``.read_text()``)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        bad_names = [
            name for name in names if any(name == b or name.startswith(b + ".") for b in FORBIDDEN_MODULES)
        ]
        found += [f"import {name}" for name in bad_names[:1]]  # the module itself, else the imported name
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute):
                owner = (
                    func.value.attr
                    if isinstance(func.value, ast.Attribute)
                    else getattr(func.value, "id", "")
                )
                if (owner, func.attr) in CLOCK_CALLS:
                    found.append(f"clock {owner}.{func.attr}()")
                elif func.attr in FILE_CALLS:
                    found.append(f"file .{func.attr}()")
            elif isinstance(func, ast.Name) and func.id == "open":
                found.append("file open()")
    return sorted(set(found))


def test_the_edges_exist_and_everything_else_is_checked() -> None:
    names = {module_name(path) for path in FLEET.rglob("*.py")}
    assert set(IO_EDGES) <= names
    checked = {module_name(path) for path in PURE}
    assert checked == names - set(IO_EDGES)
    # the modules the hand-made list used to miss are checked now
    assert {
        "app.fleet.explain",
        "app.fleet.documents",
        "app.fleet.estimate",
        "app.fleet.requirements.os",
    } <= checked


@pytest.mark.parametrize("path", PURE, ids=module_name)
def test_pure_module(path: Path) -> None:
    assert impurities(path.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ("import sqlalchemy as sa", ["import sqlalchemy"]),
        ("from sqlalchemy.ext.asyncio import AsyncConnection", ["import sqlalchemy.ext.asyncio"]),
        ("def f():\n    import asyncssh", ["import asyncssh"]),
        ("import httpx", ["import httpx"]),
        ("import socket", ["import socket"]),
        ("import time", ["import time"]),
        ("from app.fleet import ssh", ["import app.fleet.ssh"]),
        ("from app.fleet.collect import build_from_hosts", ["import app.fleet.collect"]),
        ("from app.db.tables import x", ["import app.db.tables"]),
        ("from datetime import datetime\nx = datetime.now()", ["clock datetime.now()"]),
        ("import datetime\nx = datetime.datetime.now(datetime.UTC)", ["clock datetime.now()"]),
        ("x = open('f').read()", ["file open()"]),
        ("from pathlib import Path\nx = Path('f').read_text()", ["file .read_text()"]),
        ("from datetime import datetime, timedelta\nfrom app.fleet.documents import load_fleet", []),
        ("from app.fleet.requirements import os", []),
    ],
)
def test_the_check_can_fail(source: str, found: list[str]) -> None:
    assert impurities(source) == found

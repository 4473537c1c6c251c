"""The pure fleet modules import no database, web, HTTP or SSH library (only ssh/collect do I/O)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

FLEET = Path(__file__).resolve().parents[2] / "app" / "fleet"
PURE = ["slurm.py", "pbs.py", "capacity.py", "history.py", "runtimes.py", "build.py", "compare.py"]
FORBIDDEN = (
    "sqlalchemy",
    "fastapi",
    "asyncpg",
    "httpx",
    "asyncssh",
    "app.db",
    "app.api",
    "app.capacity",
    "app.fleet.ssh",
)


@pytest.mark.parametrize("module", PURE)
def test_pure_module_imports(module: str) -> None:
    tree = ast.parse((FLEET / module).read_text())
    imported: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.append(node.module)
    bad = [name for name in imported if any(name == f or name.startswith(f + ".") for f in FORBIDDEN)]
    assert bad == []

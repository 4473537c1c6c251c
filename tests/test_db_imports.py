"""``app/db`` is storage: it imports no domain module (issue 16: "db imports no domain module").

Every module of app/db may import from ``app`` only ``app.db`` itself and the shared leaves
``app.errors``, ``app.settings``, ``app.ids`` (the audit row's id) and ``app.database_url`` (the forms of
a ``DATABASE_URL``); a domain rule it needs is passed in as data by its caller.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

DB = Path(__file__).resolve().parents[1] / "app" / "db"
# ids: a leaf (ULIDs); database_url: a leaf (URL strings); neither holds a domain rule
ALLOWED = ("app.db", "app.errors", "app.settings", "app.ids", "app.database_url")


def app_imports(path: Path) -> list[str]:
    """Every ``app.*`` module ``path`` imports, at any depth (function-level imports too)."""
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return [name for name in names if name == "app" or name.startswith("app.")]


@pytest.mark.parametrize("module", sorted(DB.glob("*.py")), ids=lambda p: p.name)
def test_db_imports_no_domain_module(module: Path) -> None:
    bad = [
        name
        for name in app_imports(module)
        if not any(name == a or name.startswith(a + ".") for a in ALLOWED)
    ]
    assert bad == []


def test_the_check_sees_a_domain_import(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("from app.db.tables import x\ndef f():\n    from app.fleet.history import JobRecord\n")
    assert app_imports(sample) == ["app.db.tables", "app.fleet.history"]

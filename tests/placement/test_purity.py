"""The pure half imports no I/O module (docs/architecture.md; issue 3, done-when 3)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

PLACEMENT = Path(__file__).resolve().parents[2] / "app" / "placement"
FORBIDDEN = ("sqlalchemy", "fastapi", "asyncpg", "app.db", "app.api", "app.capacity", "httpx", "asyncssh")
FILES = {
    "app." + ".".join(p.relative_to(PLACEMENT.parent).with_suffix("").parts).removesuffix(".__init__"): p
    for p in PLACEMENT.rglob("*.py")
}
MODULES = sorted(FILES)


def test_every_placement_module_is_listed() -> None:
    # The list is derived from the files; check the derivation against Python's own import: each name
    # imports the file it was derived from, and every app.placement module that importing them loads
    # (the whole pure half) is on the list, so none escapes the checks below.
    code = (
        "import importlib, json, sys\n"
        f"files = {{m: importlib.import_module(m).__file__ for m in {MODULES!r}}}\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('app.placement'))\n"
        "print(json.dumps([files, loaded]))\n"
    )
    root = str(PLACEMENT.parents[1])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, check=True)
    files, loaded = json.loads(out.stdout)
    assert {m: Path(f).resolve() for m, f in files.items()} == {m: p.resolve() for m, p in FILES.items()}
    assert set(loaded) <= set(MODULES), sorted(set(loaded) - set(MODULES))
    assert {"app.placement", "app.placement.pipeline", "app.placement.filters.fits"} <= set(MODULES)


@pytest.mark.parametrize("forbidden", FORBIDDEN)
def test_importing_placement_loads_no_io_module(forbidden: str) -> None:
    # A fresh interpreter: importing every module of app/placement must not load the forbidden one.
    code = (
        "import sys\n"
        f"for m in {MODULES!r}:\n"
        "    __import__(m)\n"
        f"bad = [m for m in sys.modules if m == {forbidden!r} or m.startswith({forbidden!r} + '.')]\n"
        "print(','.join(bad))\n"
    )
    root = str(PLACEMENT.parents[1])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, check=True)
    assert out.stdout.strip() == ""


@pytest.mark.parametrize("module", MODULES)
def test_no_io_import_statement(module: str) -> None:
    for line in FILES[module].read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith(("import ", "from ")):
            target = stripped.split()[1]
            assert not any(target == f or target.startswith(f + ".") for f in FORBIDDEN), line

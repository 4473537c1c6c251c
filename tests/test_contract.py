"""The contract cannot drift: OpenAPI, Alembic, compose.yaml, Dockerfile, README, .ci/run."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def test_openapi_document_is_current() -> None:
    from app.openapi import render_openapi

    checked_in = (ROOT / "openapi" / "openapi.json").read_text()
    assert checked_in == render_openapi(), "openapi/openapi.json is stale: run `better-compute openapi`"


def test_openapi_has_fixed_paths_and_operation_ids() -> None:
    doc = json.loads((ROOT / "openapi" / "openapi.json").read_text())
    for path in (
        "/v1/api-keys",
        "/v1/pools",
        "/v1/pools/{pool_id}/nodes/import",
        "/v1/capacity/preview",
        "/v1/reservations",
        "/v1/reservations/{reservation_id}/release",
        "/v1/tenants/{tenant_id}/quotas/{pool_id}",
        "/v1/placement/explain",
    ):
        assert path in doc["paths"], path
    ops = [op["operationId"] for item in doc["paths"].values() for op in item.values()]
    assert len(ops) == len(set(ops))


def test_alembic_check_is_clean(database_url: str) -> None:
    from alembic import command

    from app.db.engine import alembic_config

    command.check(alembic_config(database_url))


def test_compose_runs_postgres_with_healthcheck_and_service_after_it() -> None:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    services = compose["services"]
    pg = services["postgres"]
    assert pg["image"].startswith("postgres:")
    assert "pg_isready" in " ".join(pg["healthcheck"]["test"])
    app = services["better-compute"]
    assert app["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert app["environment"]["DATABASE_URL"].startswith("postgresql://")
    command = " ".join(app["command"])
    assert command.index("better-compute migrate") < command.index("better-compute serve")


def test_dockerfile_installs_like_the_readme_and_migrates_before_serving() -> None:
    text = (ROOT / "Dockerfile").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "pip install -e ." in text and "pip install -e ." in readme
    cmd = next(line for line in text.splitlines() if line.startswith("CMD"))
    assert cmd.index("better-compute migrate") < cmd.index("better-compute serve")
    for path in ("app", "alembic", "alembic.ini", "pyproject.toml"):
        assert path in text


def test_readme_opens_with_the_two_commands_and_ci_runs_the_second() -> None:
    lines = [
        ln.strip() for ln in (ROOT / "README.md").read_text().splitlines() if ln.strip().startswith("pip ")
    ]
    assert lines[0] == "pip install -e . && better-compute serve --demo"
    assert lines[1] == "pip install -e '.[test]' && pytest"
    assert "pip install -q -e '.[test]' && pytest" in (ROOT / ".ci" / "run").read_text()


def test_cli_help_lists_the_commands() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "app.cli", "--help"], capture_output=True, text=True, cwd=ROOT, check=True
    ).stdout
    # the command column of the help table, as words: "serve" must be a command of its own, not found
    # inside "reserve"
    listed = set(re.findall(r"^\W*([a-z][a-z-]*)\s{2,}\S", out, re.M))
    for command in ("serve", "migrate", "reserve", "preview", "release", "placement", "openapi"):
        assert command in listed, (command, sorted(listed))

"""Fuzz the running service from its own OpenAPI document with schemathesis: no input may answer a 5xx,
every status code is documented, every body matches the schema declared for its status (and content
type), and unsupported methods answer 405 (docs/architecture.md names schemathesis; issue 10, "Done when" 3).
Path and query parameters also take NUL text (tests/api/fuzz_hooks.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import ADMIN_KEY
from tests.factories import gpu_node, reservation
from tests.servers import REPO, Server, running_server

pytestmark = pytest.mark.slow  # a long module: it starts early in a parallel run (tests/conftest.py)


@pytest.fixture
def server(database_url: str, clean_db: AsyncEngine, tmp_path: Path) -> Iterator[Server]:
    with running_server(database_url, tmp_path) as started:
        yield started


def test_schemathesis_finds_no_server_error(server: Server, tmp_path: Path) -> None:
    """Every answer's status is declared and its body matches the declared schema. Path parameters are
    pinned to real ids, so reads and writes of existing things answer 2xx and are checked too."""
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    pool = httpx.post(f"{server.url}/v1/pools", json={"name": "fuzz"}, headers=admin).json()["id"]
    node = httpx.post(f"{server.url}/v1/pools/{pool}/nodes", json=gpu_node("f1", 4), headers=admin).json()
    held = httpx.post(f"{server.url}/v1/reservations", json=reservation(pool, 1, key="fuzz"), headers=admin)
    assert held.status_code == 201, held.text
    pinned = {
        "pool_id": pool,
        "node_id": node["id"],
        "reservation_id": held.json()["id"],
        "tenant_id": "acme",
    }
    config = tmp_path / "schemathesis.toml"
    config.write_text("[parameters]\n" + "".join(f'"path.{k}" = "{v}"\n' for k, v in pinned.items()))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "schemathesis.cli",
            "--config-file",
            str(config),
            "run",
            f"{server.url}/openapi.json",
            "-H",
            f"Authorization: Bearer {ADMIN_KEY}",
            "--checks",
            "not_a_server_error,status_code_conformance,response_schema_conformance,"
            "content_type_conformance,unsupported_method",
            "--max-examples",
            "25",
            "--request-timeout",
            "30",
            "--seed",
            "20261129",
            "--phases",
            "coverage,fuzzing",
            "--generation-allow-x00",
            "true",
        ],
        # path and query parameters also take NUL text (tests/api/fuzz_hooks.py)
        env={**os.environ, "SCHEMATHESIS_HOOKS": "tests.api.fuzz_hooks", "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,  # its cache stays out of the checkout
    )
    assert result.returncode == 0, result.stdout[-6000:] + (server.output()[-3000:])
    # the pinned ids reached the routes: the coverage phase's valid release released the reservation
    released = httpx.get(f"{server.url}/v1/reservations/{pinned['reservation_id']}", headers=admin).json()
    assert released["status"] == "released"

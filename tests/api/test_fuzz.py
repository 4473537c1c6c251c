"""Fuzz the running service from its own OpenAPI document with schemathesis: no input may answer a 5xx,
every status code is documented, and unsupported methods answer 405 (DESIGN.md names schemathesis).
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
from tests.factories import gpu_node
from tests.servers import REPO, Server, running_server


@pytest.fixture
def server(database_url: str, clean_db: AsyncEngine, tmp_path: Path) -> Iterator[Server]:
    with running_server(database_url, tmp_path) as started:
        yield started


def test_schemathesis_finds_no_server_error(server: Server, tmp_path: Path) -> None:
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    pool = httpx.post(f"{server.url}/v1/pools", json={"name": "fuzz"}, headers=admin).json()["id"]
    httpx.post(f"{server.url}/v1/pools/{pool}/nodes", json=gpu_node("f1", 4), headers=admin)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "schemathesis.cli",
            "run",
            f"{server.url}/openapi.json",
            "-H",
            f"Authorization: Bearer {ADMIN_KEY}",
            "--checks",
            "not_a_server_error,status_code_conformance,unsupported_method",
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

"""The CLI's reserve / preview / release are clients of a running service (DESIGN.md, "CLI")."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


def _cli(server: Server, *args: str, key: str | None = ADMIN_KEY) -> subprocess.CompletedProcess[str]:
    env = {"BC_URL": server.url, "PATH": "/usr/bin:/bin", "HOME": "/tmp"}
    if key:
        env["BC_API_KEY"] = key
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=60,
    )


def test_reserve_preview_release_through_the_cli(server: Server) -> None:
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    pool = httpx.post(f"{server.url}/v1/pools", json={"name": "cli"}, headers=admin).json()["id"]
    node = httpx.post(f"{server.url}/v1/pools/{pool}/nodes", json=gpu_node("c1", 4), headers=admin).json()

    preview = _cli(server, "preview", "--tenant", "acme", "--pool", pool, "--gpus", "2", "--nvlink", "--json")
    assert preview.returncode == 0, preview.stderr
    answer: dict[str, Any] = json.loads(preview.stdout)
    assert answer["fits"] and answer["candidates"][0]["nodeId"] == node["id"]

    reserve = _cli(
        server,
        "reserve",
        "--tenant",
        "acme",
        "--pool",
        pool,
        "--gpus",
        "4",
        "--cpu",
        "8",
        "--for",
        "2h",
        "--selector",
        "vramGiB >= 80",
        "--json",
    )
    assert reserve.returncode == 0, reserve.stderr
    placed = json.loads(reserve.stdout)
    assert placed["status"] == "placed" and len(placed["allocations"][0]["atoms"]) == 4

    full = _cli(server, "preview", "--tenant", "acme", "--pool", pool, "--gpus", "1")
    assert full.returncode == 3 and "does not fit" in full.stdout and "0 of 4 gpu free" in full.stdout

    release = _cli(server, "release", placed["id"])
    assert release.returncode == 0 and "released" in release.stdout

    bad = _cli(
        server, "reserve", "--tenant", "acme", "--pool", pool, "--gpus", "1", "--selector", "vramGiB >> 3"
    )
    assert bad.returncode == 1 and "INVALID_INPUT" in bad.stderr
    nokey = _cli(server, "preview", "--tenant", "acme", "--pool", pool, "--gpus", "1", key=None)
    assert nokey.returncode == 2 and "API key" in nokey.stderr


def test_serve_on_the_embedded_database_stops_it_on_sigterm(tmp_path: Path) -> None:
    """`better-compute serve` without DATABASE_URL starts an embedded PostgreSQL in the user's data
    directory, migrates it, serves, and stops it again when the service is stopped."""
    import os
    import signal

    from tests.servers import free_port

    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update(HOME=str(tmp_path), XDG_DATA_HOME=str(tmp_path / "data"), BC_BOOTSTRAP_ADMIN_KEY=ADMIN_KEY)
    port = free_port()
    log = (tmp_path / "serve.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve", "--port", str(port)],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    pgdata = tmp_path / "data" / "better-compute" / "pgdata"
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        else:
            raise AssertionError((tmp_path / "serve.log").read_text())
        assert (pgdata / "postmaster.pid").exists()
        pools = httpx.get(
            f"http://127.0.0.1:{port}/v1/pools", headers={"Authorization": f"Bearer {ADMIN_KEY}"}
        )
        assert pools.status_code == 200 and pools.json() == {"items": [], "nextCursor": None}
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
    deadline = time.monotonic() + 15
    while (pgdata / "postmaster.pid").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not (pgdata / "postmaster.pid").exists(), "the embedded PostgreSQL outlived the service"

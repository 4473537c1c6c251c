"""`better-compute serve` on the embedded database (the client commands: tests/test_cli_client.py)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.conftest import ADMIN_KEY
from tests.servers import REPO


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
        assert pools.status_code == 200 and pools.json() == {"items": []}
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
    deadline = time.monotonic() + 15
    while (pgdata / "postmaster.pid").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not (pgdata / "postmaster.pid").exists(), "the embedded PostgreSQL outlived the service"

"""Real ``better-compute serve`` subprocesses on free 127.0.0.1 ports, for tests that need a running
service (the stress test, the CLI clients)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.conftest import ADMIN_KEY, POOL_SIZE, UNLIMITED_RATES

REPO = Path(__file__).resolve().parents[1]
# a service outlives a killed test run (it has a session of its own) and would hold the connections its
# pool opened; started through util-linux's setpriv, it gets SIGTERM when the worker that started it dies
DIES_WITH_PARENT = ["setpriv", "--pdeathsig", "TERM"] if shutil.which("setpriv") else []


@dataclass
class Server:
    """One ``better-compute serve`` subprocess on 127.0.0.1."""

    port: int
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def url(self) -> str:
        """The base URL of the server."""
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        """The server's combined stdout and stderr so far (for failure messages)."""
        try:
            return self.log.read_text(errors="replace")[-20_000:]
        except OSError:
            return ""


def free_port() -> int:
    """A port that was free on 127.0.0.1 a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn_server(
    database_url: str,
    log: Path,
    extra_env: dict[str, str] | None = None,
    port: int | None = None,
    args: Sequence[str] = (),
) -> Server:
    """Start ``python -m app.cli serve`` on ``database_url`` with the test admin key (rate limits off and
    the tests' connection pool, :data:`tests.conftest.POOL_SIZE`, unless ``extra_env`` sets them), on
    ``port`` or a free one; ``args`` adds options (``--workers``)."""
    env = dict(os.environ)
    env.update({"DATABASE_URL": database_url, "BC_BOOTSTRAP_ADMIN_KEY": ADMIN_KEY, "PYTHONUNBUFFERED": "1"})
    env["BC_DB_POOL_SIZE"] = str(POOL_SIZE)
    env.update(UNLIMITED_RATES)
    env.update(extra_env or {})
    port = port or free_port()
    log.parent.mkdir(parents=True, exist_ok=True)
    handle = log.open("wb")
    serve = [sys.executable, "-m", "app.cli", "serve", "--host", "127.0.0.1", "--port", str(port), *args]
    process = subprocess.Popen(
        [*DIES_WITH_PARENT, *serve],
        cwd=REPO,
        env=env,
        stdout=handle,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    handle.close()
    return Server(port, process, log)


def wait_healthy(server: Server, deadline: float) -> bool:
    """Poll ``/healthz`` until 200; False when the process died (e.g. the port was taken meanwhile)."""
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            return False
        try:
            if httpx.get(server.url + "/healthz", timeout=2).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"server on port {server.port} not healthy in time:\n{server.output()}")


def stop_server(server: Server) -> None:
    """Terminate the server (kill it after 10 s)."""
    if server.process.poll() is None:
        server.process.terminate()
        try:
            server.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait(timeout=10)


@contextmanager
def running_server(
    database_url: str,
    log_dir: Path,
    attempts: int = 3,
    extra_env: dict[str, str] | None = None,
    args: Sequence[str] = (),
) -> Iterator[Server]:
    """One service process on the test database, healthy, stopped on exit (a port taken meanwhile is
    retried on another); ``extra_env`` adds settings (``BC_...``) for it, ``args`` options of ``serve``."""
    for attempt in range(attempts):
        started = spawn_server(database_url, log_dir / f"server-{attempt}.log", extra_env, args=args)
        try:
            if wait_healthy(started, time.monotonic() + 60):
                yield started
                return
        finally:
            stop_server(started)
    raise AssertionError("the service did not start")


@contextmanager
def running_servers(
    database_url: str,
    log_dir: Path,
    count: int,
    extra_env: dict[str, str] | None = None,
    startup_seconds: float = 60.0,
) -> Iterator[list[Server]]:
    """``count`` healthy service processes on the test database, stopped on exit; one whose port was
    taken meanwhile is started again on another (up to 3 rounds)."""
    spawned: list[Server] = []
    started: list[Server] = []

    def spawn(log: Path) -> Server:
        spawned.append(spawn_server(database_url, log, extra_env))
        return spawned[-1]

    try:
        waiting = [spawn(log_dir / f"server-{i}.log") for i in range(count)]
        deadline = time.monotonic() + startup_seconds
        for attempt in range(3):
            retry = [s for s in waiting if not wait_healthy(s, deadline)]
            started += [s for s in waiting if s not in retry]
            if not retry:
                break
            if attempt == 2:
                raise AssertionError("a server did not start:\n" + "\n".join(s.output() for s in retry))
            waiting = [spawn(s.log.with_suffix(f".retry{attempt}.log")) for s in retry]
        yield started
    finally:
        for server in spawned:  # all at once: each shuts down while the others do
            if server.process.poll() is None:
                server.process.terminate()
        for server in spawned:
            stop_server(server)


@asynccontextmanager
async def admin_clients(
    servers: list[Server], request_timeout: float = 60.0, connections: int = 100
) -> AsyncIterator[list[httpx.AsyncClient]]:
    """One ``httpx.AsyncClient`` with the test admin key per server, closed on exit."""
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    made = [
        httpx.AsyncClient(
            base_url=s.url,
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
            timeout=request_timeout,
            limits=limits,
        )
        for s in servers
    ]
    try:
        yield made
    finally:
        for c in made:
            await c.aclose()

"""A PostgreSQL outage under load (issue 9, done-when 4), on a PostgreSQL instance of this test's own:
two real service processes answer 503 ``UNAVAILABLE`` with ``Retry-After`` while it is down, on the same
keep-alive connection; after it is back (and after a restart while idle) the first request of each
process succeeds; the books hold no half-written reservation."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.db.engine import create_engine, is_outage, migrate
from tests.capacity.invariants import violations as _violations
from tests.conftest import ADMIN_KEY
from tests.factories import gpu_node, reservation
from tests.pg_instance import PgInstance, create_instance
from tests.servers import Server, running_server

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


@pytest.fixture
def own_postgres() -> Any:
    instance = create_instance()
    if instance is None:
        pytest.skip("no PostgreSQL binaries (initdb, pg_ctl) on this machine")
    try:
        yield instance
    finally:
        instance.destroy()


def _local_port(response: httpx.Response) -> int:
    """The client-side port of the connection that carried ``response`` (same port: same connection)."""
    return response.extensions["network_stream"].get_extra_info("client_addr")[1]


def _assert_unavailable(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "UNAVAILABLE"
    assert int(response.headers["Retry-After"]) >= 1
    assert response.headers.get("connection", "").lower() != "close"


def _load(server: Server, key: str, pool: str, stop: threading.Event, seen: Counter[Any]) -> None:
    """Reserve and release one GPU in a loop on one keep-alive connection; count what comes back."""
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as client:
        while not stop.is_set():
            try:
                r = client.post("/v1/reservations", json=reservation(pool, 1))
                seen[r.status_code] += 1
                if r.status_code == 201:
                    seen[client.post(f"/v1/reservations/{r.json()['id']}/release").status_code] += 1
            except httpx.HTTPError as exc:  # a dropped connection would show up here
                seen[type(exc).__name__] += 1
            time.sleep(0.01)


def test_postgres_restart_answers_503_then_recovers(own_postgres: PgInstance, tmp_path: Path) -> None:
    migrate(own_postgres.url)
    with ExitStack() as stack:
        servers = []
        for i in (0, 1):
            (tmp_path / f"s{i}").mkdir()
            servers.append(stack.enter_context(running_server(own_postgres.url, tmp_path / f"s{i}")))
        base = servers[0].url
        pool = httpx.post(f"{base}/v1/pools", json={"name": "outage"}, headers=ADMIN).json()["id"]
        assert (
            httpx.post(f"{base}/v1/pools/{pool}/nodes", json=gpu_node("o1", 8), headers=ADMIN).status_code
            == 201
        )
        assert httpx.put(
            f"{base}/v1/tenants/acme/quotas/{pool}", json={"limits": {"gpu": 8}}, headers=ADMIN
        ).is_success
        grants = [{"action": "*", "resource": "tenant:acme"}, {"action": "*", "resource": f"pool:{pool}"}]
        created = httpx.post(
            f"{base}/v1/api-keys",
            json={"principal": "ci", "tenantId": "acme", "grants": grants},
            headers=ADMIN,
        )
        key = created.json()["key"]  # resolved in the database by the request guard, unlike the bootstrap key

        stop = threading.Event()
        seen: Counter[Any] = Counter()
        workers = [
            threading.Thread(target=_load, args=(s, key, pool, stop, seen)) for s in servers for _ in (0, 1)
        ]
        for w in workers:
            w.start()
        time.sleep(1.0)
        own_postgres.stop()
        try:
            for s in servers:
                for headers in ({"Authorization": f"Bearer {key}"}, ADMIN):
                    with httpx.Client(base_url=s.url, headers=headers, timeout=30) as client:
                        first = client.get(f"/v1/pools/{pool}")
                        _assert_unavailable(first)
                        second = client.post("/v1/reservations", json=reservation(pool, 1))
                        _assert_unavailable(second)
                        assert _local_port(first) == _local_port(second)  # the connection stayed open
                assert httpx.get(f"{s.url}/readyz").status_code == 503
            time.sleep(1.0)
        finally:
            own_postgres.start()
        before = seen[201]
        deadline = time.monotonic() + 20
        while seen[201] < before + 8 and time.monotonic() < deadline:
            time.sleep(0.1)
        stop.set()
        for w in workers:
            w.join()
        assert seen[503] > 0 and seen[201] >= before + 8, seen
        assert set(seen) <= {200, 201, 503}, seen  # no 500, no dropped connection

        # restarted while idle: pooled connections are stale; the first request of each process succeeds
        for s in servers:
            assert (
                httpx.get(f"{s.url}/v1/pools/{pool}", headers={"Authorization": f"Bearer {key}"}).status_code
                == 200
            )
        own_postgres.stop()
        own_postgres.start()
        for s in servers:
            assert (
                httpx.get(f"{s.url}/v1/pools/{pool}", headers={"Authorization": f"Bearer {key}"}).status_code
                == 200
            )
        for s in servers:
            own_postgres.stop()
            own_postgres.start()
            r = httpx.post(
                f"{s.url}/v1/reservations",
                json=reservation(pool, 1),
                headers={"Authorization": f"Bearer {key}"},
            )
            assert r.status_code == 201, r.text

    async def books() -> dict[str, Any]:
        engine = create_engine(own_postgres.url)
        try:
            return await _violations(engine)
        finally:
            await engine.dispose()

    assert asyncio.run(books()) == {}


@pytest.mark.parametrize(
    ("error", "outage"),
    [
        (ConnectionRefusedError(111, "Connection refused"), True),
        (OSError("Multiple exceptions: [Errno 111] Connect call failed ('127.0.0.1', 5999)"), True),
        (TimeoutError(), True),
        (FileNotFoundError(2, "No such file"), False),  # a file a route reads is no database outage
        (ValueError("bad"), False),
    ],
)
def test_which_errors_are_an_outage(error: BaseException, outage: bool) -> None:
    assert is_outage(error) is outage
    wrapped = RuntimeError("while serving")
    wrapped.__cause__ = error
    assert is_outage(wrapped) is outage


async def test_no_free_connection_slot_is_an_outage(database_url: str) -> None:
    """``too many connections`` (SQLSTATE 53300) answers 503 like any outage, not 500: a real refusal,
    from a role whose connection limit is 0 (found by a fresh-user run while other suites held every
    slot of the server)."""
    import secrets

    import asyncpg
    from sqlalchemy.engine import make_url

    url = make_url(database_url).set(drivername="postgresql")
    role = f"bc_no_slots_{secrets.token_hex(4)}"
    admin = await asyncpg.connect(url.render_as_string(hide_password=False))
    try:
        await admin.execute(f'CREATE ROLE "{role}" LOGIN CONNECTION LIMIT 0')
        with pytest.raises(asyncpg.exceptions.TooManyConnectionsError) as refused:
            await asyncpg.connect(url.set(username=role, password=None).render_as_string(hide_password=False))
        assert is_outage(refused.value)
    finally:
        await admin.execute(f'DROP ROLE IF EXISTS "{role}"')
        await admin.close()

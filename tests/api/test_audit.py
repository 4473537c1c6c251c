"""The audit log (docs/operating.md, "Audit log"): one row per mutating request, written in the change's
transaction; ``GET /v1/audit`` for admins; the retention prune; ``better-compute audit``.

:func:`test_every_mutating_operation_is_recorded` reads ``openapi/openapi.json``: every POST, PUT, PATCH
and DELETE operation except the declared read-only ones is sent (with the request builder of the
authorization table, tests/api/test_authorization.py) by an admin, by no key and by tenant B's key, and
each request must leave exactly one row with its operation id, actor and status. A route added without a
row in the authorization table fails here too. The heartbeat it sends changes a device's health: one
that changes nothing writes no row (:func:`test_a_heartbeat_that_changes_nothing_writes_no_row`).
"""

from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine
from typer.testing import CliRunner

from app.api.audit_trail import MUTATING, READ_ONLY_OPERATIONS, audited_routes
from app.client.audit_commands import audit_view, since_time
from app.db.tables import audit_events, reservations
from app.iam import audit_log
from tests.agent_host import FIRST_UUID
from tests.api.test_agents import hello_body
from tests.api.test_authorization import ROOT, TABLE, build_world
from tests.conftest import ADMIN_KEY
from tests.factories import add_node, gpu_node, make_pool, reservation

_ids = itertools.count()


def mutating_operations() -> dict[tuple[str, str], str]:
    """``(METHOD, path template) -> operationId`` of the document's recorded operations."""
    document = json.loads((ROOT / "openapi" / "openapi.json").read_text())
    return {
        (method.upper(), path): op["operationId"]
        for path, item in document["paths"].items()
        for method, op in item.items()
        if method.upper() in MUTATING and op["operationId"] not in READ_ONLY_OPERATIONS
    }


async def rows_of(engine: AsyncEngine, request_id: str) -> list[Any]:
    async with engine.connect() as conn:
        query = sa.select(audit_events).where(audit_events.c.request_id == request_id)
        return list((await conn.execute(query)).all())


def test_the_read_only_operations_exist_and_take_a_body() -> None:
    """Every declared read-only operation is a POST of the document (a stale name would hide nothing)."""
    document = json.loads((ROOT / "openapi" / "openapi.json").read_text())
    posts = {
        op["operationId"] for item in document["paths"].values() for m, op in item.items() if m == "post"
    }
    assert READ_ONLY_OPERATIONS <= posts


async def test_the_middleware_records_exactly_the_documents_mutating_operations(app: Any) -> None:
    recorded = {(r.method, r.template): r.operation_id for r in audited_routes(list(app.routes))}
    assert recorded == mutating_operations()


async def test_every_mutating_operation_is_recorded(
    app: Any, admin_client: httpx.AsyncClient, client_for: Any
) -> None:
    world = await build_world(admin_client)
    engine = app.state.services.engine
    operations = mutating_operations()
    missing = sorted(set(operations) - TABLE.keys())
    assert not missing, f"no request builder (authorization table row) for {missing}"
    tenant_b = client_for(world.keys["tenant_b"])
    anonymous = client_for(None)
    tenant_b_key = (await tenant_b.get("/v1/reservations")).status_code  # authenticates: fine either way
    assert tenant_b_key in (200, 403)
    wrong = []
    try:
        for (method, path), operation_id in sorted(operations.items()):
            build = TABLE[(method, path)][0]
            for who, client in (("admin", admin_client), ("anonymous", anonymous), ("tenant_b", tenant_b)):
                url, body = await build(world)
                request_id = f"audit-{next(_ids)}"
                r = await client.request(method, url, json=body, headers={"X-Request-Id": request_id})
                rows = await rows_of(engine, request_id)
                got = [(x.operation_id, x.method, x.route, x.role, x.status) for x in rows]
                role = {"admin": "admin", "anonymous": "anonymous", "tenant_b": "tenant"}[who]
                if got != [(operation_id, method, path, role, r.status_code)]:
                    wrong.append((method, path, who, r.status_code, got))
                    continue
                row = rows[0]
                if who == "admin":
                    assert (row.key_id, row.tenant_id) == ("bootstrap", None), (method, path)
                if who == "anonymous":
                    assert (row.key_id, row.principal, r.status_code) == (None, None, 401), (method, path)
                if who == "tenant_b":
                    assert row.key_id and row.tenant_id == "tenant-b", (method, path)
                assert set(row.path_params.values()) <= set(row.resources), (method, path)
                if r.status_code == 201 and isinstance(r.json(), dict) and "id" in r.json():
                    assert row.created_id == r.json()["id"], (method, path)
    finally:
        await tenant_b.aclose()
        await anonymous.aclose()
    assert not wrong, "requests without exactly one right audit row:\n" + "\n".join(map(str, wrong))


async def test_a_rolled_back_create_leaves_its_failing_status_never_a_success(
    app: Any, admin_client: httpx.AsyncClient
) -> None:
    """A reservation the pool could never hold is refused after its row was inserted (422 UNSATISFIABLE
    rolls it back); a second pool of the same name is a 409: each leaves one row with its status."""
    engine = app.state.services.engine
    pool = await make_pool(admin_client, "rolled-back")
    await add_node(admin_client, pool, gpu_node("n1", 8))
    r = await admin_client.post(
        "/v1/reservations", json=reservation(pool, 100), headers={"X-Request-Id": "too-big"}
    )
    assert r.status_code == 422 and r.json()["error"]["code"] == "UNSATISFIABLE", r.text
    rows = await rows_of(engine, "too-big")
    assert [(x.operation_id, x.status, x.created_id) for x in rows] == [("createReservation", 422, None)]
    async with engine.connect() as conn:
        assert (await conn.execute(sa.select(sa.func.count()).select_from(reservations))).scalar() == 0
    r = await admin_client.post("/v1/pools", json={"name": "rolled-back"}, headers={"X-Request-Id": "dup"})
    assert r.status_code == 409, r.text
    assert [(x.operation_id, x.status) for x in await rows_of(engine, "dup")] == [("createPool", 409)]
    # the placed one: written in its transaction with the new id, no second statement needed
    r = await admin_client.post("/v1/reservations", json=reservation(pool, 1), headers={"X-Request-Id": "ok"})
    assert r.status_code == 201, r.text
    row = (await rows_of(engine, "ok"))[0]
    assert (row.status, row.created_id, row.resources) == (201, r.json()["id"], [r.json()["id"]])
    # an idempotent retry answers 200: the row written at its COMMIT says so
    body = reservation(pool, 1, key="same")
    assert (await admin_client.post("/v1/reservations", json=body)).status_code == 201
    r = await admin_client.post("/v1/reservations", json=body, headers={"X-Request-Id": "retry"})
    assert r.status_code == 200, r.text
    assert [x.status for x in await rows_of(engine, "retry")] == [200]


async def test_a_heartbeat_that_changes_nothing_writes_no_row(
    app: Any, admin_client: httpx.AsyncClient, client_for: Any
) -> None:
    """A heartbeat that only records its time is no audited change (about 1,000 a second at 10,000
    nodes); one that changes a device's health writes its one row; a refused one is recorded."""
    engine = app.state.services.engine
    pool = await make_pool(admin_client, "beats")
    hello = await admin_client.post("/v1/nodes/hello", json=hello_body(pool))
    assert hello.status_code == 200, hello.text
    node = hello.json()["nodeId"]
    url = f"/v1/nodes/{node}/heartbeat"
    steps = (
        ("quiet", {"devices": [{"id": FIRST_UUID, "healthy": True}]}, False),
        ("down", {"devices": [{"id": FIRST_UUID, "healthy": False, "reason": "xid 79"}]}, True),
        ("still-down", {"devices": [{"id": FIRST_UUID, "healthy": False, "reason": "xid 79"}]}, False),
        ("not-ready", {"devices": [], "error": "nvidia-smi failed"}, True),
        ("still-not-ready", {"devices": [], "error": "nvidia-smi failed"}, False),
        ("ready-again", {"devices": []}, True),
        ("unknown-device", {"devices": [{"id": "GPU-nope", "healthy": True}]}, True),
    )
    for request_id, body, recorded in steps:
        r = await admin_client.post(url, json=body, headers={"X-Request-Id": request_id})
        assert r.status_code in (200, 422), r.text
        rows = [(x.operation_id, x.status) for x in await rows_of(engine, request_id)]
        assert rows == ([("sendHeartbeat", r.status_code)] if recorded else []), (request_id, r.text)
        if r.status_code == 200:
            assert r.json()["changed"] is recorded, (request_id, r.text)
    async with client_for(None) as anonymous:
        r = await anonymous.post(url, json={"devices": []}, headers={"X-Request-Id": "no-key"})
    assert [(x.operation_id, x.status) for x in await rows_of(engine, "no-key")] == [("sendHeartbeat", 401)]


async def _events(client: httpx.AsyncClient, **params: Any) -> dict[str, Any]:
    r = await client.get("/v1/audit", params=params)
    assert r.status_code == 200, r.text
    return r.json()


async def test_the_audit_list_filters_pages_and_is_for_admins_only(
    app: Any, admin_client: httpx.AsyncClient, client_for: Any
) -> None:
    engine = app.state.services.engine
    pool = await make_pool(admin_client, "listed")
    node = (await add_node(admin_client, pool, gpu_node("n1", 8)))["id"]
    for _ in range(3):
        assert (await admin_client.post(f"/v1/nodes/{node}/cordon")).status_code == 200
    r = await admin_client.post(
        "/v1/api-keys",
        json={
            "principal": "ops-a",
            "tenantId": "acme",
            "grants": [{"action": "compute:reservations:create", "resource": "tenant:acme"}],
        },
    )
    tenant_key_id, tenant_key = r.json()["id"], r.json()["key"]
    async with client_for(tenant_key) as tenant:
        assert (await tenant.get("/v1/audit")).status_code == 403
        r = await tenant.post("/v1/reservations", json=reservation(pool, 1, tenant="other"))
        assert r.status_code == 403

    everything = await _events(admin_client, limit=1000)
    ops = [e["operationId"] for e in everything["items"]]
    # newest first: the tenant's refused create, the key, three cordons, the node, the pool
    assert ops == ["createReservation", "createApiKey", *["cordonNode"] * 3, "createNode", "createPool"]
    stamps = [(e["at"], e["id"]) for e in everything["items"]]
    assert stamps == sorted(stamps, reverse=True)

    by_actor = await _events(admin_client, actor=tenant_key_id)
    assert [(e["operationId"], e["status"], e["actor"]["tenantId"]) for e in by_actor["items"]] == [
        ("createReservation", 403, "acme")
    ]
    assert [e["operationId"] for e in (await _events(admin_client, actor="ops-a"))["items"]] == [
        "createReservation"
    ]
    by_node = await _events(admin_client, resource=node)
    assert [e["operationId"] for e in by_node["items"]] == ["cordonNode"] * 3 + ["createNode"]
    assert by_node["items"][0]["pathParams"] == {"node_id": node}
    by_pool = await _events(admin_client, resource=pool)
    assert [e["operationId"] for e in by_pool["items"]] == ["createNode", "createPool"]

    # paging: 2 + 2 + 2 + 1, nothing repeated or lost
    seen, cursor = [], None
    while True:
        page = await _events(admin_client, limit=2, **({"cursor": cursor} if cursor else {}))
        seen += [e["id"] for e in page["items"]]
        cursor = page["nextCursor"]
        if cursor is None:
            break
    assert seen == [e["id"] for e in everything["items"]]

    # from / to on the database clock: move the pool's row a day back
    async with engine.begin() as conn:
        await conn.execute(
            sa.update(audit_events)
            .where(audit_events.c.operation_id == "createPool")
            .values(at=sa.func.now() - timedelta(days=1))
        )
    hour_ago = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    recent = await _events(admin_client, **{"from": hour_ago})
    assert "createPool" not in [e["operationId"] for e in recent["items"]] and len(recent["items"]) == 6
    older = await _events(admin_client, to=hour_ago)
    assert [e["operationId"] for e in older["items"]] == ["createPool"]

    for bad in ({"from": "yesterday"}, {"to": "2026-01-01T00:00:00"}, {"cursor": "nope"}, {"limit": 0}):
        r = await admin_client.get("/v1/audit", params=bad)
        assert r.status_code == 422 and r.json()["error"]["code"] == "INVALID_INPUT", (bad, r.text)
    assert (await client_for(None).get("/v1/audit")).status_code == 401


async def test_the_prune_deletes_only_rows_older_than_the_retention(
    app: Any, admin_client: httpx.AsyncClient
) -> None:
    engine = app.state.services.engine
    await make_pool(admin_client, "kept")
    old = {
        "id": "aud_old",
        "at": datetime(2020, 1, 1, tzinfo=UTC),
        "role": "admin",
        "operation_id": "createPool",
        "method": "POST",
        "route": "/v1/pools",
        "path_params": {},
        "resources": [],
        "status": 201,
    }
    async with engine.begin() as conn:
        await conn.execute(sa.insert(audit_events).values(old))
    # a passed `now`: 2020-01-02 minus 2 days keeps the old row
    assert await audit_log.prune(engine, timedelta(days=2), now=datetime(2020, 1, 2, tzinfo=UTC)) == 0
    assert await audit_log.prune(engine, timedelta(days=90)) == 1  # the database clock
    assert await audit_log.prune(engine, timedelta(days=90)) == 0  # idempotent
    async with engine.connect() as conn:
        left = (await conn.execute(sa.select(audit_events.c.operation_id))).scalars().all()
    assert left == ["createPool"]


def test_the_cli_view_and_since() -> None:
    now = datetime(2026, 12, 10, 12, 0, tzinfo=UTC)
    assert since_time("1d", now) == now - timedelta(days=1)
    assert since_time("90m", now) == now - timedelta(minutes=90)
    assert since_time("3600", now) == now - timedelta(hours=1)
    event = {
        "id": "aud_1",
        "at": "2026-12-10T11:00:00+00:00",
        "requestId": "req_1",
        "actor": {"keyId": "key_1", "principal": "ops", "role": "admin", "tenantId": None},
        "operationId": "cordonNode",
        "method": "POST",
        "route": "/v1/nodes/{node_id}/cordon",
        "pathParams": {"node_id": "node_1"},
        "createdId": None,
        "resources": ["node_1"],
        "status": 200,
    }
    from rich.console import Console

    console = Console(width=200)
    with console.capture() as captured:
        console.print(audit_view([event], wide=True))
    text = captured.get()
    for part in ("2026-12-10T11:00:00Z", "ops", "cordonNode", "node_1", "200", "key_1", "req_1"):
        assert part in text


@pytest.mark.parametrize("since", ["yesterday", "0", "-1d"])
def test_the_cli_refuses_a_bad_since_before_sending(since: str) -> None:
    from app.cli import app as cli_app

    result = CliRunner().invoke(
        cli_app,
        ["audit", "--since", since],
        env={"BC_SERVER": "http://127.0.0.1:9", "BC_API_KEY": ADMIN_KEY},
    )
    assert result.exit_code == 2 and "--since" in result.output, result.output

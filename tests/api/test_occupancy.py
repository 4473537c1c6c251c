"""``GET /v1/pools/{poolId}/occupancy`` through HTTP on real PostgreSQL (docs/api.md, "Occupancy"): who
sees whose reservation ids, planned windows, scalar steps of overlapping holdings, unhealthy atoms and
cordoned nodes, and the window's bad input (422 at its field, nothing changed) and an unknown pool."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.capacity.config import CapacityConfig
from app.capacity.controllers.backfill import plan_pool
from app.capacity.planning.snapshot import PoolCache
from app.placement.options import SchedulerOptions
from tests.factories import add_node, gpu_node, make_pool, reservation

A, B = "tenant-a", "tenant-b"


def tenant_key_body(tenant: str, pool: str) -> dict[str, Any]:
    """A tenant key as tenants hold them: its reservations, and the pool's inventory read."""
    grants = [
        ("compute:reservations:*", f"tenant:{tenant}"),
        ("compute:reservations:*", f"pool:{pool}"),
        ("compute:inventory:read", f"pool:{pool}"),
    ]
    return {
        "principal": f"{tenant}-ui",
        "tenantId": tenant,
        "grants": [{"action": a, "resource": r} for a, r in grants],
    }


async def tenant_client(
    admin: httpx.AsyncClient, client_for: Any, tenant: str, pool: str
) -> httpx.AsyncClient:
    r = await admin.post("/v1/api-keys", json=tenant_key_body(tenant, pool))
    assert r.status_code == 201, r.text
    return client_for(r.json()["key"])


async def occupancy(client: httpx.AsyncClient, pool: str, **query: str) -> dict[str, Any]:
    r = await client.get(f"/v1/pools/{pool}/occupancy", params=query)
    assert r.status_code == 200, r.text
    return r.json()


def bookings_of(answer: dict[str, Any]) -> list[dict[str, Any]]:
    return [b for n in answer["nodes"] for a in n["atoms"] for b in a["bookings"]]


async def reserve(client: httpx.AsyncClient, body: dict[str, Any], status: str = "placed") -> dict[str, Any]:
    r = await client.post("/v1/reservations", json=body)
    assert r.status_code == 201, r.text
    assert r.json()["status"] == status, r.text
    return r.json()


async def test_admin_sees_every_booking_a_tenant_only_its_own_ids(
    admin_client: httpx.AsyncClient, client_for: Any
) -> None:
    pool = await make_pool(admin_client, "occ")
    n1 = (await add_node(admin_client, pool, gpu_node("n1", 4)))["id"]
    n2 = (await add_node(admin_client, pool, gpu_node("n2", 2)))["id"]
    mine = await reserve(admin_client, reservation(pool, 2, tenant=A, resources={"cpu": 4}))
    theirs = await reserve(admin_client, reservation(pool, 1, tenant=B, spot=True))

    seen = await occupancy(admin_client, pool)
    assert [n["nodeId"] for n in seen["nodes"]] == sorted([n1, n2])  # the node list's id order
    assert (seen["poolId"], seen["poolName"]) == (pool, "occ")
    start, end = datetime.fromisoformat(seen["from"]), datetime.fromisoformat(seen["to"])
    assert end - start == timedelta(hours=48) and start == datetime.fromisoformat(seen["now"])
    node1 = next(n for n in seen["nodes"] if n["nodeId"] == n1)
    assert [a["atomId"] for a in node1["atoms"]] == [f"n1-GPU{i}" for i in range(4)]  # device order
    assert {a["class"] for a in node1["atoms"]} == {"gpu"}
    assert node1["schedulable"] and node1["reasons"] == [] and node1["ready"] and not node1["heartbeatLost"]
    assert node1["lastHeartbeat"] is None
    assert [s["resource"] for s in node1["scalars"]] == ["cpu", "memory"]
    assert node1["scalars"][0]["capacity"] == 64

    by_reservation = {b["reservationId"]: b for b in bookings_of(seen)}
    assert set(by_reservation) == {mine["id"], theirs["id"]} and len(bookings_of(seen)) == 3
    assert by_reservation[mine["id"]]["tenantId"] == A and not by_reservation[mine["id"]]["spot"]
    assert by_reservation[theirs["id"]]["tenantId"] == B and by_reservation[theirs["id"]]["spot"]
    assert {(b["status"], b["planned"]) for b in bookings_of(seen)} == {("placed", False)}
    booked = datetime.fromisoformat(by_reservation[mine["id"]]["start"])
    assert datetime.fromisoformat(by_reservation[mine["id"]]["end"]) - booked == timedelta(days=1)

    async with await tenant_client(admin_client, client_for, A, pool) as as_a:
        seen_by_a = await occupancy(as_a, pool)
    owners = sorted(((b["reservationId"] or ""), (b["tenantId"] or "")) for b in bookings_of(seen_by_a))
    assert owners == sorted([("", ""), (mine["id"], A), (mine["id"], A)])  # B's booking: taken, by someone
    hidden = next(b for b in bookings_of(seen_by_a) if b["reservationId"] is None)
    assert hidden["spot"] and hidden["status"] == "placed"

    # an operator key reading the pool but not the tenants' reservations sees every booking, no ids
    r = await admin_client.post(
        "/v1/api-keys",
        json={
            "principal": "ops",
            "grants": [{"action": "compute:inventory:read", "resource": f"pool:{pool}"}],
        },
    )
    async with client_for(r.json()["key"]) as ops:
        seen_by_ops = await occupancy(ops, pool)
    assert len(bookings_of(seen_by_ops)) == 3
    assert {(b["reservationId"], b["tenantId"]) for b in bookings_of(seen_by_ops)} == {(None, None)}


async def test_unhealthy_atoms_and_cordoned_nodes(admin_client: httpx.AsyncClient) -> None:
    pool = await make_pool(admin_client, "occ-health")
    n1 = (await add_node(admin_client, pool, gpu_node("h1", 2)))["id"]
    n2 = (await add_node(admin_client, pool, gpu_node("h2", 2, taints=[{"key": "k", "value": "v"}])))["id"]
    r = await admin_client.post(
        f"/v1/nodes/{n1}/health", json={"devices": [{"id": "h1-GPU1", "healthy": False}]}
    )
    assert r.status_code == 200, r.text
    assert (await admin_client.post(f"/v1/nodes/{n2}/cordon")).status_code == 200
    seen = {n["nodeId"]: n for n in (await occupancy(admin_client, pool))["nodes"]}
    assert [(a["atomId"], a["healthy"], a["bookable"]) for a in seen[n1]["atoms"]] == [
        ("h1-GPU0", True, True),
        ("h1-GPU1", False, True),
    ]
    assert seen[n1]["schedulable"] and seen[n1]["reasons"] == []
    assert not seen[n2]["schedulable"] and seen[n2]["reasons"] == ["cordoned", "tainted k=v"]


async def test_scalar_steps_of_overlapping_holdings(admin_client: httpx.AsyncClient) -> None:
    pool = await make_pool(admin_client, "occ-cpu")
    await add_node(admin_client, pool, gpu_node("c1", 1, cpu=16, memory=None))
    now = datetime.fromisoformat((await occupancy(admin_client, pool))["now"])
    t0 = now.replace(microsecond=0) + timedelta(hours=1)
    t1, t2, t3 = (t0 + timedelta(hours=h) for h in (1, 2, 3))
    await reserve(
        admin_client, reservation(pool, 0, resources={"cpu": 4}, start=t0.isoformat(), duration="2h")
    )
    await reserve(
        admin_client, reservation(pool, 0, resources={"cpu": 8}, start=t1.isoformat(), duration="2h")
    )

    def steps(answer: dict[str, Any]) -> list[tuple[datetime, datetime, float]]:
        [scalar] = answer["nodes"][0]["scalars"]
        assert (scalar["resource"], scalar["capacity"]) == ("cpu", 16)
        return [
            (datetime.fromisoformat(s["start"]), datetime.fromisoformat(s["end"]), s["held"])
            for s in scalar["steps"]
        ]

    whole = await occupancy(
        admin_client, pool, **{"from": now.isoformat(), "to": (t3 + timedelta(hours=1)).isoformat()}
    )
    assert steps(whole) == [(t0, t1, 4), (t1, t2, 12), (t2, t3, 8)]  # nothing held before t0: no step
    inside = await occupancy(
        admin_client, pool, **{"from": (t0 + timedelta(minutes=30)).isoformat(), "to": t2.isoformat()}
    )
    assert steps(inside) == [(t0 + timedelta(minutes=30), t1, 4), (t1, t2, 12)]  # cut to the window
    assert datetime.fromisoformat(inside["from"]) == t0 + timedelta(minutes=30)
    after = await occupancy(admin_client, pool, **{"from": t3.isoformat()})
    assert steps(after) == [] and datetime.fromisoformat(after["to"]) == t3 + timedelta(hours=48)


async def test_a_planned_window_is_shown_planned(
    admin_client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    pool = await make_pool(admin_client, "occ-plan")
    await add_node(admin_client, pool, gpu_node("p1", 8))
    await reserve(admin_client, reservation(pool, 4, tenant=B, duration="1h"))
    head = await reserve(admin_client, reservation(pool, 8, tenant=A, duration="1h"), status="pending")
    config = CapacityConfig(SchedulerOptions())
    deadline = time.monotonic() + 10
    planned: list[dict[str, Any]] = []
    while not planned and time.monotonic() < deadline:  # the app's planner may have planned it already
        await plan_pool(clean_db, PoolCache(), config, pool)
        planned = [b for b in bookings_of(await occupancy(admin_client, pool)) if b["planned"]]
        if not planned:
            await asyncio.sleep(0.05)
    assert len(planned) == 8 and {(b["reservationId"], b["status"]) for b in planned} == {
        (head["id"], "pending")
    }
    view = (await admin_client.get(f"/v1/reservations/{head['id']}")).json()
    assert {datetime.fromisoformat(b["start"]) for b in planned} == {
        datetime.fromisoformat(view["plannedStart"])
    }


@pytest.mark.parametrize(
    ("query", "path"),
    [
        ({"from": "yesterday"}, "from"),
        ({"from": "2026-12-01T12:00:00"}, "from"),  # no UTC offset
        ({"to": "12345"}, "to"),  # a number of seconds is no ISO 8601 time
        ({"from": "0001-01-01T00:00:00+00:00"}, "from"),
        ({"from": "2026-12-01T12:00:00Z", "to": "2026-12-01T12:00:00Z"}, "to"),  # to == from
        ({"from": "2026-12-01T12:00:00Z", "to": "2026-12-01T11:00:00Z"}, "to"),
        ({"from": "2026-12-01T12:00:00Z", "to": "2027-01-01T12:00:01Z"}, "to"),  # 31 days and a second
        ({"to": "2000-01-01T00:00:00Z"}, "to"),  # before the default from, now
        ({"from": "9999-12-31T12:00:00Z"}, "from"),  # the default to would leave year 9999
    ],
)
async def test_a_bad_window_is_422_at_its_field_and_changes_nothing(
    admin_client: httpx.AsyncClient, query: dict[str, str], path: str
) -> None:
    pool = await make_pool(admin_client, "occ-bad")
    await add_node(admin_client, pool, gpu_node("b1", 2))
    await reserve(admin_client, reservation(pool, 1))
    before = await occupancy(
        admin_client, pool, **{"from": "2026-01-01T00:00:00Z", "to": "2026-01-31T00:00:00Z"}
    )
    listed = (await admin_client.get("/v1/reservations")).json()
    r = await admin_client.get(f"/v1/pools/{pool}/occupancy", params=query)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "INVALID_INPUT" and error["details"]["path"] == path, r.text
    assert error["message"].startswith(f"{path}: ")
    if query.get("from") == "yesterday":
        assert error["message"] == "from: not an ISO 8601 time, e.g. 2026-12-01T12:00:00Z"
    after = await occupancy(
        admin_client, pool, **{"from": "2026-01-01T00:00:00Z", "to": "2026-01-31T00:00:00Z"}
    )
    assert after["nodes"] == before["nodes"] and (await admin_client.get("/v1/reservations")).json() == listed


async def test_the_longest_window_and_an_unknown_pool(
    admin_client: httpx.AsyncClient, client_for: Any
) -> None:
    pool = await make_pool(admin_client, "occ-31")
    seen = await occupancy(
        admin_client, pool, **{"from": "2026-12-01T12:00:00+02:00", "to": "2027-01-01T10:00:00Z"}
    )
    assert (seen["from"], seen["to"], seen["nodes"]) == (
        "2026-12-01T10:00:00+00:00",
        "2027-01-01T10:00:00+00:00",
        [],
    )
    r = await admin_client.get("/v1/pools/pool_nope/occupancy")
    assert r.status_code == 404 and r.json()["error"]["code"] == "NOT_FOUND", r.text
    other = await make_pool(admin_client, "occ-other")
    async with await tenant_client(admin_client, client_for, A, pool) as as_a:  # no grant on the other pool
        r = await as_a.get(f"/v1/pools/{other}/occupancy")
    assert r.status_code == 403 and r.json()["error"]["code"] == "FORBIDDEN", r.text


async def test_the_statements_do_not_grow_with_the_pool(
    admin_client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    """Set-based: the same statements for a pool of one node as for one of twelve (no read per node)."""
    from app.inventory.occupancy import Window, pool_occupancy
    from tests.round_trips import counting

    sent = []
    for size in (1, 12):
        pool = await make_pool(admin_client, f"occ-size-{size}")
        for i in range(size):
            await add_node(admin_client, pool, gpu_node(f"s{size}-{i}", 2))
        for _ in range(size):  # one per node: every atom booked, every node holding cpu
            await reserve(admin_client, reservation(pool, 2, resources={"cpu": 1}))
        with counting(clean_db) as trips:
            answer = await pool_occupancy(clean_db, pool, Window(), lambda tenant: True)
        assert len(answer.nodes) == size and all(len(a.bookings) == 1 for n in answer.nodes for a in n.atoms)
        assert all(n.scalars[0].steps[0].held == 1 for n in answer.nodes)
        sent.append(trips.sent)
    assert sent[0] == sent[1], sent[1]
    assert len([s for s in sent[0] if s.startswith("SELECT")]) == 6, sent[0]  # as docs/api.md says


async def test_the_answer_text_is_the_models_text(
    admin_client: httpx.AsyncClient, client_for: Any, clean_db: AsyncEngine
) -> None:
    """The route writes the document without validating it again (app/inventory/occupancy.py,
    ``occupancy_json``): its text is byte for byte what :class:`PoolOccupancy` renders, for an admin and
    for a tenant who sees another tenant's bookings without their ids, with fractional held amounts."""
    from app.answers.occupancy import PoolOccupancy
    from app.inventory.occupancy import Window, pool_occupancy

    pool = await make_pool(admin_client, "occ-text")
    await add_node(admin_client, pool, gpu_node("t1", 1, cpu=16, memory=None))
    await add_node(admin_client, pool, gpu_node("t2", 1, cpu=16, memory=None))
    await reserve(admin_client, reservation(pool, 1, tenant=A, resources={"cpu": 0.5}))
    await reserve(admin_client, reservation(pool, 1, tenant=B, resources={"cpu": 3}))
    async with await tenant_client(admin_client, client_for, A, pool) as as_a:
        for client, sees in ((admin_client, lambda tenant: True), (as_a, lambda tenant: tenant == A)):
            r = await client.get(f"/v1/pools/{pool}/occupancy")
            assert r.status_code == 200, r.text
            assert (
                r.content
                == PoolOccupancy.model_validate_json(r.content).model_dump_json(by_alias=True).encode()
            )
            held = [s["held"] for n in r.json()["nodes"] for c in n["scalars"] for s in c["steps"]]
            assert 0.5 in held and 3 in held, held
            model = await pool_occupancy(clean_db, pool, Window(), sees)
            ids = {b.tenantId for n in model.nodes for a in n.atoms for b in a.bookings}
            assert ids == ({A, B} if client is admin_client else {A, None}), ids

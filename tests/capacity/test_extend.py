"""``POST /v1/reservations/{id}/extend`` on real PostgreSQL (docs/lifecycle.md, "Extend"): a placed
reservation's bookings, scalar and quota holdings and allocations end at the new end, or, on a booked
atom, a scalar that would run out, a refused quota charge or bad input, nothing changes at all."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.capacity.invariants import violations
from tests.factories import add_node, gpu_node, make_pool, reservation

HOUR = timedelta(hours=1)
TABLES = ("reservations", "allocations", "device_bookings", "scalar_holdings", "quota_holdings")


async def books(engine: AsyncEngine) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the tables an extend may write, sorted: compared before and after a refusal."""
    out: dict[str, list[tuple[Any, ...]]] = {}
    async with engine.connect() as conn:
        for table in TABLES:
            rows = (await conn.exec_driver_sql(f"SELECT * FROM {table}")).all()
            out[table] = sorted(tuple(str(v) for v in r) for r in rows)
    return out


def end_of(view: dict[str, Any]) -> datetime:
    return max(datetime.fromisoformat(a["end"]) for a in view["allocations"])


async def reserve(client: httpx.AsyncClient, body: dict[str, Any], status: str = "placed") -> dict[str, Any]:
    r = await client.post("/v1/reservations", json=body)
    assert r.status_code == 201, r.text
    assert r.json()["status"] == status, r.json()
    return r.json()


async def extend(client: httpx.AsyncClient, reservation_id: str, end: Any) -> httpx.Response:
    value = end.isoformat() if isinstance(end, datetime) else end
    return await client.post(f"/v1/reservations/{reservation_id}/extend", json={"end": value})


async def pool_with(client: httpx.AsyncClient, *nodes: dict[str, Any], limits: dict[str, Any]) -> str:
    pool = await make_pool(client)
    for node in nodes:
        await add_node(client, pool, node)
    r = await client.put(f"/v1/tenants/acme/quotas/{pool}", json={"limits": limits})
    assert r.status_code == 200, r.text
    return pool


async def test_extended_when_free(admin_client: httpx.AsyncClient, clean_db: AsyncEngine) -> None:
    pool = await pool_with(admin_client, gpu_node("n1", 2, cpu=16), limits={"gpu": 2, "cpu": 16})
    placed = await reserve(admin_client, reservation(pool, 1, resources={"cpu": 4}, duration="1h"))
    old_end = end_of(placed)
    new_end = old_end + 2 * HOUR

    r = await extend(admin_client, placed["id"], new_end)
    assert r.status_code == 200, r.text
    view = r.json()
    assert view["status"] == "placed"
    assert [datetime.fromisoformat(a["end"]) for a in view["allocations"]] == [new_end]
    assert view["allocations"][0]["atoms"] == placed["allocations"][0]["atoms"]
    extended = [c for c in view["conditions"] if c["type"] == "Extended"]
    assert len(extended) == 1 and extended[0]["reason"] == "ExtendRequested"
    assert datetime.fromisoformat(extended[0]["oldEnd"]) == old_end
    assert datetime.fromisoformat(extended[0]["newEnd"]) == new_end

    async with clean_db.connect() as conn:
        bookings = (await conn.exec_driver_sql("SELECT upper(during) FROM device_bookings")).scalars().all()
        scalars = (await conn.exec_driver_sql("SELECT ends_at FROM scalar_holdings")).scalars().all()
        quota = (await conn.exec_driver_sql("SELECT resource, ends_at FROM quota_holdings")).all()
        ends = (await conn.exec_driver_sql("SELECT ends_at FROM reservations")).scalars().all()
    assert bookings == [new_end] and scalars == [new_end] and ends == [new_end]
    assert sorted(quota) == [("cpu", new_end), ("gpu", new_end)]
    assert await violations(clean_db) == {}

    before = await books(clean_db)  # the same end again: a 200 that changes nothing
    again = await extend(admin_client, placed["id"], new_end)
    assert again.status_code == 200, again.text
    assert again.json() == view
    assert await books(clean_db) == before


async def test_a_gang_is_extended_whole(admin_client: httpx.AsyncClient, clean_db: AsyncEngine) -> None:
    pool = await pool_with(admin_client, gpu_node("n1", 1), gpu_node("n2", 1), limits={"gpu": 4})
    gang = await reserve(admin_client, reservation(pool, 1, duration="1h", gang={"members": 2}))
    new_end = end_of(gang) + HOUR
    r = await extend(admin_client, gang["id"], new_end)
    assert r.status_code == 200, r.text
    assert [datetime.fromisoformat(a["end"]) for a in r.json()["allocations"]] == [new_end, new_end]
    assert await violations(clean_db) == {}


async def test_a_gang_member_blocked_changes_no_member(
    admin_client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    pool = await pool_with(admin_client, gpu_node("n1", 1), gpu_node("n2", 1), limits={"gpu": 4})
    gang = await reserve(admin_client, reservation(pool, 1, duration="1h", gang={"members": 2}))
    old_end = end_of(gang)
    later = await reserve(admin_client, reservation(pool, 1, start=old_end.isoformat(), duration="1h"))
    before = await books(clean_db)
    r = await extend(admin_client, gang["id"], old_end + HOUR)
    assert r.status_code == 409, r.text
    assert r.json()["error"]["code"] == "CONFLICT"
    assert later["id"] in r.json()["error"]["message"]
    assert await books(clean_db) == before


async def test_a_booked_next_window_is_409_naming_it(
    admin_client: httpx.AsyncClient, clean_db: AsyncEngine, client_for: Any
) -> None:
    pool = await pool_with(admin_client, gpu_node("n1", 1), limits={"gpu": 2})
    placed = await reserve(admin_client, reservation(pool, 1, duration="1h"))
    old_end = end_of(placed)
    later = await reserve(
        admin_client,
        reservation(pool, 1, tenant="other", start=(old_end + HOUR / 2).isoformat(), duration="1h"),
    )
    before = await books(clean_db)

    r = await extend(admin_client, placed["id"], old_end + HOUR)
    assert r.status_code == 409, r.text
    error = r.json()["error"]
    assert error["code"] == "CONFLICT"
    assert f"reservation '{later['id']}'" in error["message"]
    assert "n1-GPU0" in error["message"]
    assert error["details"]["reservationId"] == later["id"]
    assert await books(clean_db) == before

    # acme's own key may not read tenant other's work: the blocker is "another reservation"
    key = await admin_client.post(
        "/v1/api-keys",
        json={
            "principal": "acme-ci",
            "tenantId": "acme",
            "grants": [{"action": "compute:reservations:*", "resource": "tenant:acme"}],
        },
    )
    assert key.status_code == 201, key.text
    async with client_for(key.json()["key"]) as acme:
        r = await extend(acme, placed["id"], old_end + HOUR)
    assert r.status_code == 409, r.text
    assert "another reservation" in r.json()["error"]["message"]
    assert later["id"] not in r.text
    assert r.json()["error"]["details"]["reservationId"] is None
    assert await books(clean_db) == before

    # up to the blocker's start it is free: [old end, its start) is booked
    r = await extend(admin_client, placed["id"], old_end + HOUR / 2)
    assert r.status_code == 200, r.text
    assert await violations(clean_db) == {}


async def test_a_scalar_that_would_run_out_is_409(
    admin_client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    pool = await pool_with(admin_client, gpu_node("n1", 2, cpu=10), limits={"gpu": 4, "cpu": 20})
    placed = await reserve(admin_client, reservation(pool, 1, resources={"cpu": 6}, duration="1h"))
    old_end = end_of(placed)
    later = await reserve(
        admin_client, reservation(pool, 0, resources={"cpu": 6}, start=old_end.isoformat(), duration="1h")
    )
    before = await books(clean_db)
    r = await extend(admin_client, placed["id"], old_end + HOUR)
    assert r.status_code == 409, r.text
    error = r.json()["error"]
    assert error["code"] == "CONFLICT"
    assert error["message"].startswith(
        f"cannot extend to {(old_end + HOUR).isoformat()}: cpu on n1 would run out"
    )
    assert "6 held of 10, 6 more needed" in error["message"]
    assert error["details"]["reservationId"] == later["id"]
    assert await books(clean_db) == before


async def test_a_refused_quota_charge_is_409_quota_exceeded(
    admin_client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    pool = await pool_with(admin_client, gpu_node("n1", 2, cpu=64), limits={"gpu": 4, "cpu": 8})
    placed = await reserve(admin_client, reservation(pool, 1, resources={"cpu": 4}, duration="1h"))
    old_end = end_of(placed)
    await reserve(
        admin_client, reservation(pool, 0, resources={"cpu": 6}, start=old_end.isoformat(), duration="1h")
    )
    before = await books(clean_db)
    r = await extend(admin_client, placed["id"], old_end + HOUR)
    assert r.status_code == 409, r.text
    assert r.json()["error"]["code"] == "QUOTA_EXCEEDED"
    assert r.json()["error"]["details"]["resource"] == "cpu"
    assert await books(clean_db) == before


@pytest.mark.parametrize(
    ("end", "status", "code"),
    [
        (lambda e: e - HOUR, 422, "INVALID_INPUT"),
        (lambda e: "tomorrow", 422, "INVALID_INPUT"),
        (lambda e: e.replace(tzinfo=None).isoformat(), 422, "INVALID_INPUT"),
        (lambda e: 12345, 422, "INVALID_INPUT"),
        (lambda e: e + timedelta(days=400), 422, "INVALID_INPUT"),
    ],
    ids=["before the end", "unparsable", "no offset", "a number", "beyond the max lead"],
)
async def test_bad_ends_are_422_at_end(
    admin_client: httpx.AsyncClient, clean_db: AsyncEngine, end: Any, status: int, code: str
) -> None:
    pool = await pool_with(admin_client, gpu_node("n1", 1), limits={"gpu": 2})
    placed = await reserve(admin_client, reservation(pool, 1, duration="1h"))
    before = await books(clean_db)
    r = await extend(admin_client, placed["id"], end(end_of(placed)))
    assert r.status_code == status, r.text
    assert r.json()["error"]["code"] == code
    assert r.json()["error"]["details"]["path"] == "end"
    assert await books(clean_db) == before


async def test_only_placed_reservations_are_extended(
    admin_client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    pool = await pool_with(admin_client, gpu_node("n1", 1), limits={"gpu": 2})
    placed = await reserve(admin_client, reservation(pool, 1, duration="1h"))
    pending = await reserve(admin_client, reservation(pool, 1, duration="1h"), status="pending")
    far = (end_of(placed) + HOUR).isoformat()
    before = await books(clean_db)
    r = await extend(admin_client, pending["id"], far)
    assert r.status_code == 409, r.text
    assert r.json()["error"]["code"] == "CONFLICT"
    assert "is pending: only a placed reservation can be extended" in r.json()["error"]["message"]
    assert await books(clean_db) == before

    # the pending one goes first: released while it waits, no wake places it between the reads below
    for gone in (pending, placed):
        released = await admin_client.post(f"/v1/reservations/{gone['id']}/release")
        assert released.status_code == 200, released.text
    before = await books(clean_db)
    r = await extend(admin_client, placed["id"], far)
    assert r.status_code == 409, r.text
    assert "is released" in r.json()["error"]["message"]
    assert await books(clean_db) == before

    missing = await extend(admin_client, "res_nope", far)
    assert missing.status_code == 404, missing.text
    body = await admin_client.post(f"/v1/reservations/{placed['id']}/extend", json={"end": far, "x": 1})
    assert body.status_code == 422, body.text

"""Time is real (issue 11): scalars and quota are held over a reservation's window only, counted per
instant; release cuts holdings at the release instant; reservations end; the lead time is limited.

Every test goes through the real app on real PostgreSQL; instants come from the database clock (the
allocations' ``start`` / ``end``) or are passed in to the service functions, never patched.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from app.capacity.controllers.lifecycle import end_reservations
from app.capacity.reservations.release import release_reservation
from tests.factories import add_node, gpu_node, make_pool, reservation

SECOND = timedelta(seconds=1)
MONTH = timedelta(days=30)


def at(value: str) -> datetime:
    """An ISO instant of a view as a datetime."""
    return datetime.fromisoformat(value)


def iso(value: datetime) -> str:
    return value.isoformat()


async def _db_now(engine: AsyncEngine) -> datetime:
    async with engine.connect() as conn:
        return (await conn.exec_driver_sql("SELECT now()")).scalar_one()


async def _reserve(client: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    r = await client.post("/v1/reservations", json=body)
    assert r.status_code == 201, r.text
    return r.json()


def _cpu(pool: str, cpu: int, start: datetime | None, duration: str | int = "1d") -> dict[str, Any]:
    body = reservation(pool, 0, resources={"cpu": cpu}, duration=duration)
    if start is not None:
        body["start"] = iso(start)
    return body


async def test_cpu_is_held_per_instant_next_month_and_now(
    admin_client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    """Done when 1: 128 cpu next month and 128 cpu now both place; 1 cpu overlapping either by one
    second pends with the scalars reason, and preview agrees; touching (half-open) windows place."""
    pool = await make_pool(admin_client)
    await add_node(admin_client, pool, gpu_node("cpu-a", 0, cpu=128, memory=None))
    month = (await _db_now(engine)) + MONTH
    later = await _reserve(admin_client, _cpu(pool, 128, month))
    now = await _reserve(admin_client, _cpu(pool, 128, None))
    assert later["status"] == "placed" and now["status"] == "placed"
    now_end = at(now["allocations"][0]["end"])
    later_start = at(later["allocations"][0]["start"])

    reason = "no node fits (1 node): 1 × scalars: cpu needs 1, 0 free"
    later_end = at(later["allocations"][0]["end"])
    # the earliest window is where the holding in the way ends (docs/lifecycle.md, "Earliest start")
    for start, earliest in (
        (now_end - SECOND, now_end),
        (later_start - timedelta(hours=1) + SECOND, later_end),
    ):
        body = _cpu(pool, 1, start, duration="1h")
        preview = (await admin_client.post("/v1/capacity/preview", json=body)).json()
        assert at(preview.pop("earliest")["start"]) == earliest
        [row] = preview.pop("rejections")
        assert (row["filter"], row["reason"], row["count"]) == ("scalars", "scalars: cpu needs 1, 0 free", 1)
        assert [m["shortfall"] for m in preview.pop("nearestMisses")] == ["cpu needs 1, 0 free"]
        assert preview == {"fits": False, "candidates": [], "reason": reason}
        pending = await _reserve(admin_client, body)
        assert pending["status"] == "pending"
        assert pending["conditions"][0]["message"] == reason

    # between the two windows the node is free: a window touching both ends places (half-open)
    between = _cpu(pool, 128, now_end, duration=int((later_start - now_end).total_seconds()))
    assert (await admin_client.post("/v1/capacity/preview", json=between)).json()["fits"] is True
    assert (await _reserve(admin_client, between))["status"] == "placed"


async def test_scalar_room_is_the_peak_over_the_window(
    admin_client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    """Two holdings that never overlap each other leave room for what fits beside the larger one."""
    pool = await make_pool(admin_client)
    await add_node(admin_client, pool, gpu_node("cpu-b", 0, cpu=100, memory=None))
    t = (await _db_now(engine)) + timedelta(days=2)
    await _reserve(admin_client, _cpu(pool, 60, t, duration="1h"))
    await _reserve(admin_client, _cpu(pool, 30, t + timedelta(hours=1), duration="1h"))
    # over [t, t + 2h) the peak is 60: 40 fit, 41 do not
    body = _cpu(pool, 41, t, duration="2h")
    preview = (await admin_client.post("/v1/capacity/preview", json=body)).json()
    assert preview["reason"] == "no node fits (1 node): 1 × scalars: cpu needs 41, 40 free"
    assert (await _reserve(admin_client, _cpu(pool, 40, t, duration="2h")))["status"] == "placed"


async def test_gpu_quota_is_counted_per_instant(admin_client: httpx.AsyncClient, engine: AsyncEngine) -> None:
    """Done when 2: with a gpu quota of 8, 8 GPUs next month and 8 now both place; a ninth overlapping
    either is 409 naming the instant, the usage there, the limit and the request."""
    pool = await make_pool(admin_client)
    for name in ("q-a", "q-b"):
        await add_node(admin_client, pool, gpu_node(name))
    r = await admin_client.put(f"/v1/tenants/acme/quotas/{pool}", json={"limits": {"gpu": 8}})
    assert r.status_code == 200, r.text
    month = (await _db_now(engine)) + MONTH
    later = await _reserve(admin_client, reservation(pool, 8, start=iso(month)))
    now = await _reserve(admin_client, reservation(pool, 8))
    assert later["status"] == "placed" and now["status"] == "placed"
    now_start, now_end = at(now["allocations"][0]["start"]), at(now["allocations"][0]["end"])
    later_start = at(later["allocations"][0]["start"])

    view = (await admin_client.get(f"/v1/tenants/acme/quotas/{pool}")).json()
    assert view["limits"] == {"gpu": 8} and view["used"] == {"gpu": 8}
    assert view["peak"]["gpu"]["used"] == 8 and at(view["peak"]["gpu"]["at"]) >= now_start
    assert at(view["peakWindow"]["end"]) - at(view["peakWindow"]["start"]) == timedelta(days=7)

    for start, instant in (
        (now_end - SECOND, now_end - SECOND),  # the peak is held from the request's start
        (later_start - timedelta(hours=1) + SECOND, later_start),  # ... or from the later window's
    ):
        r = await admin_client.post(
            "/v1/reservations", json=reservation(pool, 1, start=iso(start), duration="1h")
        )
        assert r.status_code == 409, r.text
        error = r.json()["error"]
        assert error["code"] == "QUOTA_EXCEEDED"
        assert error["details"]["at"] == iso(instant) and at(error["details"]["at"]) == instant
        # numbers as JSON numbers, not strings
        assert (error["details"]["used"], error["details"]["limit"], error["details"]["requested"]) == (
            8,
            8,
            1,
        )
        assert f"exceeded at {iso(instant)}: 8 used of 8, 1 requested" in error["message"]
    # a GPU between the two windows is within the quota at every instant
    between = reservation(pool, 1, start=iso(now_end), duration="1h")
    assert (await _reserve(admin_client, between))["status"] == "placed"


async def test_a_reservation_ends_with_its_condition_and_keeps_its_history(
    admin_client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    """Done when 3: a 2-second reservation is ``ended`` with ``Ended`` / ``WindowEnded`` within 10 s of
    its end (the app's lifecycle controller, default interval 5 s); GET shows its allocations."""
    pool = await make_pool(admin_client)
    await add_node(admin_client, pool, gpu_node("short"))
    placed = await _reserve(admin_client, reservation(pool, 2, resources={"cpu": 4}, duration=2))
    assert placed["status"] == "placed"
    end = at(placed["allocations"][0]["end"])
    assert end - at(placed["allocations"][0]["start"]) == timedelta(seconds=2)
    view: dict[str, Any] = placed
    while (await _db_now(engine)) < end + timedelta(seconds=10):
        view = (await admin_client.get(f"/v1/reservations/{placed['id']}")).json()
        if view["status"] == "ended":
            break
        await asyncio.sleep(0.25)
    assert view["status"] == "ended", view
    ended = [c for c in view["conditions"] if c["type"] == "Ended"]
    assert ended == [
        {
            "type": "Ended",
            "status": "True",
            "reason": "WindowEnded",
            "message": f"the window ended at {iso(end)}",
        }
    ]
    assert view["allocations"] == placed["allocations"]  # start, end, releasedAt (None) as history
    listed = (await admin_client.get("/v1/reservations", params={"status": "ended"})).json()["items"]
    assert [r["id"] for r in listed] == [placed["id"]]
    # releasing an ended reservation changes nothing
    again = (await admin_client.post(f"/v1/reservations/{placed['id']}/release")).json()
    assert again["status"] == "ended" and again["allocations"] == placed["allocations"]


async def test_end_reservations_with_now_passed_in(
    admin_client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    """The sweep ends only what is over at ``now``, once."""
    pool = await make_pool(admin_client)
    await add_node(admin_client, pool, gpu_node("sweep"))
    first = await _reserve(admin_client, reservation(pool, 1, duration="1h"))
    second = await _reserve(admin_client, reservation(pool, 1, duration="2h"))
    end = at(first["allocations"][0]["end"])
    assert await end_reservations(engine, now=end - SECOND) == []
    assert await end_reservations(engine, now=end) == [first["id"]]
    assert await end_reservations(engine, now=end) == []
    assert (await admin_client.get(f"/v1/reservations/{second['id']}")).json()["status"] == "placed"


async def test_release_mid_window_cuts_holdings_and_frees_the_rest(
    admin_client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    """Done when 4: a release in mid-window cuts bookings, cpu and quota at the release instant; a
    request after it places on the freed atoms and cpu, one overlapping what was used does not."""
    pool = await make_pool(admin_client)
    node = await add_node(admin_client, pool, gpu_node("cut", cpu=64))
    await admin_client.put(f"/v1/tenants/acme/quotas/{pool}", json={"limits": {"gpu": 8, "cpu": 64}})
    placed = await _reserve(admin_client, reservation(pool, 8, resources={"cpu": 64}, duration="2h"))
    [alloc] = placed["allocations"]
    released = (await admin_client.post(f"/v1/reservations/{placed['id']}/release")).json()
    assert released["status"] == "released"
    [cut] = released["allocations"]
    cut_at = at(cut["releasedAt"])
    assert (cut["start"], cut["end"]) == (alloc["start"], alloc["end"])  # the window stays as history
    assert at(alloc["start"]) <= cut_at < at(alloc["end"])
    async with engine.connect() as conn:
        windows = (
            await conn.exec_driver_sql(
                "SELECT DISTINCT lower(during), upper(during) FROM device_bookings "
                f"WHERE allocation_id = '{alloc['id']}'"
            )
        ).all()
        assert windows == [(at(alloc["start"]), cut_at)]
        for table in ("scalar_holdings", "quota_holdings"):
            rows = (await conn.exec_driver_sql(f"SELECT DISTINCT starts_at, ends_at FROM {table}")).all()
            assert rows == [(at(alloc["start"]), cut_at)], table

    after = await _reserve(
        admin_client, reservation(pool, 8, resources={"cpu": 64}, start=iso(cut_at + SECOND), duration="1h")
    )
    assert after["status"] == "placed"
    assert sorted(after["allocations"][0]["atoms"]) == sorted(alloc["atoms"])
    assert after["allocations"][0]["nodeId"] == node["id"]
    used = reservation(pool, 0, resources={"cpu": 1}, start=alloc["start"], duration="1h")
    assert (await admin_client.post("/v1/capacity/preview", json=used)).json()["fits"] is False


async def test_release_at_a_passed_instant_and_before_the_start(
    admin_client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    """A release before the window starts removes the holdings; one at an instant passed in cuts there."""
    pool = await make_pool(admin_client)
    await add_node(admin_client, pool, gpu_node("cut2", cpu=64))
    start = (await _db_now(engine)) + timedelta(days=3)
    future = await _reserve(admin_client, reservation(pool, 8, resources={"cpu": 64}, start=iso(start)))
    await release_reservation(engine, future["id"], None, now=start + timedelta(hours=6))
    half = reservation(pool, 8, resources={"cpu": 64}, start=iso(start + timedelta(hours=6)), duration="1h")
    assert (await _reserve(admin_client, half))["status"] == "placed"
    early = reservation(pool, 0, resources={"cpu": 1}, start=iso(start + timedelta(hours=5)), duration="1h")
    assert (await admin_client.post("/v1/capacity/preview", json=early)).json()["fits"] is False

    other = await _reserve(admin_client, reservation(pool, 2, resources={"cpu": 8}, start=iso(start + MONTH)))
    rel = (await admin_client.post(f"/v1/reservations/{other['id']}/release")).json()
    assert rel["status"] == "released"
    async with engine.connect() as conn:
        alloc = other["allocations"][0]["id"]
        for sql in (
            f"SELECT count(*) FROM device_bookings WHERE allocation_id = '{alloc}'",
            f"SELECT count(*) FROM scalar_holdings WHERE allocation_id = '{alloc}'",
            f"SELECT count(*) FROM quota_holdings WHERE reservation_id = '{other['id']}'",
        ):
            assert (await conn.exec_driver_sql(sql)).scalar_one() == 0, sql


async def test_start_is_at_most_the_lead_time_ahead(
    admin_client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    """``start`` more than ``BC_CAPACITY_MAX_LEAD`` (366 days) ahead is 422 naming ``start``, and writes
    nothing; within it, the window places."""
    pool = await make_pool(admin_client)
    await add_node(admin_client, pool, gpu_node("lead"))
    now = await _db_now(engine)
    for path in ("/v1/reservations", "/v1/capacity/preview"):
        r = await admin_client.post(path, json=reservation(pool, 1, start=iso(now + timedelta(days=367))))
        assert r.status_code == 422, r.text
        assert r.json()["error"]["code"] == "INVALID_INPUT"
        assert "start" in str(r.json()["error"]["details"]) and "366 days" in r.json()["error"]["message"]
    async with engine.connect() as conn:
        assert (await conn.exec_driver_sql("SELECT count(*) FROM reservations")).scalar_one() == 0
    ok = await _reserve(admin_client, reservation(pool, 1, start=iso(now + timedelta(days=365))))
    assert ok["status"] == "placed"

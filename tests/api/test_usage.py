"""``GET /v1/usage`` through HTTP on real PostgreSQL (docs/operating.md, "Usage accounting"): hours of
known windows exact to the second (inside, crossing ``from``, crossing ``to``, a half-open edge, a
planned window left out, cpu and memory hours), the cuts of a real release and a real preemption of spot
work, every grouping, a tenant key's scope, and bad parameters (422 at the parameter, nothing changed)."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.tables import allocations, reservations
from tests.api.test_occupancy import tenant_client
from tests.capacity.helpers import book, db_time
from tests.factories import add_node, gpu_node, make_pool, reservation

A, B = "tenant-a", "tenant-b"
HOUR = timedelta(hours=1)


async def hold(
    engine: AsyncEngine,
    pool: str,
    node: str,
    atoms: list[str],
    window: tuple[datetime, datetime],
    tenant: str,
    *,
    spot: bool = False,
    planned: bool = False,
    resources: dict[str, int] | None = None,
) -> None:
    """A stored window as the guarded commit leaves it (bookings of ``atoms``, holdings of
    ``resources``), of ``tenant``'s reservation (spot or regular; ``planned``: a pending one's plan)."""
    async with engine.begin() as conn:
        alloc = await book(conn, pool, node, atoms, *window, resources)
        await conn.execute(sa.update(allocations).where(allocations.c.id == alloc).values(planned=planned))
        await conn.execute(
            sa.update(reservations)
            .where(
                reservations.c.id
                == sa.select(allocations.c.reservation_id).where(allocations.c.id == alloc).scalar_subquery()
            )
            .values(
                tenant_id=tenant,
                spec={"spot": True} if spot else {},
                status="pending" if planned else "ended",
            )
        )


async def usage(client: httpx.AsyncClient, **query: str) -> dict[str, Any]:
    r = await client.get("/v1/usage", params=query)
    assert r.status_code == 200, r.text
    return r.json()


def period(start: datetime, end: datetime, **more: str) -> dict[str, str]:
    return {"from": start.isoformat(), "to": end.isoformat(), **more}


def hours(seconds: float | Decimal) -> Any:
    """``seconds`` as the answer's hours, to well under a second."""
    return pytest.approx(float(Decimal(seconds) / 3600), rel=0, abs=1e-9)


def split(regular: float | Decimal = 0, spot: float | Decimal = 0) -> dict[str, Any]:
    return {"regular": hours(Decimal(regular) * 3600), "spot": hours(Decimal(spot) * 3600)}


def seconds_between(a: str, b: str) -> Decimal:
    delta = datetime.fromisoformat(b) - datetime.fromisoformat(a)
    return Decimal(delta.days * 86400 + delta.seconds) + Decimal(delta.microseconds) / 1_000_000


@pytest.fixture
async def known(admin_client: httpx.AsyncClient, clean_db: AsyncEngine) -> dict[str, Any]:
    """Pool P (nodes n1, n2) with known windows around the period ``[t, t + 10h)``; ``t`` is 5 h
    before the database's now, on a whole second."""
    pool = await make_pool(admin_client, "usage-p")
    n1 = (await add_node(admin_client, pool, gpu_node("n1", 4)))["id"]
    n2 = (await add_node(admin_client, pool, gpu_node("n2", 2)))["id"]
    t = (await db_time(clean_db)).replace(microsecond=0) - 5 * HOUR
    at = lambda h: t + timedelta(hours=h)  # noqa: E731
    # A, regular, wholly inside: 2 GPUs for 2 h with cpu 4 and memory 1024 MiB
    await hold(
        clean_db, pool, n1, ["n1-GPU0", "n1-GPU1"], (at(1), at(3)), A, resources={"cpu": 4, "memory": 1024}
    )
    # A, regular, crossing from: 30 min of it inside
    await hold(clean_db, pool, n1, ["n1-GPU2"], (at(-2), at(0.5)), A, resources={"cpu": 2})
    # B, spot, crossing to: 1 h of it inside
    await hold(clean_db, pool, n2, ["n2-GPU0"], (at(9), at(12)), B, spot=True, resources={"cpu": 1})
    # B, regular, 7 s
    await hold(clean_db, pool, n2, ["n2-GPU1"], (at(5), at(5) + timedelta(seconds=7)), B)
    # outside: ends exactly at from (half-open), starts exactly at to
    await hold(clean_db, pool, n1, ["n1-GPU3"], (at(-1), at(0)), A, resources={"cpu": 8})
    await hold(clean_db, pool, n1, ["n1-GPU3"], (at(10), at(11)), A)
    # A's planned window: not usage
    await hold(clean_db, pool, n1, ["n1-GPU3"], (at(4), at(6)), A, planned=True, resources={"cpu": 16})
    return {"pool": pool, "n1": n1, "n2": n2, "t": t, "end": at(10)}


async def test_known_windows_by_tenant(admin_client: httpx.AsyncClient, known: dict[str, Any]) -> None:
    seen = await usage(admin_client, **period(known["t"], known["end"]))
    assert (seen["from"], seen["to"], seen["groupBy"]) == (
        known["t"].isoformat(),
        known["end"].isoformat(),
        "tenant",
    )
    assert seen["tenantId"] is None and seen["poolId"] is None
    a, b = seen["rows"]
    assert a == {
        "tenantId": A,
        "deviceHours": {"gpu": split(2 * 2 + 0.5)},
        "scalarHours": {"cpu": split(4 * 2 + 2 * 0.5), "memory": split(1024 * 2)},
    }
    assert b == {
        "tenantId": B,
        "deviceHours": {"gpu": {"regular": hours(7), "spot": hours(3600)}},
        "scalarHours": {"cpu": split(spot=1)},
    }
    assert seen["total"] == {
        "deviceHours": {"gpu": {"regular": hours(4.5 * 3600 + 7), "spot": hours(3600)}},
        "scalarHours": {"cpu": split(9, 1), "memory": split(2048)},
    }
    # whole hours are integers in JSON
    assert isinstance(a["deviceHours"]["gpu"]["spot"], int) and a["scalarHours"]["memory"]["regular"] == 2048


async def test_every_grouping(admin_client: httpx.AsyncClient, known: dict[str, Any]) -> None:
    asked = period(known["t"], known["end"])
    by_pool = await usage(admin_client, **asked, groupBy="pool")
    [row] = by_pool["rows"]
    assert (row["poolId"], row["poolName"]) == (known["pool"], "usage-p") and "tenantId" not in row
    assert (
        row["deviceHours"]
        == by_pool["total"]["deviceHours"]
        == {"gpu": {"regular": hours(4.5 * 3600 + 7), "spot": hours(3600)}}
    )

    by_node = await usage(admin_client, **asked, groupBy="node")
    rows = {r["nodeName"]: r for r in by_node["rows"]}
    assert [r["nodeId"] for r in by_node["rows"]] == sorted([known["n1"], known["n2"]])
    assert {r["poolId"] for r in rows.values()} == {known["pool"]}
    assert rows["n1"]["deviceHours"] == {"gpu": split(4.5)}
    assert rows["n1"]["scalarHours"] == {"cpu": split(9), "memory": split(2048)}
    assert rows["n2"]["deviceHours"] == {"gpu": {"regular": hours(7), "spot": hours(3600)}}
    assert rows["n2"]["scalarHours"] == {"cpu": split(spot=1)}

    by_resource = await usage(admin_client, **asked, groupBy="resource")
    assert [r["resource"] for r in by_resource["rows"]] == ["cpu", "gpu", "memory"]
    cpu, gpu, memory = by_resource["rows"]
    assert cpu == {"resource": "cpu", "deviceHours": {}, "scalarHours": {"cpu": split(9, 1)}}
    assert gpu["deviceHours"] == {"gpu": {"regular": hours(4.5 * 3600 + 7), "spot": hours(3600)}}
    assert gpu["scalarHours"] == {} and memory["scalarHours"] == {"memory": split(2048)}

    # filters: a tenant, a pool, a pool nothing used, a period nothing overlaps
    only_b = await usage(admin_client, **asked, tenantId=B, groupBy="node")
    assert [r["nodeName"] for r in only_b["rows"]] == ["n2"] and only_b["tenantId"] == B
    assert (await usage(admin_client, **asked, poolId=known["pool"]))["total"] == by_pool["total"]
    assert (await usage(admin_client, **asked, poolId="pool_nope"))["rows"] == []
    before = period(known["t"] - 30 * HOUR, known["t"] - 3 * HOUR)
    assert (await usage(admin_client, **before))["total"] == {"deviceHours": {}, "scalarHours": {}}


async def test_a_release_and_a_preemption_cut_what_counts(
    admin_client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    """Real cuts: B's spot work preempted by A's regular work, then A's released mid-window; each counts
    up to its cut instant (the allocations' ``releasedAt``)."""
    pool = await make_pool(admin_client, "usage-cuts")
    await add_node(admin_client, pool, gpu_node("c1", 2))
    start = await db_time(clean_db)
    r = await admin_client.post(
        "/v1/reservations",
        json=reservation(pool, 2, tenant=B, spot=True, resources={"cpu": 3}, duration="2h"),
    )
    assert r.status_code == 201 and r.json()["status"] == "placed", r.text
    spot_id = r.json()["id"]
    r = await admin_client.post(
        "/v1/reservations", json=reservation(pool, 2, tenant=A, resources={"cpu": 5}, duration="2h")
    )
    assert r.status_code == 201 and r.json()["status"] == "placed", r.text
    regular_id = r.json()["id"]
    r = await admin_client.post(f"/v1/reservations/{regular_id}/release")
    assert r.status_code == 200 and r.json()["status"] == "released", r.text
    [regular] = r.json()["allocations"]
    spot_view = (await admin_client.get(f"/v1/reservations/{spot_id}")).json()
    assert spot_view["status"] == "preempted"
    [spot] = spot_view["allocations"]
    spot_held = seconds_between(spot["start"], spot["releasedAt"])
    regular_held = seconds_between(regular["start"], regular["releasedAt"])
    assert Decimal(0) < spot_held < 60 and Decimal(0) < regular_held < 60

    seen = await usage(admin_client, **period(start - HOUR, start + 3 * HOUR), poolId=pool)
    a, b = seen["rows"]
    assert a == {
        "tenantId": A,
        "deviceHours": {"gpu": {"regular": hours(2 * regular_held), "spot": 0}},
        "scalarHours": {"cpu": {"regular": hours(5 * regular_held), "spot": 0}},
    }
    assert b == {
        "tenantId": B,
        "deviceHours": {"gpu": {"regular": 0, "spot": hours(2 * spot_held)}},
        "scalarHours": {"cpu": {"regular": 0, "spot": hours(3 * spot_held)}},
    }


async def test_the_default_period_is_the_last_30_days(
    admin_client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    before = await db_time(clean_db)
    seen = await usage(admin_client)
    start, end = datetime.fromisoformat(seen["from"]), datetime.fromisoformat(seen["to"])
    assert end - start == timedelta(days=30) and end >= before and end - before < timedelta(minutes=1)
    assert seen["rows"] == [] and seen["total"] == {"deviceHours": {}, "scalarHours": {}}
    only_from = await usage(admin_client, **{"from": (before - HOUR).isoformat()})
    assert datetime.fromisoformat(only_from["to"]) >= before
    end_only = datetime(2026, 3, 1, tzinfo=start.tzinfo)
    only_to = await usage(admin_client, to="2026-03-01T02:00:00+02:00")
    assert (only_to["from"], only_to["to"]) == (
        (end_only - timedelta(days=30)).isoformat(),
        end_only.isoformat(),
    )


async def test_a_tenant_key_reads_only_its_own(
    admin_client: httpx.AsyncClient, client_for: Any, known: dict[str, Any]
) -> None:
    asked = period(known["t"], known["end"])
    async with await tenant_client(admin_client, client_for, A, known["pool"]) as as_a:
        own = await usage(as_a, **asked, groupBy="node")
        assert own["tenantId"] == A
        assert [r["nodeName"] for r in own["rows"]] == ["n1"]  # B's work on n2 is not A's usage
        assert own["total"]["deviceHours"] == {"gpu": split(4.5)}
        assert (await usage(as_a, **asked, tenantId=A)) == await usage(as_a, **asked)
        r = await as_a.get("/v1/usage", params={**asked, "tenantId": B})
        assert r.status_code == 403 and r.json()["error"]["details"]["tenantId"] == A, r.text
    r = await admin_client.post("/v1/api-keys", json={"principal": "nothing", "grants": []})
    async with client_for(r.json()["key"]) as no_grant:
        r = await no_grant.get("/v1/usage")
        assert r.status_code == 403 and r.json()["error"]["code"] == "FORBIDDEN", r.text


@pytest.mark.parametrize(
    ("query", "path"),
    [
        ({"from": "yesterday"}, "from"),
        ({"from": "2026-12-01T12:00:00"}, "from"),  # no UTC offset
        ({"to": "12345"}, "to"),
        ({"from": "2026-12-01T12:00:00Z", "to": "2026-12-01T12:00:00Z"}, "to"),  # to == from
        ({"from": "2026-12-01T12:00:00Z", "to": "2026-12-01T11:00:00Z"}, "to"),
        ({"from": "2026-01-01T00:00:00Z", "to": "2027-01-02T00:00:01Z"}, "to"),  # 366 days and a second
        ({"from": "9999-01-01T00:00:00Z"}, "from"),  # after the default to, now
        ({"groupBy": "rack"}, "groupBy"),
        ({"poolId": "p" * 129}, "poolId"),
        ({"tenantId": "t" * 129}, "tenantId"),
    ],
)
async def test_bad_parameters_are_422_at_the_parameter_and_change_nothing(
    admin_client: httpx.AsyncClient, known: dict[str, Any], query: dict[str, str], path: str
) -> None:
    asked = period(known["t"], known["end"])
    before = await usage(admin_client, **asked)
    listed = (await admin_client.get("/v1/reservations")).json()
    r = await admin_client.get("/v1/usage", params=query)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "INVALID_INPUT" and error["details"]["path"] == path, r.text
    assert await usage(admin_client, **asked) == before
    assert (await admin_client.get("/v1/reservations")).json() == listed


async def test_the_longest_period(admin_client: httpx.AsyncClient) -> None:
    seen = await usage(admin_client, **{"from": "2026-01-01T02:00:00+02:00", "to": "2027-01-02T00:00:00Z"})
    assert (seen["from"], seen["to"]) == ("2026-01-01T00:00:00+00:00", "2027-01-02T00:00:00+00:00")


async def test_two_statements_whatever_the_bookings(
    admin_client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    """Set-based: the same statements for one booking as for twelve."""
    from app.capacity.reservations.usage import UsageQuery, usage_report
    from tests.round_trips import counting

    pool = await make_pool(admin_client, "usage-size")
    node = (await add_node(admin_client, pool, gpu_node("s1", 8)))["id"]
    t = (await db_time(clean_db)).replace(microsecond=0)
    sent = []
    for count in (1, 12):
        for i in range(count):
            at = t + timedelta(hours=100 * count + i)
            await hold(clean_db, pool, node, [f"s1-GPU{i % 8}"], (at, at + HOUR), A, resources={"cpu": 1})
        asked = UsageQuery(t, t + timedelta(days=60), pool_id=pool)
        with counting(clean_db) as trips:
            await usage_report(clean_db, asked)
        sent.append([s for s in trips.sent if s.startswith("SELECT")])
    assert len(sent[0]) == len(sent[1]) == 2, sent


async def test_the_http_metrics_count_it(admin_client: httpx.AsyncClient) -> None:
    from tests.api.metrics_text import parse, value

    def count(samples: Any, code: str) -> float:
        try:
            return value(samples, "bc_http_requests_total", route="/v1/usage", method="GET", code=code)
        except KeyError:
            return 0.0

    before = parse((await admin_client.get("/metrics")).text)
    await usage(admin_client)
    assert (await admin_client.get("/v1/usage", params={"groupBy": "rack"})).status_code == 422
    after = parse((await admin_client.get("/metrics")).text)
    assert count(after, "200") - count(before, "200") == 1 and count(after, "422") - count(before, "422") == 1
    assert value(after, "bc_http_request_duration_seconds_count", route="/v1/usage") >= 2

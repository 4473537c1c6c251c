"""The pool-lease placer and the bulk create through the real app on real PostgreSQL (issue 15):
202 queued + long-poll, the 256-item limit, per-item errors with nothing changed for failed items."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.locks import pool_lease
from tests.conftest import ADMIN_KEY, settings_for
from tests.factories import add_node, gpu_node, make_pool, reservation

COUNTED = ("reservations", "allocations", "device_bookings", "scalar_holdings", "quota_holdings")


async def _counts(engine: AsyncEngine) -> dict[str, int]:
    async with engine.connect() as conn:
        return {t: (await conn.exec_driver_sql(f"SELECT count(*) FROM {t}")).scalar_one() for t in COUNTED}


@pytest.fixture
async def lease_app(database_url: str, clean_db: AsyncEngine) -> AsyncIterator[Any]:
    """The real app with ``BC_CAPACITY_PLACER=pool-lease``, its lifecycle (the batch worker) running."""
    from app.main import create_app

    application = create_app(settings_for(database_url, capacity_placer="pool-lease"), run_migrations=False)
    async with application.router.lifespan_context(application):
        yield application


@pytest.fixture
async def lease_client(lease_app: Any) -> AsyncIterator[httpx.AsyncClient]:
    """An admin client of the pool-lease app."""
    transport = httpx.ASGITransport(app=lease_app)
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    client = httpx.AsyncClient(transport=transport, base_url="http://test", headers=headers, timeout=60)
    async with client as c:
        yield c


async def test_pool_lease_answers_202_queued_and_the_long_poll_sees_it_placed(
    lease_client: httpx.AsyncClient,
) -> None:
    pool = await make_pool(lease_client)
    node = await add_node(lease_client, pool, gpu_node("lease-a", 4))
    r = await lease_client.post("/v1/reservations", json=reservation(pool, 2, key="lease-1"))
    assert r.status_code == 202, r.text
    assert r.json()["status"] == "queued" and r.json()["allocations"] == []
    got = await lease_client.get(f"/v1/reservations/{r.json()['id']}", params={"waitSeconds": 10})
    assert got.status_code == 200, got.text
    view = got.json()
    assert view["status"] == "placed", view
    assert view["allocations"][0]["nodeId"] == node["id"] and len(view["allocations"][0]["atoms"]) == 2
    # an idempotent retry answers the reservation as it is now
    again = await lease_client.post("/v1/reservations", json=reservation(pool, 2, key="lease-1"))
    assert again.status_code == 200 and again.json()["status"] == "placed"
    # too big: decided pending with the plan's reason
    big = await lease_client.post("/v1/reservations", json=reservation(pool, 4, key="lease-2"))
    assert big.status_code == 202
    view = (await lease_client.get(f"/v1/reservations/{big.json()['id']}", params={"waitSeconds": 10})).json()
    assert view["status"] == "pending" and "fits" in view["conditions"][0]["message"], view


async def test_gangs_stay_inline_with_pool_lease(lease_client: httpx.AsyncClient) -> None:
    pool = await make_pool(lease_client)
    for name in ("g-a", "g-b"):
        await add_node(lease_client, pool, gpu_node(name, 4))
    r = await lease_client.post("/v1/reservations", json=reservation(pool, 2, gang={"members": 2}))
    assert r.status_code == 201 and r.json()["status"] == "placed", r.text


@pytest.mark.parametrize("value", ["31", "-1", "1.5", "x"])
async def test_wait_seconds_out_of_range_is_422_naming_it(
    admin_client: httpx.AsyncClient, value: str
) -> None:
    r = await admin_client.get("/v1/reservations/res_nope", params={"waitSeconds": value})
    assert r.status_code == 422, r.text
    assert r.json()["error"]["details"]["path"] == "waitSeconds"


async def test_bulk_items_are_independent_and_failed_ones_change_nothing(
    admin_client: httpx.AsyncClient, client_for: Any, clean_db: AsyncEngine
) -> None:
    pool = await make_pool(admin_client)
    await add_node(admin_client, pool, gpu_node("bulk-a", 8))
    other = await make_pool(admin_client)
    r = await admin_client.put(f"/v1/tenants/acme/quotas/{pool}", json={"limits": {"gpu": 5}})
    assert r.status_code == 200, r.text
    first = await admin_client.post("/v1/reservations", json=reservation(pool, 1, key="before"))
    assert first.status_code == 201
    before = await _counts(clean_db)
    items = [
        reservation(pool, 2, key="b-1"),  # placed
        {"tenantId": "acme", "poolId": pool, "devices": [{"class": "gpu", "count": "x"}]},  # bad item
        reservation(pool, 4, key="b-3"),  # over quota: 1 + 2 + 4 > 5
        reservation(pool, 1, key="before"),  # an idempotent retry of an earlier call
        reservation(pool, 2, key="before"),  # the same key with another body
        reservation("pool_missing", 1, key="b-6"),  # no such pool
        reservation(pool, 1, key="b-1"),  # another body under an earlier item's key
        reservation(pool, 2, key="b-1"),  # a retry of an earlier item of this call
        reservation(pool, 1, key="b-9", start="2001-01-01T00:00:00Z"),  # start in the past
        reservation(pool, 2, key="b-10"),  # placed
    ]
    r = await admin_client.post("/v1/reservations/batch", json={"items": items})
    assert r.status_code == 200, r.text
    answers = r.json()["items"]
    assert [a["status"] for a in answers] == [201, 422, 409, 200, 409, 404, 409, 200, 422, 201], answers
    assert answers[0]["reservation"]["status"] == "placed"
    assert answers[1]["error"]["code"] == "INVALID_INPUT"
    assert answers[1]["error"]["details"]["path"] == "items.1.devices.0.count"
    assert answers[2]["error"]["code"] == "QUOTA_EXCEEDED"
    assert answers[3]["reservation"]["id"] == first.json()["id"]
    assert answers[4]["error"]["code"] == "IDEMPOTENCY_KEY_REUSED"
    assert answers[5]["error"]["code"] == "NOT_FOUND"
    assert answers[7]["reservation"]["id"] == answers[0]["reservation"]["id"]
    assert answers[8]["error"]["details"]["path"] == "items.8.start"  # the item's path, as for the others
    assert answers[9]["reservation"]["status"] == "placed"
    placed = [answers[i]["reservation"] for i in (0, 9)]
    atoms = [a for p in placed for a in p["allocations"][0]["atoms"]]
    assert len(atoms) == len(set(atoms)) == 4  # the second plan saw the first
    after = await _counts(clean_db)
    # exactly two new reservations with one allocation, 2 bookings and one quota holding each
    assert after["reservations"] == before["reservations"] + 2
    assert after["allocations"] == before["allocations"] + 2
    assert after["device_bookings"] == before["device_bookings"] + 4
    assert after["quota_holdings"] == before["quota_holdings"] + 2

    # another tenant's principal: 403 for the item it may not create, the other item is created
    key = await admin_client.post(
        "/v1/api-keys",
        json={
            "principal": "beta-key",
            "tenantId": "beta",
            "grants": [
                {"action": "compute:reservations:*", "resource": f"pool:{other}"},
                {"action": "compute:reservations:*", "resource": "tenant:beta"},
            ],
        },
    )
    assert key.status_code == 201, key.text
    async with client_for(key.json()["key"]) as beta:
        r = await beta.post(
            "/v1/reservations/batch",
            json={"items": [reservation(pool, 1, tenant="beta"), reservation(other, 1, tenant="beta")]},
        )
        assert r.status_code == 200, r.text
        assert [a["status"] for a in r.json()["items"]] == [403, 201], r.json()


async def test_bulk_takes_at_most_256_items(admin_client: httpx.AsyncClient, clean_db: AsyncEngine) -> None:
    pool = await make_pool(admin_client)
    before = await _counts(clean_db)
    r = await admin_client.post(
        "/v1/reservations/batch", json={"items": [reservation(pool, 0, key=f"k{i}") for i in range(257)]}
    )
    assert r.status_code == 422 and r.json()["error"]["details"]["path"] == "items", r.text
    r = await admin_client.post("/v1/reservations/batch", json={"items": []})
    assert r.status_code == 422 and r.json()["error"]["details"]["path"] == "items", r.text
    assert await _counts(clean_db) == before


async def test_bulk_item_with_unstorable_text_fails_alone(
    admin_client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    """A NUL (PostgreSQL cannot store it) in one item is that item's 422, naming its path; the other items
    are created. A key named twice stays the whole call's 422: the body itself is ambiguous JSON."""
    pool = await make_pool(admin_client)
    await add_node(admin_client, pool, gpu_node("nul-a", 4))
    before = await _counts(clean_db)
    bad = reservation(pool, 1, key="nul-2") | {"tenantId": "ac\x00me"}
    items = [reservation(pool, 1, key="nul-1"), bad, reservation(pool, 1, key="nul-3")]
    r = await admin_client.post("/v1/reservations/batch", json={"items": items})
    assert r.status_code == 200, r.text
    answers = r.json()["items"]
    assert [a["status"] for a in answers] == [201, 422, 201], answers
    assert answers[1]["error"]["code"] == "INVALID_INPUT"
    assert answers[1]["error"]["details"]["path"] == "items.1.tenantId"
    after = await _counts(clean_db)
    assert after["reservations"] == before["reservations"] + 2
    assert after["device_bookings"] == before["device_bookings"] + 2
    duplicated = b'{"items": [{"tenantId": "a", "tenantId": "b"}]}'
    r = await admin_client.post(
        "/v1/reservations/batch", content=duplicated, headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 422 and r.json()["error"]["details"]["path"] == "tenantId", r.text
    assert await _counts(clean_db) == after


async def test_bulk_waits_for_the_pool_lease_another_batch_holds(
    admin_client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    """One batch at a time plans a pool, on every replica: a bulk call waits while another transaction
    (another replica's batch) holds the pool's lease, and places once it is let go."""
    pool = await make_pool(admin_client)
    await add_node(admin_client, pool, gpu_node("lease-wait", 4))
    async with clean_db.connect() as holder:
        await holder.begin()
        assert (await holder.execute(sa.select(pool_lease(sa.literal(pool))))).scalar_one()
        call = asyncio.create_task(
            admin_client.post("/v1/reservations/batch", json={"items": [reservation(pool, 1, key="lw")]})
        )
        await asyncio.sleep(1.0)
        assert not call.done()
        await holder.rollback()
    r = await asyncio.wait_for(call, 30)
    assert r.status_code == 200 and r.json()["items"][0]["reservation"]["status"] == "placed", r.text


async def test_bulk_pending_items_are_not_refused_by_each_others_charges(
    admin_client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    """Found by a fresh-user run: a batch charged every item before planning, so items that then went
    pending (and hold nothing) used up the quota of later ones: 409 where each alone answers pending."""
    pool = await make_pool(admin_client)
    await add_node(admin_client, pool, gpu_node("full-a", 1))
    # cordoned: it places nothing, but a 3-GPU request is one the pool could hold (checked at intake)
    await add_node(admin_client, pool, gpu_node("cordoned-b", 4, cordoned=True))
    r = await admin_client.put(f"/v1/tenants/acme/quotas/{pool}", json={"limits": {"gpu": 3}})
    assert r.status_code == 200, r.text
    held = await admin_client.post("/v1/reservations", json=reservation(pool, 1, key="holds-the-gpu"))
    assert held.status_code == 201 and held.json()["status"] == "placed", held.text
    before = await _counts(clean_db)
    items = [reservation(pool, 1, key=f"nothing-free-{i}") for i in range(6)]
    items.append(reservation(pool, 3, key="over-quota-alone"))  # 1 held + 3 > 3: 409 alone too
    r = await admin_client.post("/v1/reservations/batch", json={"items": items})
    assert r.status_code == 200, r.text
    answers = r.json()["items"]
    assert [a["status"] for a in answers] == [201] * 6 + [409], answers
    assert {a["reservation"]["status"] for a in answers[:6]} == {"pending"}
    assert answers[6]["error"]["code"] == "QUOTA_EXCEEDED"
    after = await _counts(clean_db)
    assert after["reservations"] == before["reservations"] + 6  # the refused item wrote nothing
    assert after["quota_holdings"] == before["quota_holdings"]  # pending items hold nothing
    usage = (await admin_client.get(f"/v1/tenants/acme/quotas/{pool}")).json()
    assert usage["used"]["gpu"] == 1, usage


async def test_bulk_refused_item_frees_what_it_planned_for_a_later_item(
    admin_client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    """The charge comes last (lock order ... -> quota_usage): an item refused there gives back the atoms
    it was planned on, and an item that went pending behind it is planned again."""
    pool = await make_pool(admin_client)
    await add_node(admin_client, pool, gpu_node("two-a", 2))
    r = await admin_client.put(f"/v1/tenants/acme/quotas/{pool}", json={"limits": {"gpu": 1}})
    assert r.status_code == 200, r.text
    items = [
        reservation(pool, 2, key="too-much-quota"),  # fits the node, not the quota: 409
        reservation(pool, 1, key="fits-both"),  # pending behind the first plan, then placed
    ]
    r = await admin_client.post("/v1/reservations/batch", json={"items": items})
    assert r.status_code == 200, r.text
    answers = r.json()["items"]
    assert [a["status"] for a in answers] == [409, 201], answers
    assert answers[1]["reservation"]["status"] == "placed", answers[1]
    counts = await _counts(clean_db)
    assert counts["allocations"] == 1 and counts["device_bookings"] == 1 and counts["quota_holdings"] == 1


async def _fill_with_spot(client: httpx.AsyncClient, pool: str) -> list[str]:
    ids = []
    for i in range(2):
        r = await client.post("/v1/reservations", json=reservation(pool, 4, key=f"spot-{i}", spot=True))
        assert r.status_code in (201, 202), r.text
        ids.append(r.json()["id"])
    return ids


async def test_bulk_preempts_spot_work_inline(admin_client: httpx.AsyncClient) -> None:
    """Found by a fresh-user run: a regular bulk item that fits only by preempting stayed pending."""
    pool = await make_pool(admin_client)
    await add_node(admin_client, pool, gpu_node("spot-a", 8))
    victims = await _fill_with_spot(admin_client, pool)
    r = await admin_client.post("/v1/reservations/batch", json={"items": [reservation(pool, 8, key="reg")]})
    assert r.status_code == 200, r.text
    (answer,) = r.json()["items"]
    assert answer["status"] == 201 and answer["reservation"]["status"] == "placed", answer
    assert answer["reservation"]["conditions"][0]["type"] == "Preempted"
    assert sorted(answer["reservation"]["conditions"][0]["reservationIds"]) == sorted(victims)
    for victim in victims:
        view = (await admin_client.get(f"/v1/reservations/{victim}")).json()
        assert view["status"] == "preempted", view


async def test_pool_lease_preempts_spot_work_inline(lease_client: httpx.AsyncClient) -> None:
    pool = await make_pool(lease_client)
    await add_node(lease_client, pool, gpu_node("spot-lease", 8))
    victims = await _fill_with_spot(lease_client, pool)
    for victim in victims:
        got = await lease_client.get(f"/v1/reservations/{victim}", params={"waitSeconds": 10})
        assert got.json()["status"] == "placed", got.text
    r = await lease_client.post("/v1/reservations", json=reservation(pool, 8, key="reg-lease"))
    assert r.status_code == 202, r.text
    got = await lease_client.get(f"/v1/reservations/{r.json()['id']}", params={"waitSeconds": 10})
    view = got.json()
    assert view["status"] == "placed" and view["conditions"][0]["type"] == "Preempted", view
    for victim in victims:
        assert (await lease_client.get(f"/v1/reservations/{victim}")).json()["status"] == "preempted"


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE"])
async def test_other_methods_on_the_batch_route_are_405(
    admin_client: httpx.AsyncClient, clean_db: AsyncEngine, method: str
) -> None:
    """``batch`` is not a reservation id: 405 with ``Allow: POST`` (GET was 404 from the id route)."""
    r = await admin_client.request(method, "/v1/reservations/batch")
    assert r.status_code == 405, r.text
    assert r.headers["allow"] == "POST"
    assert r.json()["error"]["code"] == "METHOD_NOT_ALLOWED"

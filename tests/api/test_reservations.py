"""Reservations end to end through the real app on real PostgreSQL (issue 2, "Done when" 3)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import httpx

from tests.factories import add_node, gpu_node, make_pool, reservation, wait_for_status


async def _counts(engine: Any) -> dict[str, int]:
    async with engine.connect() as conn:
        out = {}
        for table in ("reservations", "allocations", "device_bookings", "scalar_holdings", "quota_holdings"):
            out[table] = (await conn.exec_driver_sql(f"SELECT count(*) FROM {table}")).scalar_one()
        return out


async def test_reserve_eight_gpus_places_on_one_node_and_release_frees_it(
    admin_client: httpx.AsyncClient,
) -> None:
    pool = await make_pool(admin_client)
    node = await add_node(admin_client, pool, gpu_node("dgx-a"))
    r = await admin_client.post("/v1/reservations", json=reservation(pool, 8, resources={"cpu": 16}))
    assert r.status_code == 201, r.text
    placed = r.json()
    assert placed["status"] == "placed"
    [alloc] = placed["allocations"]
    assert alloc["nodeId"] == node["id"]
    assert sorted(alloc["atoms"]) == sorted(d["id"] for d in node["devices"])
    assert alloc["resources"] == {"cpu": 16} and placed["spec"]["resources"] == {"cpu": 16}

    view = (await admin_client.get(f"/v1/pools/{pool}")).json()
    assert view["nodeCount"] == 1 and view["capacity"]["gpu"] == {"total": 8, "allocated": 8}
    assert view["capacity"]["cpu"] == {"total": 64, "allocated": 16}
    listed = (await admin_client.get("/v1/pools")).json()["items"]
    assert [p["id"] for p in listed] == [pool] and listed[0] == view

    got = await admin_client.get(f"/v1/reservations/{placed['id']}")
    assert got.status_code == 200 and got.json()["allocations"] == placed["allocations"]

    # the node is full now: a second reserve of the same shape is pending with the summary reason
    second = (await admin_client.post("/v1/reservations", json=reservation(pool, 8))).json()
    assert second["status"] == "pending"
    assert second["conditions"][0]["message"] == "no node fits (1 node): 1 × fits: 0 of 8 gpu free"

    rel = await admin_client.post(f"/v1/reservations/{placed['id']}/release")
    assert rel.status_code == 200 and rel.json()["status"] == "released"
    # the release is a wake edge: the pending one takes the freed node (and no cpu: it asked for none)
    woken = await wait_for_status(admin_client, second["id"], "placed")
    assert woken["allocations"][0]["nodeId"] == node["id"] and len(woken["allocations"][0]["atoms"]) == 8
    view = (await admin_client.get(f"/v1/nodes/{node['id']}")).json()
    assert view["resources"]["cpu"]["allocated"] == 0


async def test_pending_reason_groups_rejections(admin_client: httpx.AsyncClient) -> None:
    pool = await make_pool(admin_client)
    for name in ("a", "b"):
        await add_node(admin_client, pool, gpu_node(name, 4))
    await add_node(admin_client, pool, gpu_node("c", 4, cordoned=True))
    for _ in range(2):  # take 3 of 4 GPUs on a and on b
        r = await admin_client.post("/v1/reservations", json=reservation(pool, 3))
        assert r.json()["status"] == "placed"
    pending = (await admin_client.post("/v1/reservations", json=reservation(pool, 2))).json()
    assert pending["status"] == "pending"
    [cond] = [dict(c) for c in pending["conditions"]]
    rows, misses = cond.pop("rejections"), cond.pop("nearestMisses")
    assert cond == {
        "type": "Unschedulable",
        "status": "True",
        "reason": "NoFit",
        "message": "no node fits (3 nodes): 2 × fits: 1 of 4 gpu free; 1 × cordoned",
    }
    # the same groups as rows, with their filter and node names (docs/reasons.md, "Rejection rows")
    assert rows == [
        {"filter": "fits", "reason": "fits: 1 of 4 gpu free", "count": 2, "nodes": ["a", "b"]},
        {"filter": "schedulable", "reason": "cordoned", "count": 1, "nodes": ["c"]},
    ]
    assert [(m["nodeName"], m["shortfall"], m["missingAtoms"]) for m in misses] == [
        ("c", "cordoned", 0),
        ("a", "1 of 2 gpu free", 1),
        ("b", "1 of 2 gpu free", 1),
    ]
    got = (await admin_client.get(f"/v1/reservations/{pending['id']}")).json()
    assert got["conditions"] == pending["conditions"]


async def test_reserve_without_key_is_401(
    anon_client: httpx.AsyncClient, admin_client: httpx.AsyncClient
) -> None:
    pool = await make_pool(admin_client)
    r = await anon_client.post("/v1/reservations", json=reservation(pool, 1))
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "UNAUTHENTICATED"
    bad = await anon_client.get("/v1/pools", headers={"Authorization": "Bearer nope"})
    assert bad.status_code == 401


async def _tenant_key(admin: httpx.AsyncClient, tenant: str, pool: str) -> str:
    r = await admin.post(
        "/v1/api-keys",
        json={
            "principal": f"{tenant}-user",
            "tenantId": tenant,
            "grants": [
                {"action": "compute:reservations:*", "resource": f"tenant:{tenant}"},
                {"action": "compute:reservations:create", "resource": f"pool:{pool}"},
                {"action": "compute:capacity:read", "resource": f"pool:{pool}"},
            ],
        },
    )
    assert r.status_code == 201, r.text
    return r.json()["key"]


async def test_another_tenants_reservation_is_404(admin_client: httpx.AsyncClient, client_for: Any) -> None:
    pool = await make_pool(admin_client)
    await add_node(admin_client, pool, gpu_node("n1"))
    acme_key, globex_key = (
        await _tenant_key(admin_client, "acme", pool),
        await _tenant_key(admin_client, "globex", pool),
    )
    async with client_for(acme_key) as acme, client_for(globex_key) as globex:
        r = await acme.post("/v1/reservations", json=reservation(pool, 1, tenant="acme"))
        assert r.status_code == 201, r.text
        res_id = r.json()["id"]
        assert (await acme.get(f"/v1/reservations/{res_id}")).status_code == 200
        other = await globex.get(f"/v1/reservations/{res_id}")
        assert other.status_code == 404 and other.json()["error"]["code"] == "NOT_FOUND"
        assert (await globex.post(f"/v1/reservations/{res_id}/release")).status_code == 404
        listed = (await globex.get("/v1/reservations")).json()["items"]
        assert listed == []
        # a tenant key cannot reserve for another tenant
        forbidden = await globex.post("/v1/reservations", json=reservation(pool, 1, tenant="acme"))
        assert forbidden.status_code == 403
        # and a revoked key is 401
    keys = (await admin_client.post("/v1/api-keys", json={"principal": "tmp", "grants": []})).json()
    assert (await admin_client.delete(f"/v1/api-keys/{keys['id']}")).status_code == 204
    async with client_for(keys["key"]) as revoked:
        assert (await revoked.get("/v1/pools")).status_code == 401


async def test_quota_exhaustion_is_409_and_writes_nothing(
    admin_client: httpx.AsyncClient, engine: Any
) -> None:
    pool = await make_pool(admin_client)
    await add_node(admin_client, pool, gpu_node("n1"))
    q = await admin_client.put(f"/v1/tenants/acme/quotas/{pool}", json={"limits": {"gpu": 4, "cpu": 100}})
    assert q.status_code == 200 and q.json()["limits"] == {"cpu": 100, "gpu": 4}
    ok = await admin_client.post("/v1/reservations", json=reservation(pool, 3))
    assert ok.json()["status"] == "placed"
    before = await _counts(engine)
    over = await admin_client.post("/v1/reservations", json=reservation(pool, 2))
    assert over.status_code == 409
    err = over.json()["error"]
    assert err["code"] == "QUOTA_EXCEEDED" and err["details"]["resource"] == "gpu"
    assert await _counts(engine) == before
    usage = (await admin_client.get(f"/v1/tenants/acme/quotas/{pool}")).json()
    assert usage["used"]["gpu"] == 3


async def test_malformed_request_is_422_with_path_and_writes_nothing(
    admin_client: httpx.AsyncClient, engine: Any
) -> None:
    pool = await make_pool(admin_client)
    await add_node(admin_client, pool, gpu_node("n1"))
    before = await _counts(engine)
    cases: list[tuple[dict[str, Any], str]] = [
        (reservation(pool, 1, devices=[{"class": "gpu", "count": -1}]), "devices.0.count"),
        (reservation(pool, 1, devices=[{"class": "gpu", "count": 0}]), "devices.0.count"),
        (reservation(pool, 1, duration="soon"), "duration"),
        (reservation(pool, 0), ""),
        (reservation(pool, 1, nodeLabels={"a": "b"}), "nodeLabels"),
        (
            reservation(
                pool,
                1,
                devices=[
                    {
                        "class": "gpu",
                        "count": 1,
                        "selector": {
                            "matchExpressions": [{"key": "vramGiB", "op": "Gt", "values": ["lots"]}]
                        },
                    }
                ],
            ),
            "devices.0.selector",
        ),
        (
            reservation(pool, 1, devices=[{"class": "gpu", "count": 1, "selector": "vramGiB >> 3"}]),
            "devices.0.selector",
        ),
        (reservation(pool, 1, idempotencyKey=""), "idempotencyKey"),
        (reservation(pool, 1, resources={"cpu": -2}), "resources.cpu"),
        (reservation(pool, 1, devices=[{"class": "gpu", "count": True}]), "devices.0.count"),
        (reservation(pool, 1, start="2020-01-01T00:00:00Z"), "start"),
        (reservation(pool, 1, gang={"members": 0}), "gang.members"),
    ]
    for body, path in cases:
        r = await admin_client.post("/v1/reservations", json=body)
        assert r.status_code == 422, (body, r.text)
        err = r.json()["error"]
        assert err["code"] == "INVALID_INPUT"
        assert err["details"]["path"].startswith(path), (path, err)
        p = await admin_client.post("/v1/capacity/preview", json=body)
        assert p.status_code == 422
    shorthand = reservation(pool, 1, devices=[{"class": "gpu", "count": 1, "selector": "a in ()"}])
    err = (await admin_client.post("/v1/reservations", json=shorthand)).json()["error"]
    assert err["details"]["path"] == "devices.0.selector" and err["details"]["position"] == 6
    assert await _counts(engine) == before


async def test_a_bad_deadline_is_422_at_deadline_and_writes_nothing(
    admin_client: httpx.AsyncClient, engine: Any
) -> None:
    pool = await make_pool(admin_client)
    await add_node(admin_client, pool, gpu_node("n1"))
    async with engine.connect() as conn:
        now = (await conn.exec_driver_sql("SELECT now()")).scalar_one()
    start = now + timedelta(hours=1)
    before = await _counts(engine)
    cases: list[dict[str, Any]] = [
        {"deadline": "2030-01-01T00:00:00"},  # no timezone
        {"deadline": "tomorrow"},
        {"deadline": "0001-01-01T00:00:00Z"},  # outside years 1970..9999
        {"deadline": "2020-01-01T00:00:00Z"},  # passed: it could never be placed
        {"start": start.isoformat(), "deadline": (start - timedelta(minutes=1)).isoformat()},
        {"start": start.isoformat(), "deadline": start.isoformat()},  # after the start, not at it
    ]
    for fields in cases:
        body = reservation(pool, 1, key="deadline-1", **fields)
        for route in ("/v1/reservations", "/v1/capacity/preview"):
            r = await admin_client.post(route, json=body)
            assert r.status_code == 422, (route, fields, r.text)
            err = r.json()["error"]
            assert err["code"] == "INVALID_INPUT" and err["details"]["path"] == "deadline", (fields, err)
        bulk = await admin_client.post("/v1/reservations/batch", json={"items": [body]})
        [item] = bulk.json()["items"]
        assert item["status"] == 422 and item["error"]["details"]["path"] == "items.0.deadline", item
    assert await _counts(engine) == before
    # the key was not used: the same key with a good deadline creates, and the answers show it
    deadline = now + timedelta(hours=2)
    body = reservation(pool, 1, key="deadline-1", deadline=deadline.isoformat())
    created = await admin_client.post("/v1/reservations", json=body)
    assert created.status_code == 201 and created.json()["status"] == "placed"
    assert datetime.fromisoformat(created.json()["spec"]["deadline"]) == deadline
    got = (await admin_client.get(f"/v1/reservations/{created.json()['id']}")).json()
    assert got == created.json()
    # the deadline is part of the body: a retry with another one is another body
    other = reservation(pool, 1, key="deadline-1", deadline=(deadline + timedelta(minutes=1)).isoformat())
    assert (await admin_client.post("/v1/reservations", json=other)).status_code == 409


async def test_idempotent_retry_returns_the_same_reservation(
    admin_client: httpx.AsyncClient, engine: Any
) -> None:
    pool = await make_pool(admin_client)
    await add_node(admin_client, pool, gpu_node("n1"))
    body = reservation(pool, 2, key="retry-1")
    first = await admin_client.post("/v1/reservations", json=body)
    again = await admin_client.post("/v1/reservations", json=body)
    assert first.status_code == 201 and again.status_code == 200
    assert again.json() == first.json()
    other = await admin_client.post("/v1/reservations", json=reservation(pool, 3, key="retry-1"))
    assert other.status_code == 409 and other.json()["error"]["code"] == "IDEMPOTENCY_KEY_REUSED"
    counts = await _counts(engine)
    assert counts["reservations"] == 1 and counts["device_bookings"] == 2


async def test_preview_answers_candidates_or_reason(admin_client: httpx.AsyncClient, engine: Any) -> None:
    pool = await make_pool(admin_client, "preview-hosts")
    for name in ("n1", "n2"):
        await add_node(admin_client, pool, gpu_node(name, labels={"rack": "r1"}))
    before = await _counts(engine)
    r = await admin_client.post("/v1/capacity/preview", json=reservation(pool, 8))
    assert r.status_code == 200
    body = r.json()
    assert body["fits"] is True and len(body["candidates"]) == 2
    assert all(len(c["atoms"]) == 8 and "binpack" in c["scores"] for c in body["candidates"])
    # labels may change, so a selector on one is a reason to wait, not a refusal (docs/api.md)
    by_label = reservation(pool, 0, devices=[{"class": "gpu", "count": 1, "selector": "rack = r9"}])
    none = (await admin_client.post("/v1/capacity/preview", json=by_label)).json()
    # no label changes with time: no window within the lead either (docs/lifecycle.md, "Earliest start")
    assert none.pop("earliestReason").startswith("earliest: no node can hold it at any start up to ")
    assert none.pop("rejections") == [
        {"filter": "selector", "reason": "selector: 0 of 8 gpu match", "count": 2, "nodes": ["n1", "n2"]}
    ]
    assert [(m["nodeName"], m["shortfall"], m["missingAtoms"]) for m in none.pop("nearestMisses")] == [
        ("n1", "selector: 0 of 8 gpu match (rack In [r9])", 1),
        ("n2", "selector: 0 of 8 gpu match (rack In [r9])", 1),
    ]
    assert none == {
        "fits": False,
        "candidates": [],
        "reason": "no node fits (2 nodes): 2 × selector: 0 of 8 gpu match",
        "earliest": None,
    }
    # 9 GPUs: no node of the pool has them, so it could never fit: the summary as for any request that does
    # not fit, and the largest shape beside it
    never = (await admin_client.post("/v1/capacity/preview", json=reservation(pool, 9))).json()
    assert [r["count"] for r in never.pop("rejections")] == [2]
    assert [m["shortfall"] for m in never.pop("nearestMisses")] == ["8 of 9 gpu free"] * 2
    assert never == {
        "fits": False,
        "satisfiable": False,
        "candidates": [],
        "reason": "no node fits (2 nodes): 2 × fits: 8 of 8 gpu free",
        "unsatisfiableReason": "no node of pool preview-hosts can hold 9 gpu: the largest has 8",
    }
    empty = await make_pool(admin_client)
    nothing = (await admin_client.post("/v1/capacity/preview", json=reservation(empty, 1))).json()
    assert nothing["reason"] == "the pool has no nodes"
    assert await _counts(engine) == before


async def test_metrics_and_health_need_no_key(
    anon_client: httpx.AsyncClient, admin_client: httpx.AsyncClient
) -> None:
    pool = await make_pool(admin_client)
    await add_node(admin_client, pool, gpu_node("m1"))
    await admin_client.post("/v1/reservations", json=reservation(pool, 1))
    assert (await anon_client.get("/healthz")).json() == {"status": "ok"}
    assert (await anon_client.get("/readyz")).json() == {"status": "ready"}
    text = (await anon_client.get("/metrics")).text
    assert 'bc_placement_attempts_total{placer="inline",result="placed"}' in text
    assert 'bc_plans_total{path="shortlist"}' in text


async def test_gang_through_the_api(admin_client: httpx.AsyncClient) -> None:
    pool = await make_pool(admin_client)
    for name, rack in (("r1a", "a"), ("r1b", "b"), ("r2b", "b")):
        await add_node(admin_client, pool, gpu_node(name, 4, labels={"rack": rack}))
    body = reservation(pool, 4, gang={"members": 2, "topologyKey": "rack"})
    pv = (await admin_client.post("/v1/capacity/preview", json=body)).json()
    assert pv["fits"] and len(pv["candidates"]) == 2  # the members of the best gang
    placed = (await admin_client.post("/v1/reservations", json=body)).json()
    assert placed["status"] == "placed"
    assert {a["nodeId"] for a in placed["allocations"]} == {c["nodeId"] for c in pv["candidates"]}
    usage = (await admin_client.get(f"/v1/tenants/acme/quotas/{pool}")).json()
    assert usage["used"]["gpu"] == 8
    await admin_client.post(f"/v1/reservations/{placed['id']}/release")
    assert (await admin_client.get(f"/v1/tenants/acme/quotas/{pool}")).json()["used"]["gpu"] == 0


async def test_a_release_adds_a_released_condition_once(admin_client: httpx.AsyncClient) -> None:
    """Placed or pending, a released reservation says so in its conditions (with the instant); a second
    release changes nothing."""
    pool = await make_pool(admin_client)
    await add_node(admin_client, pool, gpu_node("r1", 8))
    placed = (await admin_client.post("/v1/reservations", json=reservation(pool, 8))).json()
    pending = (await admin_client.post("/v1/reservations", json=reservation(pool, 8))).json()
    assert (placed["status"], pending["status"]) == ("placed", "pending")
    for before, res in (("pending", pending), ("placed", placed)):
        released = (await admin_client.post(f"/v1/reservations/{res['id']}/release")).json()
        last = released["conditions"][-1]
        assert (last["type"], last["status"], last["reason"]) == ("Released", "True", "ReleaseRequested")
        assert last["message"].endswith(f"while {before}") and last["at"] is not None
        again = (await admin_client.post(f"/v1/reservations/{res['id']}/release")).json()
        assert again["conditions"] == released["conditions"]
        assert (await admin_client.get(f"/v1/reservations/{res['id']}")).json()["conditions"] == released[
            "conditions"
        ]

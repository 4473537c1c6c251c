"""Spot preemption through the HTTP API (issue 13, "Done when" 5 and "Visibility"): a tenant-scoped
caller never sees another tenant's reservation ids in a preview or a condition; the answers pass their
response models; the metrics count the preemption."""

from __future__ import annotations

from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.api.test_authorization import tenant_grants
from tests.factories import add_node, gpu_node, make_pool, reservation

A, B = "tenant-a", "tenant-b"


async def _key(admin: httpx.AsyncClient, tenant: str, pool: str) -> str:
    r = await admin.post(
        "/v1/api-keys",
        json={"principal": f"p-{tenant}", "tenantId": tenant, "grants": tenant_grants(tenant, pool)},
    )
    assert r.status_code == 201, r.text
    return r.json()["key"]


async def _reserve(client: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    r = await client.post("/v1/reservations", json=body)
    assert r.status_code == 201, r.text
    return r.json()


async def _preemption_samples(admin: httpx.AsyncClient) -> dict[str, float]:
    """The preemption samples of ``GET /metrics``, by sample name and result label: the attempts by
    result (``attempts:placed``) and the victims histogram's ``_count`` and ``_sum``. Absent ones are 0."""
    r = await admin.get("/metrics")
    assert r.status_code == 200, r.text
    seen: dict[str, float] = {}
    for family in text_string_to_metric_families(r.text):
        for sample in family.samples:
            if sample.name == "bc_preemption_attempts_total":
                seen[f"attempts:{sample.labels['result']}"] = sample.value
            elif sample.name in ("bc_preemption_victims_count", "bc_preemption_victims_sum"):
                seen[sample.name.removeprefix("bc_preemption_")] = sample.value
    return seen


async def test_a_tenant_never_sees_another_tenants_victims(
    admin_client: httpx.AsyncClient, client_for: Any
) -> None:
    before = await _preemption_samples(admin_client)
    pool = await make_pool(admin_client)
    node = (await add_node(admin_client, pool, gpu_node("n1", 8)))["id"]
    key_a = await _key(admin_client, A, pool)
    theirs = await _reserve(admin_client, reservation(pool, 4, tenant=B, spot=True))
    ours = await _reserve(admin_client, reservation(pool, 4, tenant=A, spot=True))
    async with client_for(key_a) as a:
        wanted = reservation(
            pool, 8, tenant=A, devices=[{"class": "gpu", "count": 8, "topology": "nvlink-all"}]
        )
        r = await a.post("/v1/capacity/preview", json=wanted)
        assert r.status_code == 200, r.text
        seen = r.json()
        assert seen["fits"] is False
        pre = seen["preemptible"]
        assert pre["reservations"] == 2 and pre["hiddenReservations"] == 1
        assert pre["reservationIds"] == [ours["id"]]
        assert pre["candidates"][0]["nodeId"] == node and len(pre["candidates"][0]["atoms"]) == 8
        assert theirs["id"] not in r.text

        placed = await _reserve(a, wanted)
        assert placed["status"] == "placed" and placed["allocations"][0]["nodeId"] == node
        cond = placed["conditions"][0]
        assert cond["type"] == "Preempted" and cond["reservationIds"] == [ours["id"]]
        assert cond["hiddenReservations"] == 1
        got = await a.get(f"/v1/reservations/{placed['id']}")
        assert got.status_code == 200 and theirs["id"] not in got.text
        # the victim of its own tenant shows the condition and what it held, cut at the instant
        victim = (await a.get(f"/v1/reservations/{ours['id']}")).json()
        assert victim["status"] == "preempted" and victim["conditions"][-1]["type"] == "Preempted"
        assert victim["allocations"][0]["releasedAt"] == victim["conditions"][-1]["at"]
        # the other tenant's victim: 404 for tenant A, preempted for its owner
        assert (await a.get(f"/v1/reservations/{theirs['id']}")).status_code == 404
    assert (await admin_client.get(f"/v1/reservations/{theirs['id']}")).json()["status"] == "preempted"

    # the one placed preemption is counted once, with its two victims; the preview counts nothing
    after = await _preemption_samples(admin_client)
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in sorted(set(before) | set(after))}
    assert delta == {
        "attempts:lost_race": 0.0,
        "attempts:no_fit": 0.0,
        "attempts:placed": 1.0,
        "victims_count": 1.0,
        "victims_sum": 2.0,
    }

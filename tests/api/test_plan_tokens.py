"""Plan tokens (docs/api.md, "Plan tokens"): a preview that fits signs its plan, and a create with
``ifPlan`` commits exactly that plan or answers 412 PLAN_STALE (422 at ``ifPlan`` for a token that is
not good for it), writing nothing; through the real app on real PostgreSQL."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from app.capacity.reservations.plan_tokens import encode
from app.db.tables import plan_token_secrets
from app.main import create_app
from tests.api.metrics_text import parse, value
from tests.capacity.helpers import overlapping_bookings
from tests.capacity.invariants import violations
from tests.conftest import ADMIN_KEY, settings_for
from tests.factories import add_node, gpu_node, make_pool, reservation

WRITTEN = (
    "reservations",
    "allocations",
    "device_bookings",
    "scalar_holdings",
    "quota_holdings",
    "quota_usage",
)


async def _counts(engine: AsyncEngine) -> dict[str, int]:
    async with engine.connect() as conn:
        return {
            table: (await conn.exec_driver_sql(f"SELECT count(*) FROM {table}")).scalar_one()
            for table in WRITTEN
        }


def payload_of(token: str) -> dict[str, Any]:
    signed = token.split(".")[0]
    return json.loads(base64.urlsafe_b64decode(signed + "=" * (-len(signed) % 4)))


async def _preview(client: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    r = await client.post("/v1/capacity/preview", json=body)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["fits"] is True and answer["planToken"] == answer["candidates"][0]["planToken"], answer
    return answer


async def _plan_creates(client: httpx.AsyncClient) -> dict[str, float]:
    samples = parse((await client.get("/metrics")).text)
    return {
        r: value(samples, "bc_plan_token_creates_total", result=r) for r in ("placed", "stale", "invalid")
    }


async def test_a_create_with_the_token_commits_the_previewed_node_atoms_and_window(
    admin_client: httpx.AsyncClient,
) -> None:
    pool = await make_pool(admin_client)
    for name in ("pt-a", "pt-b"):
        await add_node(admin_client, pool, gpu_node(name, 8))
    body = reservation(pool, 2, resources={"cpu": 4})  # no start: the preview's now
    answer = await _preview(admin_client, body)
    best = answer["candidates"][0]
    assert all(c.get("planToken") for c in answer["candidates"])
    planned = payload_of(answer["planToken"])
    before = await _plan_creates(admin_client)

    r = await admin_client.post("/v1/reservations", json={**body, "ifPlan": answer["planToken"]})
    assert r.status_code == 201, r.text
    placed = r.json()
    [alloc] = placed["allocations"]
    assert placed["status"] == "placed" and alloc["nodeId"] == best["nodeId"]
    assert alloc["atoms"] == best["atoms"] and alloc["resources"] == {"cpu": 4}
    # the window is the previewed one (the body has no start: the preview's now), not the create's now
    assert datetime.fromisoformat(alloc["start"]) == datetime.fromisoformat(planned["start"])
    assert datetime.fromisoformat(alloc["end"]) == datetime.fromisoformat(planned["end"])
    assert (await _plan_creates(admin_client))["placed"] == before["placed"] + 1

    # an idempotent retry (same key, same body, with or without the token) answers the same reservation
    again = await admin_client.post("/v1/reservations", json={**body, "ifPlan": answer["planToken"]})
    assert again.status_code == 200 and again.json()["id"] == placed["id"]
    plain = await admin_client.post("/v1/reservations", json=body)
    assert plain.status_code == 200 and plain.json()["id"] == placed["id"]

    # another candidate's own token commits that candidate, not the best one
    other = answer["candidates"][1]
    second = {**body, "idempotencyKey": "pt-second", "ifPlan": other["planToken"]}
    r = await admin_client.post("/v1/reservations", json=second)
    assert r.status_code == 201, r.text
    assert [(a["nodeId"], a["atoms"]) for a in r.json()["allocations"]] == [(other["nodeId"], other["atoms"])]


async def test_an_atom_booked_meanwhile_is_412_naming_it_and_nothing_is_written(
    admin_client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    pool = await make_pool(admin_client)
    node = await add_node(admin_client, pool, gpu_node("dgx-03", 2))
    body = reservation(pool, 2)
    token = (await _preview(admin_client, body))["planToken"]
    taken = await admin_client.post("/v1/reservations", json=reservation(pool, 1))  # one of the two
    assert taken.status_code == 201 and taken.json()["status"] == "placed"
    [atom] = taken.json()["allocations"][0]["atoms"]
    before, metrics = await _counts(clean_db), await _plan_creates(admin_client)

    r = await admin_client.post("/v1/reservations", json={**body, "ifPlan": token})
    assert r.status_code == 412, r.text
    error = r.json()["error"]
    assert error["code"] == "PLAN_STALE"
    assert error["message"] == f"{atom} on dgx-03 was booked by another reservation"
    assert error["details"]["nodeId"] == node["id"]
    assert await _counts(clean_db) == before  # no reservation, allocation, booking or quota charge
    assert (await _plan_creates(admin_client))["stale"] == metrics["stale"] + 1
    # never placed elsewhere
    listed = (await admin_client.get("/v1/reservations", params={"tenantId": "acme"})).json()["items"]
    assert [x["id"] for x in listed] == [taken.json()["id"]]


async def test_a_node_cordoned_meanwhile_is_412_naming_the_cordon(
    admin_client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    pool = await make_pool(admin_client)
    node = await add_node(admin_client, pool, gpu_node("dgx-04", 4))
    body = reservation(pool, 2)
    token = (await _preview(admin_client, body))["planToken"]
    assert (await admin_client.post(f"/v1/nodes/{node['id']}/cordon")).status_code == 200
    before = await _counts(clean_db)

    r = await admin_client.post("/v1/reservations", json={**body, "ifPlan": token})
    assert r.status_code == 412, r.text
    assert r.json()["error"]["code"] == "PLAN_STALE"
    assert r.json()["error"]["message"] == "dgx-04 was cordoned"
    assert await _counts(clean_db) == before


async def test_tokens_that_are_not_good_for_the_create_are_422_at_ifPlan(
    admin_client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    pool = await make_pool(admin_client)
    await add_node(admin_client, pool, gpu_node("dgx-05", 4))
    body = reservation(pool, 1)
    token = (await _preview(admin_client, body))["planToken"]
    other_tenant = (await _preview(admin_client, reservation(pool, 1, tenant="globex")))["planToken"]
    other_body = (await _preview(admin_client, reservation(pool, 2)))["planToken"]
    signed, signature = token.split(".")
    forged = f"{signed}.{signature[:-2]}{'AA' if signature[-2:] != 'AA' else 'BB'}"
    payload = payload_of(token)
    tampered = base64.urlsafe_b64encode(
        json.dumps({**payload, "nodes": [{**payload["nodes"][0], "atoms": [["dgx-05-GPU3"]]}]}).encode()
    )
    altered = f"{tampered.rstrip(b'=').decode()}.{signature}"
    async with clean_db.connect() as conn:
        secret = (await conn.execute(sa.select(plan_token_secrets.c.secret))).scalar_one().encode()
    past = datetime.fromisoformat(payload["iat"]) - timedelta(minutes=10)
    expired = encode(
        {**payload, "iat": past.isoformat(), "exp": (past + timedelta(seconds=300)).isoformat()}, secret
    )
    ended = encode(
        {**payload, "start": past.isoformat(), "end": (past + timedelta(minutes=1)).isoformat()}, secret
    )
    before, metrics = await _counts(clean_db), await _plan_creates(admin_client)

    cases = {
        "forged": (forged, "is not a plan token of this service, or it was altered"),
        "altered": (altered, "is not a plan token of this service, or it was altered"),
        "garbled": ("not a token", "String should match pattern"),
        "expired": (expired, "ifPlan expired at "),
        "window ended": (ended, "ifPlan's window ended at "),
        "another tenant": (other_tenant, "ifPlan was issued for another tenant, not acme"),
        "another body": (other_body, "ifPlan was issued for another request"),
    }
    for case, (bad, message) in cases.items():
        r = await admin_client.post("/v1/reservations", json={**body, "ifPlan": bad})
        assert r.status_code == 422, (case, r.text)
        error = r.json()["error"]
        assert error["code"] == "INVALID_INPUT" and error["details"]["path"] == "ifPlan", (case, error)
        assert message in error["message"], (case, error)
    # another tenant presenting acme's token: its own body, acme's plan
    r = await admin_client.post(
        "/v1/reservations", json={**reservation(pool, 1, tenant="globex"), "ifPlan": token}
    )
    assert r.status_code == 422 and r.json()["error"]["details"]["path"] == "ifPlan"
    assert "another tenant" in r.json()["error"]["message"]
    assert await _counts(clean_db) == before
    # the pattern refuses "garbled" before the service sees it; every other one is counted
    assert (await _plan_creates(admin_client))["invalid"] == metrics["invalid"] + 7

    # the token itself still commits its plan
    r = await admin_client.post("/v1/reservations", json={**body, "ifPlan": token})
    assert r.status_code == 201, r.text


async def test_sixteen_creates_with_tokens_for_the_same_atoms_place_one(
    admin_client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    pool = await make_pool(admin_client)
    await add_node(admin_client, pool, gpu_node("dgx-06", 4))
    bodies = [reservation(pool, 4, key=f"race-{i}") for i in range(16)]
    tokens = [(await _preview(admin_client, b))["planToken"] for b in bodies]  # all before any create
    assert len({json.dumps(payload_of(t)["nodes"][0]["atoms"]) for t in tokens}) == 1

    answers = await asyncio.gather(
        *(
            admin_client.post("/v1/reservations", json={**b, "ifPlan": t})
            for b, t in zip(bodies, tokens, strict=True)
        )
    )
    statuses = sorted(r.status_code for r in answers)
    assert statuses == [201] + [412] * 15, [r.text for r in answers if r.status_code not in (201, 412)]
    for r in answers:
        if r.status_code == 412:
            assert r.json()["error"]["code"] == "PLAN_STALE"
            assert r.json()["error"]["message"].endswith("on dgx-06 were booked by another reservation")
    async with clean_db.connect() as conn:
        assert await overlapping_bookings(conn) == 0
        assert (await conn.exec_driver_sql("SELECT count(*) FROM reservations")).scalar_one() == 1
    assert await violations(clean_db) == {}


async def test_a_gang_preview_signs_all_members_in_one_token(admin_client: httpx.AsyncClient) -> None:
    pool = await make_pool(admin_client)
    for name in ("g-a", "g-b", "g-c"):
        await add_node(admin_client, pool, gpu_node(name, 4))
    body = reservation(pool, 2, gang={"members": 2})
    r = await admin_client.post("/v1/capacity/preview", json=body)
    answer = r.json()
    assert answer["fits"] and len(answer["candidates"]) == 2
    assert all("planToken" not in c for c in answer["candidates"])
    r = await admin_client.post("/v1/reservations", json={**body, "ifPlan": answer["planToken"]})
    assert r.status_code == 201, r.text
    got = sorted((a["nodeId"], a["atoms"]) for a in r.json()["allocations"])
    assert got == sorted((c["nodeId"], c["atoms"]) for c in answer["candidates"])


@pytest.fixture
async def replica(database_url: str, clean_db: AsyncEngine) -> AsyncIterator[httpx.AsyncClient]:
    """A second app on the same database: another replica, with its own process-wide state."""
    application = create_app(settings_for(database_url), run_migrations=False)
    async with application.router.lifespan_context(application):
        transport = httpx.ASGITransport(app=application)
        headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
        async with httpx.AsyncClient(transport=transport, base_url="http://test", headers=headers) as c:
            yield c


async def test_the_stored_secret_is_shared_by_every_replica(
    admin_client: httpx.AsyncClient, replica: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    pool = await make_pool(admin_client)
    await add_node(admin_client, pool, gpu_node("dgx-07", 4))
    body = reservation(pool, 1)
    token = (await _preview(admin_client, body))["planToken"]
    async with clean_db.connect() as conn:
        [secret] = (await conn.execute(sa.select(plan_token_secrets.c.secret))).scalars().all()
    signed, signature = token.split(".")
    mac = hmac.new(secret.encode(), signed.encode(), hashlib.sha256).digest()
    assert base64.urlsafe_b64encode(mac).rstrip(b"=").decode() == signature
    r = await replica.post("/v1/reservations", json={**body, "ifPlan": token})
    assert r.status_code == 201, r.text


@pytest.fixture
async def configured(database_url: str, clean_db: AsyncEngine) -> AsyncIterator[httpx.AsyncClient]:
    """An app with BC_PLAN_TOKEN_SECRET and BC_PLAN_TOKEN_TTL=7."""
    settings = settings_for(database_url, plan_token_secret="s" * 40, plan_token_ttl=7)
    application = create_app(settings, run_migrations=False)
    async with application.router.lifespan_context(application):
        transport = httpx.ASGITransport(app=application)
        headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
        async with httpx.AsyncClient(transport=transport, base_url="http://test", headers=headers) as c:
            yield c


async def test_a_configured_secret_and_ttl_sign_the_token(
    configured: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    pool = await make_pool(configured)
    await add_node(configured, pool, gpu_node("dgx-08", 4))
    token = (await _preview(configured, reservation(pool, 1)))["planToken"]
    payload = payload_of(token)
    issued, expires = datetime.fromisoformat(payload["iat"]), datetime.fromisoformat(payload["exp"])
    assert expires - issued == timedelta(seconds=7)
    assert token == encode(payload, b"s" * 40)
    async with clean_db.connect() as conn:  # nothing stored: the configured secret is the key
        assert (
            await conn.execute(sa.select(sa.func.count()).select_from(plan_token_secrets))
        ).scalar_one() == 0

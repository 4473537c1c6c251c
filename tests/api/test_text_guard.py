"""Text PostgreSQL cannot store (NUL, lone surrogates) is 422 with the field path, never a 500
(found by fuzzing the API with schemathesis)."""

from __future__ import annotations

import json

import httpx

from tests.factories import gpu_node, make_pool


async def test_nul_and_lone_surrogates_are_refused_with_the_path(admin_client: httpx.AsyncClient) -> None:
    raw = '{"job_id": "0", "kind": "local", "state": "running", "scheduler_started_at": "x\\u0000y"}'
    r = await admin_client.put(
        "/v1/placement/jobs/0", content=raw, headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 422 and r.json()["error"]["details"]["path"] == "scheduler_started_at"
    pool = await make_pool(admin_client)
    body = gpu_node("g")
    raw_node = json.dumps({**body, "labels": {"rack": "PLACEHOLDER"}}).replace("PLACEHOLDER", "\\udbf0")
    r2 = await admin_client.post(
        f"/v1/pools/{pool}/nodes", content=raw_node, headers={"Content-Type": "application/json"}
    )
    assert r2.status_code == 422 and r2.json()["error"]["details"]["path"] == "labels.rack"
    assert (await admin_client.get(f"/v1/pools/{pool}/nodes")).json()["items"] == []
    assert (await admin_client.get("/v1/placement/jobs")).json()["jobs"] == []


async def test_a_lone_surrogate_in_a_key_is_422_with_the_key_escaped(admin_client: httpx.AsyncClient) -> None:
    """A key (not a value) holding a lone surrogate: the path and message quote it as its escape, so the
    answer can be written (it was a 500: the error itself could not be encoded). Found by a fresh-user
    run, on every JSON route; a bulk item's key is that item's 422."""
    pool = await make_pool(admin_client)
    bodies = {
        "/v1/reservations": '{"\\ud800": 1}',
        "/v1/capacity/preview": '{"resources": {"\\ud800": 1}}',
        "/v1/pools": '{"name": "p", "\\udbff": 1}',
    }
    for route, raw in bodies.items():
        r = await admin_client.post(route, content=raw, headers={"Content-Type": "application/json"})
        assert r.status_code == 422, (route, r.text)
        assert "\\ud" in r.json()["error"]["details"]["path"], r.text
        assert "lone surrogate" in r.json()["error"]["message"]
    item = '{"items": [{"tenantId": "t", "\\ud800": 1}]}'
    r = await admin_client.post(
        "/v1/reservations/batch", content=item, headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 200 and r.json()["items"][0]["status"] == 422, r.text
    assert r.json()["items"][0]["error"]["details"]["path"] == "items.0.\\ud800"
    assert (await admin_client.get("/v1/reservations")).json()["items"] == []
    assert [p["id"] for p in (await admin_client.get("/v1/pools")).json()["items"]] == [pool]


async def test_a_body_that_is_not_utf8_is_invalid_input(admin_client: httpx.AsyncClient) -> None:
    r = await admin_client.post(
        "/v1/pools", content=b"\xff\xfe{", headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 422 and r.json()["error"]["code"] == "INVALID_INPUT"
    assert r.json()["error"]["details"]["errors"][0]["path"] == ""  # details.errors on every 422
    wrong = await admin_client.request("TRACE", "/healthz")
    assert wrong.status_code == 405 and "GET" in wrong.headers.get("allow", "")


async def test_a_key_named_twice_is_refused_on_every_route(admin_client: httpx.AsyncClient) -> None:
    pool = await make_pool(admin_client)
    raw = (
        '{"tenantId": "victim", "poolId": "' + pool + '", "devices": [{"class": "gpu", "count": 1}], '
        '"duration": "1h", "idempotencyKey": "dup", "tenantId": "demo"}'
    )
    r = await admin_client.post("/v1/reservations", content=raw, headers={"Content-Type": "application/json"})
    assert r.status_code == 422 and r.json()["error"]["details"]["path"] == "tenantId"
    assert (await admin_client.get("/v1/reservations")).json()["items"] == []
    body = gpu_node("d1", 2)
    body["devices"][1]["id"] = body["devices"][0]["id"]
    dup = await admin_client.post(f"/v1/pools/{pool}/nodes", json=body)
    assert dup.status_code == 422 and dup.json()["error"]["details"]["path"] == "devices"
    empty = await admin_client.post(
        "/v1/reservations", content=b"", headers={"Content-Type": "application/json"}
    )
    assert empty.status_code == 422 and empty.json()["error"]["message"] == "a JSON body is required"
    age = await admin_client.post("/v1/placement/explain", json={"fleet": {}, "request": {}, "maxAge": True})
    assert age.status_code == 422 and age.json()["error"]["details"]["path"] == "maxAge"


async def test_a_body_that_is_not_a_json_object_says_what_to_send(admin_client: httpx.AsyncClient) -> None:
    pool = await make_pool(admin_client)
    body = json.dumps({"tenantId": "t", "poolId": pool, "devices": [], "idempotencyKey": "k"})
    form = await admin_client.post(
        "/v1/reservations", content=body, headers={"Content-Type": "application/x-www-form-urlencoded"}
    )
    error = form.json()["error"]
    assert form.status_code == 422 and error["details"]["path"] == ""
    assert error["message"] == (
        "the body must be a JSON object sent as Content-Type: application/json "
        "(it was application/x-www-form-urlencoded)"
    )
    listed = await admin_client.post("/v1/reservations", json=[])
    assert listed.status_code == 422 and listed.json()["error"]["message"] == "the body must be a JSON object"
    assert (await admin_client.get("/v1/reservations")).json()["items"] == []

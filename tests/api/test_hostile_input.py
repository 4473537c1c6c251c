"""Hostile input answers 4xx, never 5xx, and changes nothing (issue 9): NUL in every path and query
parameter of every operation, windows outside years 1970..9999, deep JSON nesting (also on body-less
routes and without a key), body limits for Content-Length and chunked bodies, label and taint bounds,
and error messages that quote at most 200 characters of any input."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.api.guard import nesting_exceeds
from app.errors import QUOTE_LIMIT
from tests.factories import add_node, gpu_node, make_pool, reservation

ROOT = Path(__file__).resolve().parents[2]
MIB = 1024 * 1024


def operations() -> list[tuple[str, str, list[dict[str, Any]]]]:
    document = json.loads((ROOT / "openapi" / "openapi.json").read_text())
    return [
        (method.upper(), path, op.get("parameters", []))
        for path, item in document["paths"].items()
        for method, op in item.items()
    ]


def _deep(levels: int) -> str:
    return "[" * levels + "]" * levels


@pytest.fixture
async def pool(admin_client: httpx.AsyncClient) -> str:
    pool_id = await make_pool(admin_client, "hostile")
    await add_node(admin_client, pool_id, gpu_node("h1", 4))
    r = await admin_client.put(f"/v1/tenants/acme/quotas/{pool_id}", json={"limits": {"gpu": 4}})
    assert r.status_code == 200, r.text
    return pool_id


async def test_nul_in_every_path_and_query_parameter(admin_client: httpx.AsyncClient, pool: str) -> None:
    """Driven by the OpenAPI document: each path parameter in turn is ``%00`` (the others real ids), then
    each query parameter; the answer is 404 or 422, never a 5xx."""
    node = (await admin_client.get(f"/v1/pools/{pool}/nodes")).json()["items"][0]["id"]
    real = {"pool_id": pool, "node_id": node, "tenant_id": "acme", "reservation_id": "r", "key_id": "k"}
    real["job_id"] = "j"
    sent = 0
    for method, path, parameters in operations():
        in_path = [p["name"] for p in parameters if p["in"] == "path"]
        in_query = [p["name"] for p in parameters if p["in"] == "query"]
        for name in in_path:
            url = path
            for other in in_path:
                url = url.replace("{" + other + "}", "%00" if other == name else real.get(other, "x"))
            r = await admin_client.request(method, url)
            assert r.status_code in (404, 422), (method, url, r.status_code, r.text)
            sent += 1
        for name in in_query:
            url = path
            for other in in_path:
                url = url.replace("{" + other + "}", real.get(other, "x"))
            r = await admin_client.request(method, f"{url}?{name}=a%00b")
            assert r.status_code == 422 and r.json()["error"]["details"]["path"] == name, (
                method,
                url,
                r.text,
            )
            sent += 1
    assert sent >= 20  # the document has that many parameters: the loop really ran


@pytest.mark.parametrize("route", ["/v1/reservations", "/v1/capacity/preview"])
@pytest.mark.parametrize(
    ("start", "duration", "field"),
    [
        ("9999-12-31T00:00:00Z", "1d", "duration"),  # the window ends in year 10000
        ("9999-12-31T23:00:00-05:00", 60, "start"),  # 10000-01-01 in UTC
        ("1969-12-31T23:59:59Z", 60, "start"),
        ("0001-01-01T00:00:00+01:00", 60, "start"),  # before year 1 in UTC
    ],
)
async def test_windows_outside_years_1970_to_9999_are_invalid(
    admin_client: httpx.AsyncClient, pool: str, route: str, start: str, duration: Any, field: str
) -> None:
    r = await admin_client.post(route, json=reservation(pool, 1, start=start, duration=duration))
    assert r.status_code == 422, r.text
    assert r.json()["error"]["details"]["path"] == field
    listed = await admin_client.get("/v1/reservations?tenantId=acme")
    assert listed.json()["items"] == []


@pytest.mark.parametrize("route", ["/v1/reservations", "/v1/capacity/preview"])
@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"duration": True}, "duration"),
        ({"spot": "yes"}, "spot"),
        ({"resources": {"cpu": "8"}}, "resources.cpu"),
        ({"resources": {"cpu": True}}, "resources.cpu"),
    ],
    ids=["duration-true", "spot-text", "amount-text", "amount-true"],
)
async def test_a_value_of_the_wrong_json_type_is_refused(
    admin_client: httpx.AsyncClient, pool: str, route: str, change: dict[str, Any], field: str
) -> None:
    """Lax coercion read ``"duration": true`` as 1 second, ``"spot": "yes"`` as true and ``"8"`` as 8 cpu
    (found by a fresh-user run): the request's types are JSON's."""
    r = await admin_client.post(route, json={**reservation(pool, 1), **change})
    assert r.status_code == 422, r.text
    assert r.json()["error"]["details"]["path"] == field
    listed = await admin_client.get("/v1/reservations?tenantId=acme")
    assert listed.json()["items"] == []


@pytest.mark.parametrize("with_key", [False, True])
@pytest.mark.parametrize(
    "route",
    ["/nodes/{node}/cordon", "/nodes/{node}/uncordon", "/pools/{pool}/archive", "/reservations/r1/release"],
)
async def test_deep_nesting_on_body_less_routes(
    admin_client: httpx.AsyncClient, anon_client: httpx.AsyncClient, pool: str, route: str, with_key: bool
) -> None:
    node = (await admin_client.get(f"/v1/pools/{pool}/nodes")).json()["items"][0]["id"]
    client = admin_client if with_key else anon_client
    url = "/v1" + route.format(node=node, pool=pool)
    r = await client.post(url, content=_deep(1000), headers={"Content-Type": "application/json"})
    assert r.status_code == (422 if with_key else 401), r.text
    pool_view = (await admin_client.get(f"/v1/pools/{pool}")).json()
    assert pool_view.get("archived") in (False, None), pool_view
    assert (await admin_client.get(f"/v1/nodes/{node}")).json()["cordoned"] is False


async def test_deep_nesting_in_a_body_is_refused_before_parsing(
    admin_client: httpx.AsyncClient, pool: str
) -> None:
    body = json.dumps(reservation(pool, 1))[:-1] + ', "x": ' + _deep(100_000) + "}"
    r = await admin_client.post(
        "/v1/reservations", content=body, headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 422 and "deeper than 64" in r.json()["error"]["message"], r.text
    ok = json.dumps(reservation(pool, 1, idempotencyKey="nest", resources={}))
    r = await admin_client.post("/v1/reservations", content=ok, headers={"Content-Type": "application/json"})
    assert r.status_code == 201, r.text


@pytest.mark.parametrize(
    ("body", "limit", "over"),
    [
        (b'{"a": "[[[["}', 2, False),  # brackets inside strings do not count
        (b'{"a": "\\"[[[["}', 2, False),  # nor after an escaped quote
        (b"[[[]]]", 3, False),
        (b"[[[[]]]]", 3, True),
        (b'[{"a": [{}]}]', 3, True),
        (b"[" * 65 + b"]" * 65, 64, True),
    ],
)
def test_nesting_depth_scan(body: bytes, limit: int, over: bool) -> None:
    assert nesting_exceeds(body, limit) is over


async def test_a_body_over_the_limit_is_413_for_content_length_and_chunked(
    admin_client: httpx.AsyncClient, pool: str
) -> None:
    big = b'{"name": "' + b"x" * (MIB + 10) + b'"}'
    r = await admin_client.post(f"/v1/pools/{pool}/nodes", content=big)
    assert r.status_code == 413 and r.json()["error"]["code"] == "PAYLOAD_TOO_LARGE", r.text

    sent = 0

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: Transfer-Encoding chunked
        nonlocal sent
        for _ in range(64):
            sent += 64 * 1024
            yield b" " * (64 * 1024)

    r = await admin_client.post(f"/v1/pools/{pool}/nodes", content=chunks())
    assert r.status_code == 413, r.text
    assert sent <= MIB + 2 * 64 * 1024  # not read past the limit (one chunk beyond it at most)
    nodes = (await admin_client.get(f"/v1/pools/{pool}/nodes")).json()["items"]
    assert [n["name"] for n in nodes] == ["h1"]


async def test_node_import_has_its_own_larger_limit(admin_client: httpx.AsyncClient, pool: str) -> None:
    topo = (ROOT / "tests" / "data" / "topo" / "01-dgx1-v100-hybrid-cube-mesh-mlx5.txt").read_text()
    padded = topo + "\n" * (2 * MIB)  # 2 MiB: over BC_MAX_BODY_BYTES, under the import limit
    r = await admin_client.post(f"/v1/pools/{pool}/nodes/import", json={"name": "dgx", "topo": topo})
    assert r.status_code == 201, r.text
    r = await admin_client.post(f"/v1/pools/{pool}/nodes/import", json={"name": "dgx2", "topo": padded})
    assert r.status_code != 413, r.text
    r = await admin_client.post(f"/v1/pools/{pool}/nodes", json={**gpu_node("n2", 1), "pad": " " * 2 * MIB})
    assert r.status_code == 413, r.text


async def test_label_and_taint_bounds(admin_client: httpx.AsyncClient, pool: str) -> None:
    node = (await admin_client.get(f"/v1/pools/{pool}/nodes")).json()["items"][0]["id"]
    cases = [
        ({"labels": {f"k{i}": "v" for i in range(257)}}, "labels"),
        ({"labels": {"k": "v" * 64}}, "labels.k"),
        ({"labels": {"n" * 64: "v"}}, "labels." + "n" * 64),
        ({"labels": {"p" * 254 + "/name": "v"}}, "labels." + "p" * 200 + "...(259 characters)"),  # clipped
    ]
    for body, path in cases:
        r = await admin_client.put(f"/v1/nodes/{node}/labels", json=body)
        assert r.status_code == 422 and r.json()["error"]["details"]["path"].startswith(path), r.text
    fine = {"example.com/" + "p" * 200 + "/rack": "r" * 63, **{f"k{i}": "v" for i in range(255)}}
    assert (await admin_client.put(f"/v1/nodes/{node}/labels", json={"labels": fine})).status_code == 200
    taints = [{"key": f"t{i}", "value": "x"} for i in range(65)]
    r = await admin_client.put(f"/v1/nodes/{node}/taints", json={"taints": taints})
    assert r.status_code == 422, r.text
    r = await admin_client.post(
        f"/v1/pools/{pool}/nodes", json=gpu_node("many", 1, labels={f"k{i}": "v" for i in range(300)})
    )
    assert r.status_code == 422, r.text
    view = (await admin_client.get(f"/v1/nodes/{node}")).json()
    assert len(view["labels"]) == 256 and view["taints"] == []


async def test_a_node_with_100000_labels_is_refused(admin_client: httpx.AsyncClient, pool: str) -> None:
    labels = {f"label-{i}": "value" for i in range(100_000)}
    r = await admin_client.post(f"/v1/pools/{pool}/nodes", json=gpu_node("huge", 1, labels=labels))
    assert r.status_code in (413, 422), r.text


async def test_errors_quote_at_most_200_characters_of_input(
    admin_client: httpx.AsyncClient, pool: str
) -> None:
    long_id = "x" * 60_000  # httpx refuses longer URLs
    answers = [
        await admin_client.get(f"/v1/nodes/{long_id}"),
        await admin_client.get(f"/v1/pools/{long_id}"),
        await admin_client.get(f"/v1/reservations/{long_id}"),
        await admin_client.put(f"/v1/nodes/{long_id}/labels", json={"labels": {"a" + long_id: "v"}}),
        await admin_client.post("/v1/reservations", json=reservation(pool, 1, **{"y" * 300_000: 1})),
    ]
    for r in answers:
        assert 400 <= r.status_code < 500, r.text[:500]
        assert "x" * (QUOTE_LIMIT + 1) not in r.text and "y" * (QUOTE_LIMIT + 1) not in r.text, r.text[:500]
        assert len(r.text) < 4000, len(r.text)

"""Lists page: ``limit`` and ``cursor`` in, ``items`` and ``nextCursor`` out, in a stable order; a cursor
this API did not issue for the list is 422 naming ``cursor`` (issue 10, "Lists page")."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from app.api.paging import encode_cursor
from tests.factories import add_node, gpu_node, make_pool, reservation


async def _walk(client: httpx.AsyncClient, url: str, limit: int, **params: Any) -> list[list[str]]:
    pages, cursor = [], None
    while True:
        query = {**params, "limit": limit, **({"cursor": cursor} if cursor else {})}
        r = await client.get(url, params=query)
        assert r.status_code == 200, r.text
        body = r.json()
        assert set(body) == {"items", "nextCursor"}
        pages.append([item["id"] for item in body["items"]])
        cursor = body["nextCursor"]
        if cursor is None:
            return pages


async def test_reservations_page_newest_first_without_repeats(admin_client: httpx.AsyncClient) -> None:
    pool = await make_pool(admin_client)
    await add_node(admin_client, pool, gpu_node("page-a", 8))
    made = []
    for i in range(5):
        r = await admin_client.post("/v1/reservations", json=reservation(pool, 1, key=f"page-{i}"))
        made.append(r.json()["id"])
    pages = await _walk(admin_client, "/v1/reservations", 2, tenantId="acme")
    assert [len(p) for p in pages] == [2, 2, 1]
    assert [i for page in pages for i in page] == list(reversed(made))  # newest first
    whole = (await admin_client.get("/v1/reservations", params={"limit": 10})).json()
    assert [r["id"] for r in whole["items"]] == list(reversed(made)) and whole["nextCursor"] is None
    # a reservation made between pages does not shift the next page (keyset, not offset)
    first = (await admin_client.get("/v1/reservations", params={"limit": 2})).json()
    await admin_client.post("/v1/reservations", json=reservation(pool, 1, key="page-late"))
    second = await admin_client.get("/v1/reservations", params={"limit": 2, "cursor": first["nextCursor"]})
    assert [r["id"] for r in second.json()["items"]] == list(reversed(made))[2:4]
    placed = await _walk(admin_client, "/v1/reservations", 4, status="placed")
    assert len([i for page in placed for i in page]) == 6


async def test_pools_and_nodes_page(admin_client: httpx.AsyncClient) -> None:
    pools = [await make_pool(admin_client) for _ in range(3)]
    assert [i for page in await _walk(admin_client, "/v1/pools", 2) for i in page] == pools
    nodes = [(await add_node(admin_client, pools[0], gpu_node(f"pn{i}", 1)))["id"] for i in range(3)]
    walked = await _walk(admin_client, f"/v1/pools/{pools[0]}/nodes", 1)
    assert [i for page in walked for i in page] == sorted(nodes) and len(walked) == 3


RESERVATION_CURSOR = encode_cursor("reservations", "2026-01-01T00:00:00+00:00", "res_x")


@pytest.mark.parametrize(
    ("listed", "cursor"),
    [
        ("reservations", "not-base64!"),
        ("reservations", "bm90IGpzb24"),  # base64 of "not json"
        ("reservations", encode_cursor("pools", "2026-01-01T00:00:00+00:00", "pool_x")),  # another list's
        ("reservations", encode_cursor("reservations", "yesterday", "res_x")),
        ("reservations", encode_cursor("reservations", "2026-01-01T00:00:00", "res_x")),  # no offset
        ("reservations", encode_cursor("reservations", "only-one-part")),
        ("pools", RESERVATION_CURSOR),
        ("pools", encode_cursor("pools", "2026-13-01T00:00:00+00:00", "pool_x")),
        ("nodes", RESERVATION_CURSOR),
        ("nodes", "bm9kZXM"),
        # forged contents that once reached PostgreSQL and answered 500: unstorable text, a time with
        # no UTC equivalent, a part that is not a string
        ("reservations", encode_cursor("reservations", "2026-12-01T15:37:32+00:00", "a\u0000b")),
        ("reservations", encode_cursor("reservations", "2026-12-01T15:37:32+00:00", "\ud800")),
        ("reservations", encode_cursor("reservations", "0001-01-01T00:00:00+01:00", "res_x")),
        ("nodes", encode_cursor("nodes", "\u0000")),
        ("nodes", encode_cursor("nodes", "\ud800")),
        ("nodes", "WyJub2RlcyIsMV0"),  # base64 of ["nodes",1]
        ("pools", encode_cursor("pools", "2026-01-01T00:00:00+00:00", "\u0000")),
    ],
)
async def test_a_cursor_not_issued_for_the_list_is_422_naming_cursor(
    admin_client: httpx.AsyncClient, listed: str, cursor: str
) -> None:
    pool = await make_pool(admin_client)
    url = {"reservations": "/v1/reservations", "pools": "/v1/pools", "nodes": f"/v1/pools/{pool}/nodes"}
    r = await admin_client.get(url[listed], params={"cursor": cursor})
    assert r.status_code == 422, r.text
    assert r.json()["error"]["details"]["path"] == "cursor"
    assert r.json()["error"]["message"].startswith("cursor: ")

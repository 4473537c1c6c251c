"""A key without the route's grant is refused before its body is read (docs/api.md, "Limits"; the
request guard's step 4, app/api/route_grants.py). Counted in bytes: each request's body is a stream the
test hands out chunk by chunk, and the test counts the chunks the service pulled. Before, the guard read
the whole body (up to 24 MiB for an import) and the route parsed it, and only then refused."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi.routing import iter_route_contexts

from app.api.route_grants import NOT_DECLARED, ROUTE_GRANTS
from app.iam.authorize import ACTIONS
from tests.api.test_authorization import TABLE, World, build_world

pytestmark = pytest.mark.slow  # a long module: it starts early in a parallel run (tests/conftest.py)

CHUNK = 64 * 1024
CHUNKS = 12  # 768 KiB: under every route's body limit


class CountedBody:
    """A request body of ``json`` padded with spaces to ``CHUNKS`` chunks; ``pulled`` counts the chunks
    the service asked for."""

    def __init__(self, body: dict[str, Any] | None) -> None:
        text = json.dumps(body if body is not None else {}).encode()
        self.data = text + b" " * (CHUNK * CHUNKS - len(text))
        self.pulled = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for start in range(0, len(self.data), CHUNK):
            self.pulled += 1
            yield self.data[start : start + CHUNK]


@pytest.fixture
async def world(admin_client: httpx.AsyncClient) -> World:
    return await build_world(admin_client)


async def _send(client_for: Any, key: str, method: str, path: str, body: CountedBody) -> httpx.Response:
    async with client_for(key) as c:
        return await c.request(method, path, content=body, headers={"content-type": "application/json"})


def test_every_route_that_takes_a_body_declares_its_grant(app: Any) -> None:
    routes = {
        (method, r.path_format)
        for r in iter_route_contexts(app.routes)
        for method in (r.methods or ())
        if method not in ("GET", "HEAD")
    }
    assert routes == ROUTE_GRANTS.keys() | NOT_DECLARED.keys()
    assert not ROUTE_GRANTS.keys() & NOT_DECLARED.keys()


@pytest.mark.parametrize("operation", sorted(ROUTE_GRANTS), ids=lambda op: f"{op[0]} {op[1]}")
async def test_a_key_without_the_grant_is_refused_before_the_body(
    operation: tuple[str, str], world: World, client_for: Any
) -> None:
    method, _ = operation
    action = ROUTE_GRANTS[operation].action
    path, body = await TABLE[operation][0](world)
    # a rich key: every other action, on every resource
    _, lacking = await world.new_key(None, [{"action": a, "resource": "*"} for a in ACTIONS if a != action])
    refused = CountedBody(body)
    r = await _send(client_for, lacking, method, path, refused)
    assert r.status_code == 403, r.text
    assert r.json()["error"]["details"]["action"] == action
    assert refused.pulled == 0  # not a byte of the body was read
    # the same request from a key that holds only this action: the route reads the body, and any 403 it
    # answers names the declared action (the declaration is the route's own grant)
    _, holding = await world.new_key(None, [{"action": action, "resource": "*"}])
    read = CountedBody(body)
    r = await _send(client_for, holding, method, path, read)
    assert read.pulled == CHUNKS, r.text
    if r.status_code == 403:
        assert r.json()["error"]["details"]["action"] == action, r.text


@pytest.mark.parametrize(
    "operation",
    [op for op, grant in sorted(ROUTE_GRANTS.items()) if grant.resource and grant.resource != "*"],
    ids=lambda op: f"{op[0]} {op[1]}",
)
async def test_a_grant_on_another_pool_is_refused_before_the_body(
    operation: tuple[str, str], world: World, client_for: Any
) -> None:
    method, _ = operation
    action = ROUTE_GRANTS[operation].action
    path, body = await TABLE[operation][0](world)
    _, elsewhere = await world.new_key(None, [{"action": action, "resource": "pool:another"}])
    refused = CountedBody(body)
    r = await _send(client_for, elsewhere, method, path, refused)
    assert r.status_code == 403, r.text
    assert r.json()["error"]["details"] == {"action": action, "resource": f"pool:{world.pool}"}
    assert refused.pulled == 0


async def test_a_trailing_slash_does_not_get_the_body_read(world: World, client_for: Any) -> None:
    """The router would redirect ``.../nodes/import/``, after the guard had read its body."""
    _, reader = await world.new_key(None, [{"action": "compute:inventory:read", "resource": "*"}])
    refused = CountedBody({"name": "x", "topo": "x"})
    r = await _send(client_for, reader, "POST", f"/v1/pools/{world.pool}/nodes/import/", refused)
    assert r.status_code == 403, r.text
    assert refused.pulled == 0

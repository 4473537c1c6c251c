"""The authorization table (issue 9): every operation of ``openapi/openapi.json`` against an admin key, a
tenant-A key, a tenant-B key, a key with no grant and no key, each with its expected status.

Rows are keyed by ``(METHOD, path template)``; an operation in the document without a row (or a row
without an operation) fails :func:`test_every_operation_has_a_row`. Each request targets tenant A's
objects (its reservation, its quota, a key of tenant A), so tenant B's column shows the escapes refused:
preview or reserve as another tenant 403, another tenant's quota 403, another tenant's reservation or key
404. Escalation and pool listing have their own tests below.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.tables import principals
from tests.conftest import ADMIN_KEY
from tests.factories import add_node, gpu_node, make_pool, reservation

pytestmark = pytest.mark.slow  # a long module: it starts early in a parallel run (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
WHO = ("anonymous", "no_grant", "tenant_b", "tenant_a", "admin")  # the order requests are sent in
A, B = "tenant-a", "tenant-b"
_fresh = itertools.count()


def tenant_grants(tenant: str, pool: str) -> list[dict[str, str]]:
    """A typical tenant key: reserve and read its work in the pool, preview, set quota in the pool,
    read the pool's inventory, and mint keys for its tenant."""
    pairs = [
        ("compute:capacity:read", f"pool:{pool}"),
        ("compute:reservations:*", f"pool:{pool}"),
        ("compute:reservations:*", f"tenant:{tenant}"),
        ("compute:quota:write", f"pool:{pool}"),
        ("compute:inventory:read", f"pool:{pool}"),
        ("compute:iam:admin", f"tenant:{tenant}"),
    ]
    return [{"action": a, "resource": r} for a, r in pairs]


@dataclass
class World:
    """A pool with one node, keys for every column, quota and one reservation per tenant."""

    admin: httpx.AsyncClient
    pool: str
    node: str
    reservation_a: str
    keys: dict[str, str | None]

    async def new_key(self, tenant: str | None, grants: list[dict[str, str]]) -> tuple[str, str]:
        """A new key (by the admin): ``(id, key)``."""
        r = await self.admin.post(
            "/v1/api-keys", json={"principal": f"p{next(_fresh)}", "tenantId": tenant, "grants": grants}
        )
        assert r.status_code == 201, r.text
        return r.json()["id"], r.json()["key"]


async def build_world(admin: httpx.AsyncClient) -> World:
    pool = await make_pool(admin, "authz")
    node = (await add_node(admin, pool, gpu_node("n1", 8)))["id"]
    world = World(admin, pool, node, "", {"anonymous": None, "admin": ADMIN_KEY})
    world.keys["tenant_a"] = (await world.new_key(A, tenant_grants(A, pool)))[1]
    world.keys["tenant_b"] = (await world.new_key(B, tenant_grants(B, pool)))[1]
    world.keys["no_grant"] = (await world.new_key(None, []))[1]
    for tenant in (A, B):
        r = await admin.put(f"/v1/tenants/{tenant}/quotas/{pool}", json={"limits": {"gpu": 8}})
        assert r.status_code == 200, r.text
    r = await admin.post("/v1/reservations", json=reservation(pool, 1, tenant=A))
    assert r.status_code == 201, r.text
    world.reservation_a = r.json()["id"]
    return world


Call = tuple[str, dict[str, Any] | None]  # (path with ids, JSON body or None)
Builder = Callable[[World], Awaitable[Call]]


def fixed(path: str, body: dict[str, Any] | None = None) -> Builder:
    """A request whose path may name ``{pool}``, ``{node}``, ``{reservation_a}``."""

    async def build(w: World) -> Call:
        return path.format(pool=w.pool, node=w.node, reservation_a=w.reservation_a), body

    return build


def with_world(make: Callable[[World], Call]) -> Builder:
    async def build(w: World) -> Call:
        return make(w)

    return build


async def _revoke_a_key_of_tenant_a(w: World) -> Call:
    key_id, _ = await w.new_key(A, [])  # a fresh victim for every column
    return f"/v1/api-keys/{key_id}", None


def _hello(w: World) -> dict[str, Any]:
    return {"poolId": w.pool, "name": f"agent-host-{next(_fresh)}", "topo": TOPO}


async def _heartbeat_of_an_agent_node(w: World) -> Call:
    r = await w.admin.post("/v1/nodes/hello", json=_hello(w))  # a node that sent Hello, for every column
    assert r.status_code == 200, r.text
    # one that changes something (a device turns unhealthy), so its success is an audited change too
    # (tests/api/test_audit.py; one that changes nothing writes no audit row)
    unhealthy = {"id": r.json()["devices"][0]["id"], "healthy": False, "reason": "xid 79"}
    return f"/v1/nodes/{r.json()['nodeId']}/heartbeat", {"devices": [unhealthy]}


async def _extend_reservation_a(w: World) -> Call:
    r = await w.admin.get(f"/v1/reservations/{w.reservation_a}")  # its end now, for every column
    assert r.status_code == 200, r.text
    end = max(datetime.fromisoformat(a["end"]) for a in r.json()["allocations"]) + timedelta(hours=1)
    return f"/v1/reservations/{w.reservation_a}/extend", {"end": end.isoformat()}


async def _delete_a_fresh_node(w: World) -> Call:
    node = await add_node(w.admin, w.pool, gpu_node(f"gone{next(_fresh)}", 2))  # one per column
    return f"/v1/nodes/{node['id']}", None


def _doc(name: str) -> dict[str, Any]:
    return json.loads((DATA / "explain" / name).read_text())


JOB = {"job_id": "job-1", "kind": "local", "target": "workstation", "state": "succeeded"}
HISTORY = {"schema_name": "vq.job-history/1", "jobs": []}
TOPO = (DATA / "topo" / "01-dgx1-v100-hybrid-cube-mesh-mlx5.txt").read_text()

OPEN = dict.fromkeys(WHO, 200)
ADMIN_ONLY = {"anonymous": 401, "no_grant": 403, "tenant_b": 403, "tenant_a": 403, "admin": 200}
POOL_READERS = {"anonymous": 401, "no_grant": 403, "tenant_b": 200, "tenant_a": 200, "admin": 200}
TENANT_A_ONLY = {"anonymous": 401, "no_grant": 403, "tenant_b": 403, "tenant_a": 200, "admin": 200}
OWNED_BY_A = {"anonymous": 401, "no_grant": 403, "tenant_b": 404, "tenant_a": 200, "admin": 200}


def created(statuses: dict[str, int]) -> dict[str, int]:
    return {who: 201 if s == 200 else s for who, s in statuses.items()}


# (METHOD, path template) -> (request builder, expected status per column)
TABLE: dict[tuple[str, str], tuple[Builder, dict[str, int]]] = {
    ("GET", "/healthz"): (fixed("/healthz"), OPEN),
    ("GET", "/readyz"): (fixed("/readyz"), OPEN),
    ("GET", "/metrics"): (fixed("/metrics"), OPEN),
    # a tenant-A key mints keys for tenant A with grants it holds; tenant B's key cannot mint for A
    ("POST", "/v1/api-keys"): (
        fixed(
            "/v1/api-keys",
            {
                "principal": "ci",
                "tenantId": A,
                "grants": [{"action": "compute:reservations:read", "resource": f"tenant:{A}"}],
            },
        ),
        created(TENANT_A_ONLY),
    ),
    # an admin lists every key, a tenant key (compute:iam:admin on its tenant) its tenant's only
    # (tests/api/test_api_keys.py)
    ("GET", "/v1/api-keys"): (
        fixed("/v1/api-keys"),
        {"anonymous": 401, "no_grant": 403, "tenant_b": 200, "tenant_a": 200, "admin": 200},
    ),
    # the audit log: admin keys only (tenant A's key holds compute:iam:admin on its tenant, not on *)
    ("GET", "/v1/audit"): (fixed("/v1/audit"), ADMIN_ONLY),
    ("DELETE", "/v1/api-keys/{key_id}"): (
        _revoke_a_key_of_tenant_a,
        {"anonymous": 401, "no_grant": 403, "tenant_b": 404, "tenant_a": 204, "admin": 204},
    ),
    # preview as tenant A: tenant B's key holds compute:capacity:read on the pool and is still refused
    ("POST", "/v1/capacity/preview"): (
        with_world(lambda w: ("/v1/capacity/preview", reservation(w.pool, 1, tenant=A))),
        TENANT_A_ONLY,
    ),
    ("GET", "/v1/nodes/{node_id}"): (fixed("/v1/nodes/{node}"), POOL_READERS),
    # agents hold compute:nodes:hello on the pool; the tenant keys (inventory read on it) do not
    ("POST", "/v1/nodes/hello"): (with_world(lambda w: ("/v1/nodes/hello", _hello(w))), ADMIN_ONLY),
    ("POST", "/v1/nodes/{node_id}/heartbeat"): (_heartbeat_of_an_agent_node, ADMIN_ONLY),
    ("POST", "/v1/nodes/{node_id}/cordon"): (fixed("/v1/nodes/{node}/cordon"), ADMIN_ONLY),
    ("POST", "/v1/nodes/{node_id}/uncordon"): (fixed("/v1/nodes/{node}/uncordon"), ADMIN_ONLY),
    ("POST", "/v1/nodes/{node_id}/drain"): (
        fixed("/v1/nodes/{node}/drain", {"reschedule": True}),
        ADMIN_ONLY,
    ),
    ("POST", "/v1/nodes/{node_id}/undrain"): (fixed("/v1/nodes/{node}/undrain"), ADMIN_ONLY),
    # a node that holds nothing, for every column (a busy node is 409: tests/api/test_node_maintenance.py)
    ("DELETE", "/v1/nodes/{node_id}"): (
        _delete_a_fresh_node,
        {"anonymous": 401, "no_grant": 403, "tenant_b": 403, "tenant_a": 403, "admin": 204},
    ),
    ("POST", "/v1/nodes/{node_id}/health"): (fixed("/v1/nodes/{node}/health", {"ready": True}), ADMIN_ONLY),
    ("PUT", "/v1/nodes/{node_id}/labels"): (
        fixed("/v1/nodes/{node}/labels", {"labels": {"rack": "r1"}}),
        ADMIN_ONLY,
    ),
    ("PUT", "/v1/nodes/{node_id}/taints"): (fixed("/v1/nodes/{node}/taints", {"taints": []}), ADMIN_ONLY),
    ("POST", "/v1/placement/explain"): (
        fixed(
            "/v1/placement/explain", {"fleet": _doc("seed-fleet.json"), "request": _doc("seed-request.json")}
        ),
        ADMIN_ONLY,
    ),
    ("POST", "/v1/placement/fleet"): (
        fixed("/v1/placement/fleet", {"base": _doc("seed-fleet.json")}),
        ADMIN_ONLY,
    ),
    ("POST", "/v1/placement/compare"): (
        fixed("/v1/placement/compare", {"fleet": _doc("seed-fleet.json"), "history": HISTORY}),
        ADMIN_ONLY,
    ),
    ("GET", "/v1/placement/jobs"): (fixed("/v1/placement/jobs"), ADMIN_ONLY),
    ("PUT", "/v1/placement/jobs/{job_id}"): (fixed("/v1/placement/jobs/job-1", JOB), ADMIN_ONLY),
    # every key lists pools (only those it holds a grant on: test_pools_are_listed_only_with_a_grant)
    ("GET", "/v1/pools"): (fixed("/v1/pools"), {**OPEN, "anonymous": 401}),
    ("POST", "/v1/pools"): (
        with_world(lambda w: ("/v1/pools", {"name": f"pool-{next(_fresh)}"})),
        created(ADMIN_ONLY),
    ),
    ("GET", "/v1/pools/{pool_id}"): (fixed("/v1/pools/{pool}"), POOL_READERS),
    ("POST", "/v1/pools/{pool_id}/archive"): (fixed("/v1/pools/{pool}/archive"), ADMIN_ONLY),
    ("GET", "/v1/pools/{pool_id}/nodes"): (fixed("/v1/pools/{pool}/nodes"), POOL_READERS),
    # every pool reader; who booked what is shown by tenant (tests/api/test_occupancy.py)
    ("GET", "/v1/pools/{pool_id}/occupancy"): (fixed("/v1/pools/{pool}/occupancy"), POOL_READERS),
    ("POST", "/v1/pools/{pool_id}/nodes"): (
        with_world(lambda w: (f"/v1/pools/{w.pool}/nodes", gpu_node(f"n{next(_fresh)}", 2))),
        created(ADMIN_ONLY),
    ),
    ("POST", "/v1/pools/{pool_id}/nodes/import"): (
        with_world(
            lambda w: (f"/v1/pools/{w.pool}/nodes/import", {"name": f"dgx{next(_fresh)}", "topo": TOPO})
        ),
        created(ADMIN_ONLY),
    ),
    ("GET", "/v1/reservations"): (fixed(f"/v1/reservations?tenantId={A}"), TENANT_A_ONLY),
    ("POST", "/v1/reservations"): (
        with_world(lambda w: ("/v1/reservations", reservation(w.pool, 1, tenant=A))),
        created(TENANT_A_ONLY),
    ),
    # the call is answered 200 for every key; each item is authorized alone (test_batch_items_authorized)
    ("POST", "/v1/reservations/batch"): (
        with_world(lambda w: ("/v1/reservations/batch", {"items": [reservation(w.pool, 1, tenant=A)]})),
        {**OPEN, "anonymous": 401},
    ),
    ("GET", "/v1/reservations/{reservation_id}"): (fixed("/v1/reservations/{reservation_a}"), OWNED_BY_A),
    ("POST", "/v1/reservations/{reservation_id}/release"): (
        fixed("/v1/reservations/{reservation_a}/release"),
        OWNED_BY_A,
    ),
    # tenant A's usage: the rule of GET /v1/reservations (tests/api/test_usage.py: a tenant key's own)
    ("GET", "/v1/usage"): (fixed(f"/v1/usage?tenantId={A}&groupBy=node"), TENANT_A_ONLY),
    # each column that may extends reservation A by another hour (same permission as release)
    ("POST", "/v1/reservations/{reservation_id}/extend"): (_extend_reservation_a, OWNED_BY_A),
    # tenant B's key holds compute:quota:write on the pool and still cannot set tenant A's quota
    ("GET", "/v1/tenants/{tenant_id}/quotas/{pool_id}"): (
        fixed(f"/v1/tenants/{A}/quotas/{{pool}}"),
        TENANT_A_ONLY,
    ),
    ("PUT", "/v1/tenants/{tenant_id}/quotas/{pool_id}"): (
        fixed(f"/v1/tenants/{A}/quotas/{{pool}}", {"limits": {"gpu": 4}}),
        TENANT_A_ONLY,
    ),
}


def documented_operations() -> set[tuple[str, str]]:
    document = json.loads((ROOT / "openapi" / "openapi.json").read_text())
    return {(method.upper(), path) for path, item in document["paths"].items() for method in item}


def test_every_operation_has_a_row() -> None:
    documented = documented_operations()
    assert not documented - TABLE.keys(), (
        f"operations without authorization rows: {sorted(documented - TABLE.keys())}"
    )
    assert not TABLE.keys() - documented, f"rows for no operation: {sorted(TABLE.keys() - documented)}"
    for statuses in (row[1] for row in TABLE.values()):
        assert set(statuses) == set(WHO)


@pytest.fixture
async def world(admin_client: httpx.AsyncClient) -> World:
    return await build_world(admin_client)


@pytest.fixture
async def clients(world: World, client_for: Any) -> AsyncIterator[dict[str, httpx.AsyncClient]]:
    opened = {who: client_for(key) for who, key in world.keys.items()}
    try:
        yield opened
    finally:
        for c in opened.values():
            await c.aclose()


@pytest.mark.parametrize("operation", sorted(TABLE), ids=lambda op: f"{op[0]} {op[1]}")
async def test_authorization_table(
    operation: tuple[str, str], world: World, clients: dict[str, httpx.AsyncClient]
) -> None:
    build, expected = TABLE[operation]
    method = operation[0]
    answers: dict[str, int] = {}
    texts: dict[str, str] = {}
    for who in WHO:
        path, body = await build(world)
        response = await clients[who].request(method, path, json=body)
        answers[who] = response.status_code
        texts[who] = response.text[:300]
    wrong = {who: (answers[who], expected[who], texts[who]) for who in WHO if answers[who] != expected[who]}
    assert not wrong, f"{method} {operation[1]}: (got, expected, body) {wrong}"


async def test_batch_items_are_authorized_one_by_one(
    world: World, clients: dict[str, httpx.AsyncClient]
) -> None:
    """Each item of ``POST /v1/reservations/batch`` is authorized as ``POST /v1/reservations`` would be:
    tenant A's item is created by tenant A's key and the admin, refused (403) for the others."""
    expected = {"no_grant": 403, "tenant_b": 403, "tenant_a": 201, "admin": 201}
    got = {}
    for who in expected:
        r = await clients[who].post(
            "/v1/reservations/batch", json={"items": [reservation(world.pool, 1, tenant=A)]}
        )
        assert r.status_code == 200, r.text
        got[who] = r.json()["items"][0]["status"]
    assert got == expected


async def test_pools_are_listed_only_with_a_grant(
    world: World, clients: dict[str, httpx.AsyncClient]
) -> None:
    other = await make_pool(world.admin, "other")
    listed = {}
    for who in ("no_grant", "tenant_a", "admin"):
        r = await clients[who].get("/v1/pools")
        assert r.status_code == 200, r.text
        listed[who] = {p["id"] for p in r.json()["items"]}
    assert listed == {"no_grant": set(), "tenant_a": {world.pool}, "admin": {world.pool, other}}
    assert (await clients["tenant_a"].get(f"/v1/pools/{other}")).status_code == 403


async def test_a_tenant_key_cannot_escalate(world: World, client_for: Any) -> None:
    """A tenant key holding ``*`` on ``*`` still mints keys only for its tenant, and no key mints a
    grant it does not hold itself; the refused keys do not exist afterwards."""
    _, strong = await world.new_key(A, [{"action": "*", "resource": "*"}])
    _, narrow = await world.new_key(A, tenant_grants(A, world.pool))
    attempts = [
        (strong, {"principal": "x", "grants": [{"action": "*", "resource": "*"}]}),  # untenanted
        (strong, {"principal": "x", "tenantId": B, "grants": []}),  # another tenant
        (narrow, {"principal": "x", "tenantId": A, "grants": [{"action": "*", "resource": "*"}]}),
        (
            narrow,
            {
                "principal": "x",
                "tenantId": A,
                "grants": [{"action": "compute:quota:write", "resource": "pool:*"}],
            },
        ),
        (
            narrow,
            {
                "principal": "x",
                "tenantId": A,
                "grants": [{"action": "compute:inventory:write", "resource": f"pool:{world.pool}"}],
            },
        ),
    ]
    for key, body in attempts:
        async with client_for(key) as c:
            r = await c.post("/v1/api-keys", json=body)
        assert r.status_code == 403 and r.json()["error"]["code"] == "FORBIDDEN", (body, r.text)
    async with client_for(strong) as c:  # within its tenant and grants it may
        r = await c.post(
            "/v1/api-keys",
            json={
                "principal": "ok",
                "tenantId": A,
                "grants": [{"action": "*", "resource": f"pool:{world.pool}"}],
            },
        )
        assert r.status_code == 201, r.text
    async with client_for(r.json()["key"]) as minted:  # the minted key is scoped to tenant A too
        assert (await minted.get(f"/v1/reservations?tenantId={B}")).status_code == 403
    # an admin key minted by an admin is an admin: it may mint untenanted keys
    _, admin2 = await world.new_key(None, [{"action": "compute:iam:admin", "resource": "*"}])
    async with client_for(admin2) as c:
        r = await c.post(
            "/v1/api-keys", json={"principal": "ops", "grants": [{"action": "*", "resource": "*"}]}
        )
        assert r.status_code == 201, r.text


async def test_a_tenant_key_previews_only_as_its_tenant(world: World, client_for: Any) -> None:
    """The escape of issue 9: a tenant-A key with capacity:read on the pool previewed as tenant B and
    saw B's dedicated node; now 403 whatever its grants (also with ``*`` on ``*``)."""
    await add_node(world.admin, world.pool, gpu_node("b-only", 4, taints=[{"key": "dedicated", "value": B}]))
    _, strong = await world.new_key(A, [{"action": "*", "resource": "*"}])
    for key in (world.keys["tenant_a"], strong):
        async with client_for(key) as c:
            r = await c.post("/v1/capacity/preview", json=reservation(world.pool, 4, tenant=B))
            assert r.status_code == 403 and r.json()["error"]["code"] == "FORBIDDEN", r.text
            r = await c.put(f"/v1/tenants/{B}/quotas/{world.pool}", json={"limits": {"gpu": 99}})
            assert r.status_code == 403, r.text
            r = await c.get(f"/v1/reservations?tenantId={B}")
            assert r.status_code == 403, r.text
    quota = await world.admin.get(f"/v1/tenants/{B}/quotas/{world.pool}")
    assert quota.json()["limits"] == {"gpu": 8}, quota.text  # unchanged


async def test_a_refusal_about_tenant_scope_has_one_details_shape(world: World, client_for: Any) -> None:
    """Preview, reserve, list, quota read and write and key minting as another tenant: one 403 shape,
    ``{action, resource, tenantId}`` (the resource refused, the tenant the key acts for)."""
    other = {"resource": f"tenant:{B}", "tenantId": A}
    attempts = [
        ("POST", "/v1/capacity/preview", reservation(world.pool, 1, tenant=B), "compute:capacity:read"),
        ("POST", "/v1/reservations", reservation(world.pool, 1, tenant=B), "compute:reservations:create"),
        ("GET", f"/v1/reservations?tenantId={B}", None, "compute:reservations:read"),
        ("GET", f"/v1/tenants/{B}/quotas/{world.pool}", None, "compute:reservations:read"),
        ("PUT", f"/v1/tenants/{B}/quotas/{world.pool}", {"limits": {"gpu": 1}}, "compute:quota:write"),
        ("POST", "/v1/api-keys", {"principal": "x", "tenantId": B}, "compute:iam:admin"),
    ]
    async with client_for(world.keys["tenant_a"]) as c:
        for method, path, body, action in attempts:
            r = await c.request(method, path, json=body)
            assert r.status_code == 403 and r.json()["error"]["code"] == "FORBIDDEN", (path, r.text)
            assert r.json()["error"]["details"] == {"action": action, **other}, (method, path)
        # without tenant scope in play: the same keys, no tenantId
        r = await c.post("/v1/pools", json={"name": "not-mine"})
        assert r.status_code == 403
        assert r.json()["error"]["details"] == {"action": "compute:inventory:write", "resource": "*"}


@pytest.mark.parametrize(
    ("body", "path"),
    [
        (
            {"principal": "x", "tenantId": A, "grants": [{"action": "compute:nope", "resource": "*"}]},
            "grants.0.action",
        ),
        (
            {"principal": "x", "tenantId": A, "grants": [{"action": "*", "resource": "cluster:1"}]},
            "grants.0.resource",
        ),
        ({"principal": "x", "tenantId": "a b", "grants": []}, "tenantId"),
        ({"principal": "x", "tenantId": "-lead", "grants": []}, "tenantId"),
    ],
)
async def test_a_malformed_key_is_422_for_every_caller_and_mints_nothing(
    world: World, client_for: Any, engine: AsyncEngine, body: dict[str, Any], path: str
) -> None:
    """Grants and the tenant id are input, checked before the escalation check: a tenant key gets the
    same 422 as an admin, not a 403."""
    async with engine.connect() as conn:
        before = (await conn.execute(sa.select(sa.func.count()).select_from(principals))).scalar_one()
    for key in (ADMIN_KEY, world.keys["tenant_a"]):
        async with client_for(key) as c:
            r = await c.post("/v1/api-keys", json=body)
        assert r.status_code == 422 and r.json()["error"]["code"] == "INVALID_INPUT", r.text
        assert r.json()["error"]["details"]["path"] == path, r.text
    async with engine.connect() as conn:
        after = (await conn.execute(sa.select(sa.func.count()).select_from(principals))).scalar_one()
    assert after == before

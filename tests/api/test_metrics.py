"""``/metrics`` after a scripted run: placed, pending, a quota refusal, a lost race (forced as in
tests/capacity/test_lost_races.py), a release (issue 10, "Done when" 5). The process-wide counters are
compared before and after the run; the gauges are counted in PostgreSQL, so they are compared exactly.
A fresh service process shows every known label set at zero and no ``_created`` series."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy.ext.asyncio import AsyncEngine

from app.capacity.commit.lost_races import LOST_RACE_KINDS
from app.capacity.placing.inline import Placed, place_inline
from app.capacity.planning.snapshot import PoolCache
from app.db.engine import create_engine
from app.main import create_app
from app.observability.metrics import FleetGauges, exposition, package_version
from app.placement.model import DeviceRequest, PlacementRequest
from app.placement.options import SchedulerOptions
from tests.api.metrics_text import Samples, parse, value
from tests.capacity.helpers import book, day_after, db_time, make_pool_with_nodes, reservation_row
from tests.conftest import ADMIN_KEY, TABLES, settings_for
from tests.factories import add_node, gpu_node, make_pool, node_body, reservation
from tests.servers import free_port, running_server

RESULTS = ("placed", "pending", "error")
COUNTERS = {
    "bc_placement_attempts_total": [{"result": r, "placer": "inline"} for r in RESULTS],
    "bc_placement_attempt_duration_seconds_count": [{"result": r} for r in RESULTS],
    "bc_plan_duration_seconds_count": [{}],
    "bc_plans_total": [{"path": "shortlist"}, {"path": "exceptions"}, {"path": "full"}],
    "bc_lost_races_total": [{"reason": k} for k in LOST_RACE_KINDS],
    "bc_quota_rejections_total": [{}],
    "bc_plan_token_creates_total": [{"result": r} for r in ("placed", "stale", "invalid")],
    "bc_reservation_extends_total": [{"result": r} for r in ("extended", "conflict", "quota")],
    "bc_reservations_ended_total": [{"reason": r} for r in ("WindowEnded", "WindowPassed", "DeadlinePassed")],
    "bc_http_request_duration_seconds_count": [
        {"route": "/v1/reservations"},
        {"route": "/v1/reservations/{reservation_id}/release"},
        {"route": "unmatched"},
    ],
}


@pytest.fixture
async def fresh_gauges_app(database_url: str, clean_db: AsyncEngine) -> AsyncIterator[Any]:
    """The real app with the fleet gauges counted at every scrape (no reuse window)."""
    application = create_app(settings_for(database_url, metrics_gauge_ttl_seconds=0), run_migrations=False)
    async with application.router.lifespan_context(application):
        yield application


async def _scrape(client: httpx.AsyncClient) -> Samples:
    r = await client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    assert "_created" not in r.text  # no timestamp series that look like counts
    return parse(r.text)


def _delta(before: Samples, after: Samples, name: str, **labels: str) -> float:
    """How far ``name{labels}`` moved; a series with a status code label starts with its first answer."""
    start = (
        before.get((name, frozenset(labels.items())), 0.0)
        if "code" in labels
        else value(before, name, **labels)
    )
    return value(after, name, **labels) - start


async def _lose_one_race(engine: AsyncEngine) -> Placed:
    """One inline placement whose first commit loses its race (another connection books an atom of the
    chosen node between the plan and the commit): it replans and places on the other node."""
    pool, _ = await make_pool_with_nodes(engine, [node_body("lr0", 4), node_body("lr1", 4)])
    start = await db_time(engine)

    async def spoil(attempt: int, candidate: Any) -> None:
        if attempt == 1:
            async with engine.begin() as other:
                await book(other, pool, candidate.node_id, [candidate.atoms[-1]], start, day_after(start))

    request = PlacementRequest(
        tenant_id="acme", pool_id=pool, devices=(DeviceRequest("gpu", 2),), start=start, end=day_after(start)
    )
    async with engine.begin() as conn:
        res = await reservation_row(conn, pool)
        outcome = await place_inline(
            conn, PoolCache(), request, res, SchedulerOptions(), 3, before_commit=spoil
        )
    assert isinstance(outcome, Placed)
    return outcome


async def test_a_scripted_run_moves_each_counter_by_what_happened(
    fresh_gauges_app: Any, clean_db: AsyncEngine
) -> None:
    transport = httpx.ASGITransport(app=fresh_gauges_app)
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    async with httpx.AsyncClient(transport=transport, base_url="http://test", headers=headers) as client:
        pool = await make_pool(client)
        m1 = await add_node(client, pool, gpu_node("m1", 4))
        await add_node(client, pool, gpu_node("m2", 2, cordoned=True))
        capped = await client.put(f"/v1/tenants/capped/quotas/{pool}", json={"limits": {"gpu": 1}})
        assert capped.status_code == 200
        before = await _scrape(client)

        placed = (await client.post("/v1/reservations", json=reservation(pool, 2))).json()
        assert placed["status"] == "placed"
        middle = await _scrape(client)
        # pending in a pool of its own with no nodes: no edge of this run wakes it (the wake's attempts
        # would count with placer="wake", at a time of their own)
        empty = await make_pool(client)
        pending = (await client.post("/v1/reservations", json=reservation(empty, 3))).json()
        assert pending["status"] == "pending"
        refused = await client.post("/v1/reservations", json=reservation(pool, 2, tenant="capped"))
        assert refused.status_code == 409 and refused.json()["error"]["code"] == "QUOTA_EXCEEDED"
        await _lose_one_race(clean_db)
        released = await client.post(f"/v1/reservations/{placed['id']}/release")
        assert released.status_code == 200
        health = {"devices": [{"id": "m1-GPU3", "healthy": False}]}
        assert (await client.post(f"/v1/nodes/{m1['id']}/health", json=health)).status_code == 200
        assert (await client.get("/v1/no-such-route")).status_code == 404
        after = await _scrape(client)

    def moved(name: str, **labels: str) -> float:
        return _delta(before, after, name, **labels)

    # placed: the first reserve and the lost race's replan; pending: the second; the refusal is no result
    assert moved("bc_placement_attempts_total", result="placed", placer="inline") == 2
    assert moved("bc_placement_attempts_total", result="pending", placer="inline") == 1
    assert moved("bc_placement_attempts_total", result="error", placer="inline") == 0
    assert moved("bc_placement_attempt_duration_seconds_count", result="placed") == 2
    assert moved("bc_placement_attempt_duration_seconds_count", result="pending") == 1
    assert moved("bc_quota_rejections_total") == 1
    assert moved("bc_lost_races_total", reason="atom_booked") == 1
    for kind in ("not_schedulable", "atom_unhealthy", "scalar_ran_out"):
        assert moved("bc_lost_races_total", reason=kind) == 0
    # plans: placed 1, pending 1, refused 1 (the refusal comes after its plan), the lost race 2
    assert moved("bc_plan_duration_seconds_count") == 5
    assert sum(moved("bc_plans_total", path=p) for p in ("shortlist", "exceptions", "full")) == 5
    # HTTP: by route template, never the raw path
    assert moved("bc_http_requests_total", route="/v1/reservations", method="POST", code="201") == 2
    assert moved("bc_http_requests_total", route="/v1/reservations", method="POST", code="409") == 1
    release = "/v1/reservations/{reservation_id}/release"
    assert moved("bc_http_requests_total", route=release, method="POST", code="200") == 1
    assert moved("bc_http_requests_total", route="unmatched", method="GET", code="404") == 1
    assert moved("bc_http_request_duration_seconds_count", route="/v1/reservations") == 3
    assert not any(placed["id"] in str(labels) for _, labels in after)  # no reservation ids in labels
    assert not any("capped" in str(labels) for _, labels in after)  # nor tenant ids
    # the gauges, counted in PostgreSQL: two placed GPUs on m1 mid-run; at the end one released
    # reservation (and one pending in the empty pool), m1's GPU3 unhealthy, the cordoned m2 unschedulable
    assert value(middle, "bc_atoms", pool=pool, **{"class": "gpu"}, state="booked") == 2
    assert value(middle, "bc_atoms", pool=pool, **{"class": "gpu"}, state="free") == 2
    assert value(middle, "bc_reservations", pool=pool, status="placed") == 1
    states = ("free", "booked", "unhealthy", "unschedulable")
    atoms = {s: value(after, "bc_atoms", pool=pool, **{"class": "gpu"}, state=s) for s in states}
    assert atoms == {"free": 3, "booked": 0, "unhealthy": 1, "unschedulable": 2}
    statuses = {
        s: value(after, "bc_reservations", pool=pool, status=s)
        for s in ("queued", "pending", "placed", "released", "preempted", "ended")
    }
    assert statuses == {"queued": 0, "pending": 0, "placed": 0, "released": 1, "preempted": 0, "ended": 0}
    assert value(after, "bc_reservations", pool=empty, status="pending") == 1


@pytest.fixture(scope="module")
def fresh_server(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A new service process on empty tables: nothing has happened in it yet (its first wake sweep finds
    no pending reservation left by other tests)."""

    async def empty_tables() -> None:
        eng = create_engine(database_url)
        async with eng.begin() as conn:
            await conn.exec_driver_sql(f"TRUNCATE {TABLES} RESTART IDENTITY CASCADE")
        await eng.dispose()

    asyncio.run(empty_tables())
    with pytest.MonkeyPatch.context() as env:
        env.setenv("BC_METRICS_GAUGE_TTL_SECONDS", "0")
        with running_server(database_url, tmp_path_factory.mktemp("fresh-metrics")) as server:
            yield server


def test_a_fresh_process_starts_every_known_label_set_at_zero(fresh_server: Any) -> None:
    r = httpx.get(fresh_server.url + "/metrics", timeout=10)
    assert r.status_code == 200
    samples = parse(r.text)
    assert not [name for name, _ in samples if name.endswith("_created")]
    for name, label_sets in COUNTERS.items():
        for labels in label_sets:
            assert value(samples, name, **labels) == 0, (name, labels)
    assert value(samples, "bc_build_info", version=package_version()) == 1
    buckets = sorted(
        float(dict(labels)["le"])
        for name, labels in samples
        if name == "bc_placement_attempt_duration_seconds_bucket" and dict(labels)["result"] == "placed"
    )
    assert buckets[0] == 0.001 and buckets[-2] == 16.384 and buckets[-1] == float("inf")
    assert len(buckets) == 16  # 1 ms doubling to 16.384 s, then +Inf


def test_metrics_module_is_the_one_home_of_metric_names() -> None:
    app_dir = Path(__file__).resolve().parents[2] / "app"
    definition = re.compile(r"(Counter|Histogram|Gauge|Info|Summary|MetricFamily)\(\s*\"bc_")
    defining = [
        str(p.relative_to(app_dir)) for p in app_dir.rglob("*.py") if definition.search(p.read_text())
    ]
    assert defining == ["observability/metrics.py"]


async def test_a_gpu_split_into_mig_slices_is_not_an_atom(fresh_gauges_app: Any) -> None:
    transport = httpx.ASGITransport(app=fresh_gauges_app)
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    async with httpx.AsyncClient(transport=transport, base_url="http://test", headers=headers) as client:
        pool = await make_pool(client)
        node = gpu_node("mig-host", 1)
        node["devices"][0]["bookable"] = False  # the GPU is split: its slices are the atoms
        parent = node["devices"][0]["id"]
        node["devices"] += [
            {"id": f"MIG-{i}", "class": "mig-1g.10gb", "parent": parent, "numaNode": 0} for i in range(3)
        ]
        await add_node(client, pool, node)
        placed = (
            await client.post(
                "/v1/reservations",
                json={**reservation(pool, 0), "devices": [{"class": "mig-1g.10gb", "count": 1}]},
            )
        ).json()
        assert placed["status"] == "placed", placed
        samples = await _scrape(client)
    gauges = {
        (dict(labels)["class"], dict(labels)["state"]): v
        for (name, labels), v in samples.items()
        if name == "bc_atoms" and dict(labels)["pool"] == pool
    }
    assert gauges == {
        ("mig-1g.10gb", "free"): 2,
        ("mig-1g.10gb", "booked"): 1,
        ("mig-1g.10gb", "unhealthy"): 0,
        ("mig-1g.10gb", "unschedulable"): 0,
    }


async def test_without_the_database_the_scrape_serves_everything_but_the_fleet_gauges(
    caplog: pytest.LogCaptureFixture,
) -> None:
    unreachable = create_engine(f"postgresql://postgres@127.0.0.1:{free_port()}/nowhere")
    gauges = FleetGauges()
    registry = CollectorRegistry()
    registry.register(gauges)
    try:
        await gauges.refresh(unreachable, ttl=0)
    finally:
        await unreachable.dispose()
    assert list(registry.collect()) == []  # left out, not served stale or as zeros
    assert "bc_reservations and bc_atoms left out of this scrape" in caplog.text
    samples = parse((await exposition(unreachable, 0)).decode())  # the process's own metrics are still there
    assert value(samples, "bc_quota_rejections_total") >= 0


async def test_the_fleet_gauges_are_counted_again_only_after_their_ttl(clean_db: AsyncEngine) -> None:
    gauges = FleetGauges()
    await gauges.refresh(clean_db, ttl=60)
    assert gauges.reservations == {}
    pool, _ = await make_pool_with_nodes(clean_db, [node_body("ttl-0", 2)])
    await gauges.refresh(clean_db, ttl=60)  # younger than 60 s: the same count
    assert gauges.reservations == {}
    await gauges.refresh(clean_db, ttl=0)
    assert gauges.reservations is not None and gauges.reservations[(pool, "pending")] == 0
    assert gauges.atoms is not None and gauges.atoms[(pool, "gpu", "free")] == 2


async def test_metrics_can_require_a_key_that_reads_every_pool(
    database_url: str, clean_db: AsyncEngine
) -> None:
    """With ``metrics_require_key`` (BC_METRICS_REQUIRE_KEY): no key 401, a key that reads one pool only
    403, a key with compute:capacity:read on ``*`` (or the admin key) the Prometheus text."""
    application = create_app(settings_for(database_url, metrics_require_key=True), run_migrations=False)
    async with application.router.lifespan_context(application):
        transport = httpx.ASGITransport(app=application)

        def client(key: str | None) -> httpx.AsyncClient:
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            return httpx.AsyncClient(transport=transport, base_url="http://test", headers=headers)

        async with client(ADMIN_KEY) as admin:
            pool = await make_pool(admin)
            keys = {}
            for name, resource in (("one_pool", f"pool:{pool}"), ("every_pool", "*")):
                grants = [{"action": "compute:capacity:read", "resource": resource}]
                body = {"principal": f"metrics-{name}", "tenantId": None, "grants": grants}
                r = await admin.post("/v1/api-keys", json=body)
                assert r.status_code == 201, r.text
                keys[name] = r.json()["key"]
            assert (await admin.get("/metrics")).status_code == 200
        for key, status, code in (
            (None, 401, "UNAUTHENTICATED"),
            ("bck_not_a_key", 401, "UNAUTHENTICATED"),
            (keys["one_pool"], 403, "FORBIDDEN"),
        ):
            async with client(key) as caller:
                r = await caller.get("/metrics")
                assert r.status_code == status and r.json()["error"]["code"] == code, r.text
        async with client(keys["every_pool"]) as reader:
            r = await reader.get("/metrics")
            assert r.status_code == 200 and "bc_build_info" in r.text
            assert (await reader.get("/healthz")).status_code == 200  # health stays open


async def test_metrics_are_open_by_default(app: Any) -> None:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as anon:
        assert (await anon.get("/metrics")).status_code == 200

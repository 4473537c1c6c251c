"""Selector requests on the shortlist give the same ranking as planning the whole pool (issue 15: the
selector matches memoized per (selector, node signature) in the pool cache), over random pools of mixed
hosts on real PostgreSQL, with bookings, cordons and unhealthy atoms."""

from __future__ import annotations

import random
from datetime import timedelta
from decimal import Decimal

from sqlalchemy.ext.asyncio import AsyncEngine

from app.capacity.planning.plan import plan_request
from app.capacity.planning.snapshot import PoolCache, read_pool_head, read_snapshot
from app.inventory import service as inventory
from app.inventory.schemas import HealthBody, NodeCreate
from app.placement.model import DeviceRequest, MatchExpression, PlacementRequest, Selector
from app.placement.options import SchedulerOptions
from app.placement.pipeline import plan_placement
from app.placement.shortlist import selector_matches
from tests.capacity.helpers import book, db_time, make_pool_with_nodes
from tests.capacity.test_shortlist import _comparable

SELECTORS = [
    Selector((MatchExpression("vramGiB", "Gte", (Decimal(80),)),)),
    Selector((MatchExpression("gpuProduct", "In", ("H100",)),)),
    Selector(
        (MatchExpression("gpuProduct", "NotIn", ("A100",)), MatchExpression("vramGiB", "Gt", (Decimal(40),)))
    ),
]


def _mixed_node(name: str, rng: random.Random) -> NodeCreate:
    """A host of 4 or 8 GPUs whose atoms are H100/80 or A100/40 (mixed on some hosts)."""
    gpus = rng.choice([4, 8])
    kinds = [("H100", 80), ("A100", 40)]
    mixed = rng.random() < 0.3
    base = rng.choice(kinds)
    ids = [f"{name}-GPU{i}" for i in range(gpus)]
    return NodeCreate.model_validate(
        {
            "name": name,
            "devices": [
                {
                    "id": a,
                    "class": "gpu",
                    "numaNode": i * 2 // gpus,
                    "attributes": dict(
                        zip(("gpuProduct", "vramGiB"), rng.choice(kinds) if mixed else base, strict=True)
                    ),
                }
                for i, a in enumerate(ids)
            ],
            "links": [
                {"a": a, "b": b, "link": rng.choice(["NV12", "SYS"])} for a in ids for b in ids if a < b
            ],
            "resources": {"cpu": {"allocatable": 64}},
        }
    )


async def test_selector_shortlist_equals_the_whole_pool(clean_db: AsyncEngine) -> None:
    engine = clean_db
    rng = random.Random(20261201)
    start = await db_time(engine)
    paths = {"shortlist": 0, "exceptions": 0, "full": 0}
    for k in range(5):
        bodies = [_mixed_node(f"m{k}-{i:03d}", rng) for i in range(rng.randint(20, 50))]
        pool, views = await make_pool_with_nodes(engine, bodies)
        async with engine.begin() as conn:
            for v in views:
                atoms = [d.id for d in v.devices]
                if rng.random() < 0.08:
                    await inventory.set_cordon(conn, v.id, True)
                if rng.random() < 0.5:
                    busy = rng.sample(atoms, rng.randint(1, len(atoms)))
                    await book(
                        conn, pool, v.id, busy, start - timedelta(hours=1), start + timedelta(hours=48)
                    )
                if rng.random() < 0.1:
                    body = HealthBody.model_validate({"devices": [{"id": atoms[0], "healthy": False}]})
                    await inventory.set_health(conn, v.id, body)
        for _ in range(12):
            top_n = rng.choice([1, 2, 3])
            options = SchedulerOptions(top_n=top_n, seed=rng.randrange(1 << 30))
            request = PlacementRequest(
                tenant_id="acme",
                pool_id=pool,
                devices=(DeviceRequest("gpu", rng.choice([1, 2, 4, 8]), rng.choice(SELECTORS)),),
                resources={"cpu": Decimal(4)} if rng.random() < 0.5 else {},
                start=start,
                end=start + timedelta(hours=rng.choice([1, 24])),
            )
            needed = rng.choice([top_n, max(top_n, 10)])
            cache = PoolCache()
            async with engine.connect() as conn:
                short = await plan_request(conn, cache, request, options, shortlist_min=4, needed=needed)
                _, snapshot = await read_snapshot(conn, PoolCache(), pool, request.start, request.end)
            paths[short.path] += 1
            full = plan_placement(request, snapshot, options)
            assert _comparable(short.plan, needed) == _comparable(full, needed), (pool, request, options)
    assert paths["shortlist"] >= 15, paths


async def test_selector_matches_are_computed_once_per_node_signature(clean_db: AsyncEngine) -> None:
    engine = clean_db
    rng = random.Random(7)
    pool, views = await make_pool_with_nodes(engine, [_mixed_node(f"g{i}", rng) for i in range(30)])
    selector = SELECTORS[0]
    cache = PoolCache()
    async with engine.connect() as conn:
        inventory_now = await cache.inventory(conn, await read_pool_head(conn, pool))
    found = selector_matches(inventory_now, "gpu", selector)
    expected = {v.id: frozenset(d.id for d in v.devices if d.attributes["vramGiB"] >= 80) for v in views}
    assert found == expected
    assert selector_matches(inventory_now, "gpu", selector) is found  # memoized per inventory version

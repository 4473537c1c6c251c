"""The shortlist gives the same ranking as planning the whole pool (docs/placement-rules.md, "The
shortlist"; issue 4,
"Done when" 3), over many random pools on real PostgreSQL; a request with a selector takes it too (issue
15; tests/capacity/test_shortlist_selectors.py compares those over random pools)."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import timedelta
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from app.capacity.planning.exceptions import read_exceptions
from app.capacity.planning.plan import plan_request
from app.capacity.planning.snapshot import PoolCache, read_pool_head, read_snapshot
from app.db.tables import devices
from app.inventory import service as inventory
from app.inventory.schemas import HealthBody, TaintBody
from app.placement.model import DeviceRequest, MatchExpression, PlacementRequest, Plan, Selector
from app.placement.options import SchedulerOptions
from app.placement.pipeline import plan_placement
from app.placement.scorers import SCORERS
from app.placement.scorers.contract import COUNTS, NODE, PICK
from app.placement.shortlist import shortlist_applies, shortlist_rows
from tests.capacity.helpers import book, db_time, make_pool_with_nodes
from tests.factories import node_body

pytestmark = pytest.mark.slow  # a long module: it starts early in a parallel run (tests/conftest.py)

LINKS = ["NV12", "NV4", "PIX", "PXB", "SYS"]


async def _random_pool(engine: AsyncEngine, rng: random.Random, start: Any, k: int) -> str:
    bodies = [
        node_body(
            f"p{k}-r{i:03d}", rng.choice([2, 4, 8]), link=rng.choice(LINKS), cpu=rng.choice([8, 16, 64])
        )
        for i in range(rng.randint(20, 60))
    ]
    pool, views = await make_pool_with_nodes(engine, bodies)
    async with engine.begin() as conn:
        for v in views:
            atoms = [d.id for d in v.devices]
            roll = rng.random()
            if roll < 0.08:
                await inventory.set_cordon(conn, v.id, True)
            elif roll < 0.14:
                await inventory.set_taints(
                    conn, v.id, [TaintBody(key="dedicated", value=rng.choice(["acme", "globex"]))]
                )
            if rng.random() < 0.5:
                busy = rng.sample(atoms, rng.randint(1, len(atoms)))
                # bookings that overlap the request window, and some that end before it starts
                await book(
                    conn,
                    pool,
                    v.id,
                    busy,
                    start - timedelta(hours=1),
                    start + timedelta(hours=rng.choice([2, 48])),
                )
            if rng.random() < 0.1:
                await inventory.set_health(
                    conn,
                    v.id,
                    HealthBody.model_validate({"devices": [{"id": atoms[0], "healthy": False}]}),
                )
            for _ in range(rng.choice([0, 0, 1, 2])):  # cpu held over part of the window, or before it
                held_from = start + timedelta(hours=rng.choice([-6, -2, 1, 3]))
                await book(
                    conn,
                    pool,
                    v.id,
                    [],
                    held_from,
                    held_from + timedelta(hours=rng.choice([1, 3, 4])),
                    resources={"cpu": rng.choice([4, 8])},
                )
    return pool


def _comparable(plan: Any, needed: int) -> Any:
    if not isinstance(plan, Plan):
        return ("rejected", plan.summary, dict(plan.by_node))
    return (
        plan.chosen.node_id,
        plan.chosen.atoms,
        [(c.node_id, c.atoms, round(c.score, 12)) for c in plan.ranked[:needed]],
    )


async def test_shortlist_ranking_equals_the_whole_pool(clean_db: AsyncEngine) -> None:
    engine = clean_db
    rng = random.Random(20261129)
    start = await db_time(engine)
    paths = {"shortlist": 0, "exceptions": 0, "full": 0}
    compared = 0
    for k in range(8):
        pool = await _random_pool(engine, rng, start, k)
        for _ in range(12):
            top_n = rng.choice([1, 2, 3])
            options = SchedulerOptions(
                top_n=top_n,
                seed=rng.randrange(1 << 30),
                weights=rng.choice([{}, {"spread": 0.5}, {"numa": 0.0}]),
            )
            request = PlacementRequest(
                tenant_id=rng.choice(["acme", "globex", "initech"]),
                pool_id=pool,
                devices=(
                    DeviceRequest(
                        "gpu", rng.choice([1, 1, 2, 3, 4, 8]), topology=rng.choice([None, None, "nvlink-all"])
                    ),
                ),
                resources={"cpu": Decimal(rng.choice([1, 4, 16]))} if rng.random() < 0.5 else {},
                start=start,
                end=start + timedelta(hours=rng.choice([1, 24])),
            )
            assert shortlist_applies(request, options)
            needed = rng.choice([top_n, max(top_n, 10)])
            cache = PoolCache()
            async with engine.connect() as conn:
                short = await plan_request(conn, cache, request, options, shortlist_min=4, needed=needed)
                _, snapshot = await read_snapshot(conn, cache, pool, request.start, request.end)
            full = plan_placement(request, snapshot, options)
            paths[short.path] += 1
            compared += 1
            assert _comparable(short.plan, needed) == _comparable(full, needed), (pool, request, options)
    assert compared == 96
    assert paths["shortlist"] >= 20, paths  # the shortlist did the work often, not just the fallback


async def test_a_request_that_fits_nowhere_is_rejected_node_by_node_as_the_whole_pool_read_says(
    clean_db: AsyncEngine,
) -> None:
    """Nothing on the shortlist fits: the whole pool planned on the exceptions read (path
    ``exceptions``) rejects every node with the reason the whole-pool read gives it, over random pools in
    mixed states (cordoned, dedicated, booked, unhealthy, cpu held) and requests too large for them."""
    engine = clean_db
    rng = random.Random(20261203)
    start = await db_time(engine)
    paths = {"shortlist": 0, "exceptions": 0, "full": 0}
    for k in range(4):
        pool = await _random_pool(engine, rng, start, 10 + k)
        for _ in range(10):
            request = PlacementRequest(
                tenant_id=rng.choice(["acme", "globex", "initech"]),
                pool_id=pool,
                devices=(
                    DeviceRequest("gpu", rng.choice([4, 8, 8]), topology=rng.choice([None, "nvlink-all"])),
                ),
                resources={"cpu": Decimal(rng.choice([8, 16, 64, 65]))} if rng.random() < 0.7 else {},
                start=start,
                end=start + timedelta(hours=rng.choice([1, 24])),
            )
            cache = PoolCache()
            async with engine.connect() as conn:
                outcome = await plan_request(conn, cache, request, SchedulerOptions(), shortlist_min=4)
                _, snapshot = await read_snapshot(conn, cache, pool, request.start, request.end)
            full = plan_placement(request, snapshot, SchedulerOptions())
            paths[outcome.path] += 1
            assert _comparable(outcome.plan, 10) == _comparable(full, 10), (pool, request)
    assert paths["exceptions"] >= 10, paths


async def test_a_selector_request_takes_the_shortlist(clean_db: AsyncEngine) -> None:
    # issue 15: selector matches are memoized per (selector, node signature) in the pool cache, so a
    # selector no longer sends a request to the whole pool (it was "skips the shortlist" before)
    engine = clean_db
    pool, _ = await make_pool_with_nodes(engine, [node_body(f"s{i}", 8) for i in range(6)])
    start = await db_time(engine)
    plain = PlacementRequest(
        "acme", pool, (DeviceRequest("gpu", 1),), start=start, end=start + timedelta(hours=1)
    )
    selected = replace(
        plain,
        devices=(DeviceRequest("gpu", 1, Selector((MatchExpression("vramGiB", "Gte", (Decimal(80),)),))),),
    )
    options = SchedulerOptions()
    assert shortlist_applies(plain, options) and shortlist_applies(selected, options)
    async with engine.connect() as conn:
        assert (await plan_request(conn, PoolCache(), plain, options, shortlist_min=2)).path == "shortlist"
        outcome = await plan_request(conn, PoolCache(), selected, options, shortlist_min=2)
        head, snapshot = await read_snapshot(conn, PoolCache(), pool, start, start + timedelta(hours=1))
    assert outcome.path == "shortlist" and isinstance(outcome.plan, Plan)
    assert _comparable(outcome.plan, 1) == _comparable(plan_placement(selected, snapshot, options), 1)


async def test_pool_cache_reads_static_inventory_once_per_version(clean_db: AsyncEngine) -> None:
    engine = clean_db
    pool, views = await make_pool_with_nodes(engine, [node_body(f"c{i}", 8) for i in range(4)])
    start = await db_time(engine)
    request = PlacementRequest(
        "acme",
        pool,
        (DeviceRequest("gpu", 1, Selector((MatchExpression("vramGiB", "Gte", (Decimal(80),)),))),),
        start=start,
        end=start + timedelta(hours=1),
    )
    cache = PoolCache()
    async with engine.connect() as conn:
        for _ in range(5):
            await plan_request(conn, cache, request, SchedulerOptions())
    assert cache.loads == 1
    async with engine.begin() as conn:  # an inventory change bumps the version in its transaction
        await inventory.set_labels(conn, views[0].id, {"rack": "r9"})
    async with engine.connect() as conn:
        await plan_request(conn, cache, request, SchedulerOptions())
        head, snap = await read_snapshot(conn, cache, pool, start, start + timedelta(hours=1))
    assert cache.loads == 2
    assert snap.nodes[[n.id for n in snap.nodes].index(views[0].id)].inventory.labels == {"rack": "r9"}
    # health is volatile: read per request, no reload
    async with engine.begin() as conn:
        await conn.execute(sa.update(devices).where(devices.c.node_id == views[1].id).values(healthy=False))
    async with engine.connect() as conn:
        _, snap = await read_snapshot(conn, cache, pool, start, start + timedelta(hours=1))
    assert cache.loads == 2
    assert len(next(n for n in snap.nodes if n.id == views[1].id).state.unavailable) == 8


async def test_uniform_empty_pool_uses_the_shortlist_for_every_shape(clean_db: AsyncEngine) -> None:
    """Many alike nodes tie: the ceiling from their static topology lets the shortlist prove itself."""
    engine = clean_db
    pool, _ = await make_pool_with_nodes(engine, [node_body(f"u{i:02d}", 8) for i in range(30)])
    start = await db_time(engine)
    for count in (1, 2, 4, 8):
        request = PlacementRequest(
            "acme", pool, (DeviceRequest("gpu", count),), start=start, end=start + timedelta(hours=1)
        )
        options = SchedulerOptions(top_n=1, seed=count)
        cache = PoolCache()
        async with engine.connect() as conn:
            short = await plan_request(conn, cache, request, options, shortlist_min=4, needed=5)
            _, snapshot = await read_snapshot(conn, cache, pool, start, request.end)
        assert short.path == "shortlist", count
        assert _comparable(short.plan, 5) == _comparable(plan_placement(request, snapshot, options), 5)


# A toy scorer a newcomer might add (issue 16, done-when 1): it prefers picks of low-index atoms, so it
# depends on the pick; declared so, the shortlist's bound includes it and the ranking stays the whole
# pool's. A NODE toy scorer (reading anything of the node) makes the shortlist fall back.
LOW_FIRST = SimpleNamespace(
    NAME="toy-lowfirst",
    DEFAULT_WEIGHT=2.0,
    DEPENDS=PICK,
    share=lambda pick: 1.0 / (1 + min(pick.indices, default=0)),
)
BY_NAME = SimpleNamespace(
    NAME="toy-byname", DEFAULT_WEIGHT=1.0, DEPENDS=NODE, score=lambda ctx, work: (len(work.node.name) % 7) / 7
)


def _scores(plan: Any) -> dict[str, dict[str, float]]:
    return {c.node_id: dict(c.scores) for c in plan.ranked} if isinstance(plan, Plan) else {}


async def test_a_pick_dependent_toy_scorer_keeps_the_shortlist_equivalent(clean_db: AsyncEngine) -> None:
    engine = clean_db
    rng = random.Random(20261201)
    start = await db_time(engine)
    scorers = SCORERS.adding(LOW_FIRST)
    paths = {"shortlist": 0, "exceptions": 0, "full": 0}
    for k in range(3):
        pool = await _random_pool(engine, rng, start, k)
        for _ in range(8):
            top_n = rng.choice([1, 2, 3])
            options = SchedulerOptions(top_n=top_n, seed=rng.randrange(1 << 30), scorers=scorers)
            request = PlacementRequest(
                tenant_id="acme",
                pool_id=pool,
                devices=(DeviceRequest("gpu", rng.choice([1, 2, 4])),),
                start=start,
                end=start + timedelta(hours=24),
            )
            assert shortlist_applies(request, options)
            cache = PoolCache()
            async with engine.connect() as conn:
                short = await plan_request(conn, cache, request, options, shortlist_min=4, needed=top_n)
                _, snapshot = await read_snapshot(conn, cache, pool, request.start, request.end)
                inventory = await cache.inventory(conn, (await read_pool_head(conn, pool)))
                exceptions = await read_exceptions(conn, request)
            full = plan_placement(request, snapshot, options)
            paths[short.path] += 1
            assert _comparable(short.plan, top_n) == _comparable(full, top_n), (pool, request)
            whole = _scores(full)
            for node_id, scores in _scores(short.plan).items():  # every scorer agrees node by node
                assert scores == whole[node_id], node_id
                assert "toy-lowfirst" in scores
            # the shortlist's ranking key is the COUNTS scorers' part of the pipeline's score
            for node_id, key in shortlist_rows(inventory, request, options, exceptions, 1000):
                if node_id in whole:
                    counts = sum(whole[node_id][s.name] * s.default_weight for s in scorers.of_kind(COUNTS))
                    assert key == pytest.approx(counts), node_id
    assert paths["shortlist"] >= 4, paths


async def test_a_node_dependent_toy_scorer_makes_the_shortlist_fall_back(clean_db: AsyncEngine) -> None:
    engine = clean_db
    start = await db_time(engine)
    pool = await _random_pool(engine, random.Random(7), start, 0)
    options = SchedulerOptions(scorers=SCORERS.adding(BY_NAME))
    request = PlacementRequest(
        tenant_id="acme",
        pool_id=pool,
        devices=(DeviceRequest("gpu", 1),),
        start=start,
        end=start + timedelta(days=1),
    )
    assert shortlist_applies(request, SchedulerOptions()) and not shortlist_applies(request, options)
    async with engine.connect() as conn:
        outcome = await plan_request(conn, PoolCache(), request, options, shortlist_min=4)
    assert outcome.path == "full"
    assert isinstance(outcome.plan, Plan) and "toy-byname" in outcome.plan.chosen.scores


async def test_a_pick_dependent_toy_scorer_that_favours_outside_nodes_makes_the_shortlist_fall_back(
    clean_db: AsyncEngine,
) -> None:
    # 12 nodes with GPU0-2 booked (binpack 1.0: the shortlist's best) and 10 free ones (binpack 0.25).
    # lowfirst (weight 10) scores the busy nodes' pick (GPU3) 0.25 and the free nodes' (GPU0) 1.0, so a
    # free node outside the shortlist wins: only a bound that includes lowfirst sends this to the pool.
    engine = clean_db
    start = await db_time(engine)
    bodies = [node_body(f"busy-{i:02d}", 4, cpu=None) for i in range(12)]
    bodies += [node_body(f"free-{i:02d}", 4, cpu=None) for i in range(10)]
    pool, views = await make_pool_with_nodes(engine, bodies)
    async with engine.begin() as conn:
        for v in views[:12]:
            atoms = sorted(d.id for d in v.devices)
            await book(conn, pool, v.id, atoms[:3], start - timedelta(hours=1), start + timedelta(days=2))
    toy = SimpleNamespace(**{**vars(LOW_FIRST), "DEFAULT_WEIGHT": 10.0})
    options = SchedulerOptions(top_n=1, scorers=SCORERS.adding(toy))
    request = PlacementRequest(
        tenant_id="acme",
        pool_id=pool,
        devices=(DeviceRequest("gpu", 1),),
        start=start,
        end=start + timedelta(days=1),
    )
    cache = PoolCache()
    async with engine.connect() as conn:
        short = await plan_request(conn, cache, request, options, shortlist_min=4)
        _, snapshot = await read_snapshot(conn, cache, pool, request.start, request.end)
    full = plan_placement(request, snapshot, options)
    assert isinstance(full, Plan) and full.chosen.node_name.startswith("free-")
    assert _comparable(short.plan, 1) == _comparable(full, 1)
    assert short.path == "full"

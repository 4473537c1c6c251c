"""The deployment's rate-limit windows (docs/operating.md, "Rate limits"): several processes, each a
:class:`~app.api.rate_limits.RateLimits` of its own, share one key's limit through PostgreSQL, taking
hits in leases. Each process here is an instance on the real database; its clock is frozen (a lease's
deadline passes only when a test moves it) and a window ends when a test ends it in its row."""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.rate_limits import LEASE_SHARE, RateLimits
from app.db import rate_counters
from app.db.tables import rate_limit_counters
from app.errors import RateLimited, Unauthenticated, Unavailable


class Statements:
    """:func:`app.db.rate_counters.take`, counting its calls."""

    def __init__(self) -> None:
        self.count = 0

    async def __call__(self, *args: Any) -> rate_counters.Grant:
        self.count += 1
        return await rate_counters.take(*args)


def process(per_key: str, take: Any = rate_counters.take, now: list[float] | None = None) -> RateLimits:
    """One process's limits with the deployment's windows and a clock that moves only with ``now``."""
    clock = now if now is not None else [0.0]
    return RateLimits(per_key, "3/minute", shared=True, take=take, clock=lambda: clock[0])


async def admitted(limits: RateLimits, engine: AsyncEngine, key_id: str = "key_a") -> bool:
    try:
        await limits.spend_key(engine, key_id)
    except RateLimited as refused:
        assert 1 <= int(refused.headers["Retry-After"]) <= 60
        return False
    return True


async def _end_windows(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        ended = sa.func.now() - timedelta(seconds=1)
        await conn.execute(sa.update(rate_limit_counters).values(window_end=ended))


async def test_two_processes_share_a_keys_limit_of_50_a_minute(clean_db: AsyncEngine) -> None:
    first, second = process("50/minute"), process("50/minute")
    answers = [await admitted((first, second)[i % 2], clean_db) for i in range(100)]
    # below 2 x LEASE_SHARE hits left, a lease is one hit: exact, whichever process is asked
    assert answers == [True] * 50 + [False] * 50
    assert await admitted(first, clean_db, "key_b") and await admitted(second, clean_db, "key_b")


async def test_never_more_than_the_limit_however_the_processes_interleave(clean_db: AsyncEngine) -> None:
    limit, processes = 320, 3
    many = [process(f"{limit}/minute") for _ in range(processes)]
    rng = random.Random(7)
    admitted_count = sum([await admitted(rng.choice(many), clean_db) for _ in range(3 * limit)])
    # hits taken before they are admitted: never over; refused at most while other processes hold a lease
    assert limit - (processes - 1) * (limit // LEASE_SHARE) <= admitted_count <= limit
    async with clean_db.connect() as conn:
        taken = (await conn.execute(sa.select(rate_limit_counters.c.taken))).scalar_one()
    assert taken == limit


async def test_a_lease_spares_the_statements_of_a_busy_key(clean_db: AsyncEngine) -> None:
    statements = Statements()
    limits = process("6400/minute", take=statements)
    lease = 6400 // LEASE_SHARE  # 200
    for _ in range(lease):
        assert await admitted(limits, clean_db)
    assert statements.count == 1
    assert await admitted(limits, clean_db)  # the next lease: a share of what is left
    assert statements.count == 2


async def test_a_refused_key_is_asked_for_again_only_after_its_window(clean_db: AsyncEngine) -> None:
    statements = Statements()
    now = [0.0]
    first, second = process("2/minute"), process("2/minute", take=statements, now=now)
    assert await admitted(first, clean_db) and await admitted(first, clean_db)
    assert not await admitted(second, clean_db)
    assert not await admitted(second, clean_db)  # known full until the window ends: no statement
    assert statements.count == 1
    await _end_windows(clean_db)
    now[0] += 60  # the lease's deadline, measured before its statement, has passed too
    assert await admitted(second, clean_db)
    assert statements.count == 2


async def test_failed_authentications_of_an_address_count_for_the_deployment(clean_db: AsyncEngine) -> None:
    first, second = process("100/minute"), process("100/minute")
    error = Unauthenticated("unknown or revoked API key")
    answers = [await (first, second)[i % 2].failed(clean_db, "10.0.0.1", error) for i in range(4)]
    assert answers[:3] == [error] * 3 and isinstance(answers[3], RateLimited)
    first.check_address("10.0.0.2")
    with pytest.raises(RateLimited):  # the last statement about the address refused it
        second.check_address("10.0.0.1")


async def test_the_shared_count_out_of_reach_is_503() -> None:
    async def refused(*args: Any) -> rate_counters.Grant:
        raise ConnectionRefusedError("connection refused")

    with pytest.raises(Unavailable):
        await process("5/minute", take=refused).spend_key(None, "key_a")


async def test_prune_deletes_the_windows_that_ended(clean_db: AsyncEngine) -> None:
    await rate_counters.take(clean_db, "key:ended", 5, 60, LEASE_SHARE)
    await _end_windows(clean_db)
    await rate_counters.take(clean_db, "key:running", 5, 60, LEASE_SHARE)
    assert await rate_counters.prune(clean_db) == 1
    async with clean_db.connect() as conn:
        names = (await conn.execute(sa.select(rate_limit_counters.c.name))).scalars().all()
    assert names == ["key:running"]

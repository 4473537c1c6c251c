"""The request guard's rate limits: a key's requests and an address's failed authentications, counted
for the whole deployment (docs/operating.md, "Rate limits").

Two counts decide, and a request must pass both:

1. **This process's moving window** (``limits``' memory storage, as the only count before workers
   shared one): at most ``L`` in any ``W`` seconds through this process. A refusal here costs no
   statement, so a flood over the limit never reaches the database.
2. **The deployment's window** (``BC_RATE_LIMIT_STORAGE=postgresql``, the default): one row per name in
   PostgreSQL (:mod:`app.db.rate_counters`) counts the hits every process took of the name's current
   window; the window starts with the first hit after the last one ended and lasts ``W`` seconds on the
   database clock. A process does not ask for every request: it takes a *lease* of
   ``max(1, left // LEASE_SHARE)`` of the ``left`` hits not yet taken and admits that many before it
   asks again; the lease dies with the window (its deadline is measured from before the statement, so
   never later than the database's). Once a statement hands out nothing, the process refuses the name
   without asking until the window ends.

What that guarantees, with ``N`` processes:

- never more than ``L`` requests of a name in one window of the deployment: hits are taken before they
  are admitted, and each window's taken hits never pass ``L``;
- hits a process leased and did not use are lost with the window. A name may be refused while another
  process still holds some, at most ``(N - 1) x max(1, L // LEASE_SHARE)``; below ``2 x LEASE_SHARE``
  hits left a lease is one hit, so a limit under 64 per window is exact;
- with one process, exactly the moving window of before (its own count refuses first);
- windows are fixed, not moving: a burst at a window's end and another at the next one's start may put
  up to ``2 L`` into some ``W`` seconds across processes (one process still holds ``L`` in any ``W``).

``BC_RATE_LIMIT_STORAGE=memory`` keeps only the first count: each process allows ``L``, so ``N``
processes allow up to ``N x L``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from cachetools import LRUCache
from limits import RateLimitItem
from limits import parse as parse_rate
from limits.storage import MemoryStorage
from limits.strategies import MovingWindowRateLimiter
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import rate_counters
from app.db.engine import is_outage
from app.errors import AppError, RateLimited, Unauthenticated, Unavailable

LEASE_SHARE = 32  # a lease is 1/32 of the hits left in the window (at least one)
LEASES = 10_000  # names a process keeps a lease of (the least recently used are forgotten: hits lost)
KEY_REQUESTS = "requests with this key"
ADDRESS_FAILURES = "failed authentications from this address"

Take = Callable[[AsyncEngine, str, int, float, int], Awaitable[rate_counters.Grant]]


@dataclass
class Lease:
    """Hits of a name's window this process may still admit, until ``deadline`` (monotonic seconds);
    ``refused``: the window's hits are all taken, so the name is refused until then."""

    hits: int
    deadline: float
    refused: bool = False


class RateLimits:
    """Per-key and per-address (failed authentication) limits; ``shared``: also the deployment's windows
    in PostgreSQL through ``take`` (:func:`app.db.rate_counters.take`), ``clock`` in monotonic seconds."""

    def __init__(
        self,
        per_key: str,
        auth_failures: str,
        per_agent_key: str | None = None,
        *,
        shared: bool = False,
        take: Take = rate_counters.take,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._limiter = MovingWindowRateLimiter(MemoryStorage())
        self._per_key = parse_rate(per_key)
        self._per_agent_key = parse_rate(per_agent_key or per_key)
        self._auth_failures = parse_rate(auth_failures)
        self._shared = shared
        self._take = take
        self._clock = clock
        self._leases: LRUCache[str, Lease] = LRUCache(maxsize=LEASES)

    async def spend_key(self, engine: AsyncEngine, key_id: str, agent: bool = False) -> None:
        """Count one request of ``key_id`` (``agent``: an agent key, with its own limit); raises
        :class:`~app.errors.RateLimited` over the limit, :class:`~app.errors.Unavailable` when the
        deployment's count cannot be reached."""
        limit = self._per_agent_key if agent else self._per_key
        await self._spend(engine, limit, KEY_REQUESTS, "key", key_id)

    def check_address(self, address: str) -> None:
        """Raise :class:`~app.errors.RateLimited` when ``address`` has used up its failed attempts, in
        this process or (as the last statement about it said) in the deployment's window."""
        item = self._auth_failures
        if not self._limiter.test(item, "auth", address):
            raise self._refusal(item, ADDRESS_FAILURES, "auth", address)
        lease = self._leases.get(f"auth:{address}")
        if lease is not None and lease.refused and lease.deadline > self._clock():
            raise RateLimited(f"more than {item} {ADDRESS_FAILURES}", self._retry_after(lease))

    async def failed(self, engine: AsyncEngine, address: str, error: Unauthenticated) -> AppError:
        """Count one failed authentication of ``address``: ``error``, or 429 when that was one too many."""
        try:
            await self._spend(engine, self._auth_failures, ADDRESS_FAILURES, "auth", address)
        except RateLimited as over:
            return over
        return error

    async def _spend(self, engine: AsyncEngine, item: RateLimitItem, what: str, *identity: str) -> None:
        if self._shared:
            # test, then take of the deployment's window, then count here: a request the deployment
            # refuses is not counted in this process, so it does not hold this process's window after
            # the deployment's one has room again
            if not self._limiter.test(item, *identity):
                raise self._refusal(item, what, *identity)
            await self._take_shared(engine, item, what, ":".join(identity))
        if not self._limiter.hit(item, *identity):  # (shared: another request came in meanwhile)
            raise self._refusal(item, what, *identity)

    async def _take_shared(self, engine: AsyncEngine, item: RateLimitItem, what: str, name: str) -> None:
        """Spend one hit of ``name``'s lease, taking a new lease when it has none left."""
        lease = self._leases.get(name)
        started = self._clock()
        if lease is not None and lease.deadline > started:
            if lease.hits > 0:
                lease.hits -= 1
                return
            if lease.refused:
                raise RateLimited(f"more than {item} {what}", self._retry_after(lease))
        try:
            grant = await self._take(engine, name, item.amount, item.get_expiry(), LEASE_SHARE)
        except Exception as exc:
            if is_outage(exc):
                raise Unavailable() from exc
            raise
        deadline = started + grant.seconds_left
        hits = grant.hits
        current = self._leases.get(name)  # another request of this process may have taken a lease meanwhile
        if current is not None and current.deadline > self._clock() and current.hits > 0:
            hits, deadline = hits + current.hits, min(deadline, current.deadline)
        if hits == 0:
            self._leases[name] = Lease(0, deadline, refused=True)
            raise RateLimited(f"more than {item} {what}", max(1, math.ceil(grant.seconds_left)))
        self._leases[name] = Lease(hits - 1, deadline)

    def _retry_after(self, lease: Lease) -> int:
        return max(1, math.ceil(lease.deadline - self._clock()))

    def _refusal(self, item: RateLimitItem, what: str, *identity: str) -> RateLimited:
        reset_at, _ = self._limiter.get_window_stats(item, *identity)
        return RateLimited(f"more than {item} {what}", max(1, math.ceil(reset_at - time.time())))

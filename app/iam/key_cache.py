"""Principals of API keys that authenticated in this process a moment ago (the request guard's cache).

The request guard (app/api/guard.py) resolves a key to its principal with one query. 10,000 agents that
share their pool's key send 1,000 heartbeats a second, each of which would repeat the same query; this
cache keeps the answer for ``BC_KEY_CACHE_SECONDS`` (default 2 s; 0 turns it off).

A key's principal and grants never change after the key is created (docs/api.md); only revocation and
expiry end it. Revoking a key through this process drops it from the cache at once
(:meth:`PrincipalCache.forget_key`): the very next request with it is refused. A key revoked through
another process (another worker or replica) authenticates here for at most ``BC_KEY_CACHE_SECONDS`` more.
A key with an expiry is kept no longer than the seconds it had left when it was looked up (by the
database's clock, counted here on the monotonic clock): at its expiry the next request looks it up again
and is refused (``key expired``, docs/operating.md, "Keys"). Unknown, revoked and expired keys are never
cached, so a guesser's keys are always looked up.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from cachetools import TTLCache

from app.iam.authorize import Principal

KEY_CACHE_SIZE = 10_000  # keys remembered per process (the oldest are dropped first)


class PrincipalCache:
    """Key hash (SHA-256, never the key) -> :class:`Principal`, for ``ttl`` seconds each, or until the
    key's expiry when that comes first (``clock``: seconds, monotonic); at most ``size`` keys. ``ttl`` 0
    caches nothing."""

    def __init__(
        self, ttl: float, size: int = KEY_CACHE_SIZE, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._ttl = ttl
        self._clock = clock
        # key hash -> (principal, the clock's reading at which the key expires, or None: never)
        self._principals: TTLCache[str, tuple[Principal, float | None]] = TTLCache(
            maxsize=size, ttl=max(ttl, 1e-9), timer=clock
        )

    def get(self, key_hash: str) -> Principal | None:
        """The principal cached for ``key_hash`` within its ``ttl`` and before its key's expiry, else
        ``None`` (an entry whose key expired meanwhile is dropped)."""
        entry = self._principals.get(key_hash)
        if entry is None:
            return None
        principal, expires = entry
        if expires is not None and self._clock() >= expires:
            self._principals.pop(key_hash, None)
            return None
        return principal

    def put(self, key_hash: str, principal: Principal, expires_in: float | None = None) -> None:
        """Remember the principal a lookup just returned (its ``ttl`` starts now); ``expires_in``: the
        seconds its key had left at the lookup (None: it never expires)."""
        if self._ttl > 0:
            expires = None if expires_in is None else self._clock() + expires_in
            self._principals[key_hash] = (principal, expires)

    def forget_key(self, key_id: str) -> None:
        """Drop the key ``key_id`` (it was revoked through this process)."""
        for key_hash, (principal, _) in list(self._principals.items()):
            if principal.key_id == key_id:
                self._principals.pop(key_hash, None)

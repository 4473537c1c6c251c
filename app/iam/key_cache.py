"""Principals of API keys that authenticated in this process a moment ago (the request guard's cache).

The request guard (app/api/guard.py) resolves a key to its principal with one query. 10,000 agents that
share their pool's key send 1,000 heartbeats a second, each of which would repeat the same query; this
cache keeps the answer for ``BC_KEY_CACHE_SECONDS`` (default 2 s; 0 turns it off).

A key's principal and grants never change after the key is created (docs/api.md); only revocation does.
Revoking a key through this process drops it from the cache at once (:meth:`PrincipalCache.forget_key`):
the very next request with it is refused. A key revoked through another process (another worker or
replica) authenticates here for at most ``BC_KEY_CACHE_SECONDS`` more. Unknown and revoked keys are never
cached, so a guesser's keys are always looked up.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from cachetools import TTLCache

from app.iam.authorize import Principal

KEY_CACHE_SIZE = 10_000  # keys remembered per process (the oldest are dropped first)


class PrincipalCache:
    """Key hash (SHA-256, never the key) -> :class:`Principal`, for ``ttl`` seconds each (``clock``:
    seconds, monotonic); at most ``size`` keys. ``ttl`` 0 caches nothing."""

    def __init__(
        self, ttl: float, size: int = KEY_CACHE_SIZE, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._ttl = ttl
        self._principals: TTLCache[str, Principal] = TTLCache(maxsize=size, ttl=max(ttl, 1e-9), timer=clock)

    def get(self, key_hash: str) -> Principal | None:
        """The principal cached for ``key_hash`` within its ``ttl``, else ``None``."""
        return self._principals.get(key_hash)

    def put(self, key_hash: str, principal: Principal) -> None:
        """Remember the principal a lookup just returned (its ``ttl`` starts now)."""
        if self._ttl > 0:
            self._principals[key_hash] = principal

    def forget_key(self, key_id: str) -> None:
        """Drop the key ``key_id`` (it was revoked through this process)."""
        for key_hash, principal in list(self._principals.items()):
            if principal.key_id == key_id:
                self._principals.pop(key_hash, None)

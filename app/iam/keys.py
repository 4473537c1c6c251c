"""API keys: random, shown once, stored as a SHA-256 hash (docs/api.md, "HTTP API").

A key looks like ``bck_<43 url-safe characters>`` (256 bits of randomness), so a fast hash is enough:
nobody can brute-force a 256-bit secret, and the lookup by hash stays one indexed query.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

KEY_PREFIX = "bck_"


def generate_key() -> str:
    """A fresh API key (to be shown once)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> str:
    """The stored form of ``key``: hex SHA-256."""
    return hashlib.sha256(key.encode()).hexdigest()


def same_key(a: str, b: str) -> bool:
    """Constant-time comparison of two keys."""
    return hmac.compare_digest(a.encode(), b.encode())

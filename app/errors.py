"""One error type, stable codes, one HTTP mapping.

Every failure the service reports is an :class:`AppError` subclass. The API layer turns it into
``{"error": {"code", "message", "details"}}`` with the status below; code strings never change once
released (STYLE.md habit 5). Expected outcomes such as "nothing fits" are values, not errors.
"""

from __future__ import annotations

from typing import Any


class AppError(Exception):
    """Base error: ``code`` (stable string), ``message`` (for people), ``details`` (JSON object)."""

    code = "INTERNAL"
    status = 500

    def __init__(self, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details or {}

    def to_body(self) -> dict[str, Any]:
        """The JSON error body: ``{"error": {"code", "message", "details"}}``."""
        return {"error": {"code": self.code, "message": self.message, "details": self.details}}


class InvalidInput(AppError):
    """Malformed input (HTTP 422). ``details["path"]`` names the field, e.g. ``devices.0.count``."""

    code = "INVALID_INPUT"
    status = 422

    def __init__(self, message: str, path: str | None = None, details: dict[str, Any] | None = None) -> None:
        merged = dict(details or {})
        if path is not None:
            merged.setdefault("path", path)
        super().__init__(message, merged)
        self.path = path


class Unauthenticated(AppError):
    """No or unknown API key (HTTP 401)."""

    code = "UNAUTHENTICATED"
    status = 401


class Forbidden(AppError):
    """The key is valid but lacks the grant (HTTP 403)."""

    code = "FORBIDDEN"
    status = 403


class NotFound(AppError):
    """No such resource, or one the caller may not see (HTTP 404)."""

    code = "NOT_FOUND"
    status = 404


class Conflict(AppError):
    """The request conflicts with the current state (HTTP 409)."""

    code = "CONFLICT"
    status = 409


class QuotaExceeded(Conflict):
    """The tenant's quota in the pool would be exceeded (HTTP 409); nothing was written."""

    code = "QUOTA_EXCEEDED"


class IdempotencyKeyReused(Conflict):
    """The idempotency key was used before with another body (HTTP 409)."""

    code = "IDEMPOTENCY_KEY_REUSED"


class PoolArchived(Conflict):
    """The pool is archived: nothing new is placed in it (HTTP 409)."""

    code = "POOL_ARCHIVED"


ERROR_CODES: dict[str, int] = {
    cls.code: cls.status
    for cls in (
        AppError,
        InvalidInput,
        Unauthenticated,
        Forbidden,
        NotFound,
        Conflict,
        QuotaExceeded,
        IdempotencyKeyReused,
        PoolArchived,
    )
}

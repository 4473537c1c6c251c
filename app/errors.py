"""One error type, stable codes, one HTTP mapping.

Every failure the service reports is an :class:`AppError` subclass. The API layer turns it into
``{"error": {"code", "message", "details"}}`` with the status below; code strings never change once
released (docs/architecture.md). Expected outcomes such as "nothing fits" are values, not errors.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class AppError(Exception):
    """Base error: ``code`` (stable string), ``message`` (for people), ``details`` (JSON object)."""

    code = "INTERNAL"
    status = 500
    headers: dict[str, str] = {}  # extra response headers (``Retry-After`` on 429 and 503)

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

    def to_body(self) -> dict[str, Any]:
        """The JSON error body, with ``details.errors`` as every 422 has it (docs/api.md): the list of
        ``{path, message, type}`` that request validation gives, here the one problem this error names
        (``type`` ``value_error``, pydantic's for a rule checked in code). A list already in ``details``
        (from request validation) is kept."""
        body = super().to_body()
        details = body["error"]["details"]
        if "errors" not in details:
            problem = {"path": details.get("path", ""), "message": self.message, "type": "value_error"}
            body["error"]["details"] = {**details, "errors": [problem]}
        return body

    def under(
        self, prefix: str, *, label: str | None = None, as_type: type[InvalidInput] | None = None
    ) -> InvalidInput:
        """The same error one level down: ``path`` (and ``details["path"]``) become ``prefix.path``, or
        ``prefix`` when the error named no field (``"fleet"`` + ``targets.3.node.cpus`` ->
        ``fleet.targets.3.node.cpus``); an empty ``prefix`` keeps the path. ``label`` (a file name, an
        option) goes before the message as ``"<label>: <message>"``. The result is ``as_type`` (default:
        this error's own type, so a subclass stays one). The one helper for re-wrapping errors: write
        ``raise error.under(...) from None``."""
        path = self.path if not prefix else (f"{prefix}.{self.path}" if self.path else prefix)
        message = self.message if label is None else f"{label}: {self.message}"
        cls = as_type or type(self)
        wrapped = cls.__new__(cls)
        details = {**self.details, "path": path} if path is not None else dict(self.details)
        InvalidInput.__init__(wrapped, message, path=path, details=details)
        return wrapped


@contextmanager
def errors_under(prefix: str) -> Iterator[None]:
    """Re-raise an :class:`InvalidInput` of the block one level down, under ``prefix``
    (:meth:`InvalidInput.under`), for a body made of named documents: ``with errors_under("fleet"):
    load_fleet(data)`` names ``fleet.targets.3.node.cpus``. Other errors pass unchanged."""
    try:
        yield
    except InvalidInput as error:
        raise error.under(prefix) from None


class Unsatisfiable(AppError):
    """The request could never be placed in its pool as the pool's nodes are built now, even were the
    pool empty, healthy and uncordoned (HTTP 422); the message names the largest shape the pool has.
    Nothing was written (docs/api.md, "Checked at intake")."""

    code = "UNSATISFIABLE"
    status = 422


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


class PlanStale(AppError):
    """A create with ``ifPlan`` whose plan no longer holds (HTTP 412): an atom it names was booked
    meanwhile, or its node was cordoned or became unschedulable; the message names what changed and
    nothing was written (docs/api.md, "Plan tokens")."""

    code = "PLAN_STALE"
    status = 412


class PayloadTooLarge(AppError):
    """The body is larger than the route's limit (HTTP 413); it was not read past the limit."""

    code = "PAYLOAD_TOO_LARGE"
    status = 413


class RateLimited(AppError):
    """Too many requests from this key, or too many failed authentications from this address (HTTP
    429). ``Retry-After`` gives the seconds until the window has room again."""

    code = "RATE_LIMITED"
    status = 429

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message, {"retryAfterSeconds": retry_after})
        self.headers = {"Retry-After": str(retry_after)}


class Unavailable(AppError):
    """The database cannot be reached (HTTP 503): nothing was written, unless the connection was lost
    while the commit was on its way (a failover), which a create's retry with the same idempotency key
    tells (docs/scaling.md, "High availability with Patroni"); retry after ``Retry-After`` s."""

    code = "UNAVAILABLE"
    status = 503

    def __init__(
        self, message: str = "the database is unavailable; retry shortly", retry_after: int = 2
    ) -> None:
        super().__init__(message, {"retryAfterSeconds": retry_after})
        self.headers = {"Retry-After": str(retry_after)}


QUOTE_LIMIT = 200  # characters of any input an error message may quote


def clip_input(value: object, limit: int = QUOTE_LIMIT) -> str:
    """Caller input as text for an error message or a field path: at most ``limit`` characters of it (a
    longer one ends in ``...(N characters)``), so a 1 MB id is never echoed back. The one helper for
    quoting input (app/errors.py); :func:`quote_input` adds quotes. A lone surrogate (``\\ud800`` in
    JSON: no character, so no UTF-8 either) is written as its escape, so the answer can be encoded."""
    text = value if isinstance(value, str) else str(value)
    text = text if len(text) <= limit else f"{text[:limit]}...({len(text)} characters)"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def quote_input(value: object, limit: int = QUOTE_LIMIT) -> str:
    """``f"{value!r}"`` of at most ``limit`` characters of input: ``'abc'``, ``5``,
    ``'aaaa...'...(N characters)``."""
    if not isinstance(value, str):
        text = repr(value)
        return text if len(text) <= limit else f"{text[:limit]}...({len(text)} characters)"
    return repr(value) if len(value) <= limit else repr(value[:limit]) + f"...({len(value)} characters)"


ERROR_CODES: dict[str, int] = {
    cls.code: cls.status
    for cls in (
        AppError,
        InvalidInput,
        Unsatisfiable,
        Unauthenticated,
        Forbidden,
        NotFound,
        Conflict,
        QuotaExceeded,
        IdempotencyKeyReused,
        PoolArchived,
        PlanStale,
        PayloadTooLarge,
        RateLimited,
        Unavailable,
    )
}

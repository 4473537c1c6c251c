"""The one JSON error shape and its handlers; routes declare their error responses with these."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from sqlalchemy.exc import SQLAlchemyError
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.db.engine import is_outage
from app.errors import AppError, Unavailable, clip_input

log = logging.getLogger("better_compute")


class ErrorDetail(BaseModel):
    code: str
    message: str
    details: dict[str, Any] = {}


class ErrorBody(BaseModel):
    """``{"error": {"code", "message", "details"}}``."""

    error: ErrorDetail


def responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries for the given error statuses (all share :class:`ErrorBody`), plus
    the 413, 429 and 503 that the request guard and an outage may answer on every route."""
    text = {
        401: "UNAUTHENTICATED",
        403: "FORBIDDEN",
        404: "NOT_FOUND",
        409: "CONFLICT, QUOTA_EXCEEDED or IDEMPOTENCY_KEY_REUSED",
        413: "PAYLOAD_TOO_LARGE: the body is over the route's limit",
        422: "INVALID_INPUT (details.path names the field)",
        429: "RATE_LIMITED: too many requests; Retry-After gives the seconds to wait",
        503: "UNAVAILABLE: the database cannot be reached; Retry-After gives the seconds to wait",
    }
    every_route = (413, 429, 503)
    return {
        s: {"model": ErrorBody, "description": text.get(s, "error")}
        for s in sorted({*statuses, *every_route})
    }


def _path(loc: tuple[Any, ...]) -> str:
    parts = [clip_input(p) for p in loc if p not in ("body", "query", "path", "header")]  # keys are input
    return ".".join(parts)


def _jsonable(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return str(value)


def install_error_handlers(app: FastAPI) -> None:
    """Map AppError, validation errors, HTTP errors and unexpected errors to the one shape."""

    @app.exception_handler(AppError)
    async def _app_error(_: Request, exc: AppError) -> JSONResponse:
        return JSONResponse(exc.to_body(), status_code=exc.status, headers=exc.headers or None)

    @app.exception_handler(SQLAlchemyError)
    @app.exception_handler(OSError)
    async def _database(_: Request, exc: Exception) -> JSONResponse:
        """A database outage is 503 with Retry-After, answered normally so the client's keep-alive
        connection stays open; any other such error goes on to the 500 handler."""
        if not is_outage(exc):
            raise exc
        unavailable = Unavailable()
        return JSONResponse(unavailable.to_body(), status_code=503, headers=unavailable.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = []
        for e in exc.errors():
            item = {
                "path": _path(tuple(e.get("loc", ()))),
                "message": e.get("msg", ""),
                "type": e.get("type", ""),
            }
            position = (e.get("ctx") or {}).get("position")
            if isinstance(position, int):
                item["position"] = position  # a selector shorthand's 0-based character offset
            errors.append(item)
        for e in errors:
            if e["type"] == "missing" and e["path"] == "":
                e["message"] = "a JSON body is required"
            if e["type"] == "json_invalid":  # the location is a byte offset, not a field
                e["message"] = f"the body is not valid JSON ({e['message']} at character {e['path']})"
                e["path"] = ""
        first = errors[0] if errors else {"path": "", "message": "invalid input"}
        message = f"{first['path']}: {first['message']}" if first["path"] else first["message"]
        body = {
            "error": {
                "code": "INVALID_INPUT",
                "message": message,
                "details": {
                    "path": first["path"],
                    **({"position": first["position"]} if "position" in first else {}),
                    "errors": _jsonable(errors),
                },
            }
        }
        return JSONResponse(body, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400:  # FastAPI could not read the body (not UTF-8 / not JSON): bad input
            body = {
                "error": {
                    "code": "INVALID_INPUT",
                    "message": f"the body could not be read as JSON: {exc.detail}",
                    "details": {"path": ""},
                }
            }
            return JSONResponse(body, status_code=422)
        code = {401: "UNAUTHENTICATED", 403: "FORBIDDEN", 404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED"}.get(
            exc.status_code, "HTTP_ERROR"
        )
        return JSONResponse(
            {"error": {"code": code, "message": str(exc.detail), "details": {}}},
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),  # e.g. Allow on 405
        )

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error", exc_info=exc)
        return JSONResponse(
            {"error": {"code": "INTERNAL", "message": "internal error", "details": {}}}, status_code=500
        )

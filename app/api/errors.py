"""The one JSON error shape and its handlers; routes declare their error responses with these."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.errors import AppError


class ErrorDetail(BaseModel):
    code: str
    message: str
    details: dict[str, Any] = {}


class ErrorBody(BaseModel):
    """``{"error": {"code", "message", "details"}}``."""

    error: ErrorDetail


def responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries for the given error statuses (all share :class:`ErrorBody`)."""
    text = {
        401: "UNAUTHENTICATED",
        403: "FORBIDDEN",
        404: "NOT_FOUND",
        409: "CONFLICT, QUOTA_EXCEEDED or IDEMPOTENCY_KEY_REUSED",
        422: "INVALID_INPUT (details.path names the field)",
    }
    return {s: {"model": ErrorBody, "description": text.get(s, "error")} for s in statuses}


def _path(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header")]
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
        return JSONResponse(exc.to_body(), status_code=exc.status)

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
        # reached only by an error outside the access-log middleware (which logs and answers the rest
        # itself, once); Starlette re-raises it after this answer and the server logs the traceback
        return JSONResponse(AppError("internal error").to_body(), status_code=500)

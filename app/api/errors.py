"""The one JSON error shape and its handlers; routes declare their error responses with these."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError, ResponseValidationError
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


def responses(*statuses: int, conflicts: tuple[str, ...] = ()) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries for the given error statuses (all share :class:`ErrorBody`), plus
    the 413, 429 and 503 that the request guard and an outage may answer on every route. ``conflicts``
    names exactly the 409 codes the operation answers (and declares its 409):
    ``responses(401, 403, conflicts=("CONFLICT", "POOL_ARCHIVED"))``."""
    text = {
        401: "UNAUTHENTICATED",
        403: "FORBIDDEN",
        404: "NOT_FOUND",
        409: "CONFLICT, QUOTA_EXCEEDED or IDEMPOTENCY_KEY_REUSED",
        412: "PLAN_STALE: the plan ifPlan names no longer holds (an atom was booked, the node changed); "
        "nothing was written",
        413: "PAYLOAD_TOO_LARGE: the body is over the route's limit",
        422: "INVALID_INPUT (details.path names the field)",
        429: "RATE_LIMITED: too many requests; Retry-After gives the seconds to wait",
        503: "UNAVAILABLE: the database cannot be reached; Retry-After gives the seconds to wait",
    }
    declared = {*statuses, 413, 429, 503}  # 413, 429, 503: every route
    if conflicts:
        text[409] = " or ".join(conflicts)
        declared.add(409)
    return {s: {"model": ErrorBody, "description": text.get(s, "error")} for s in sorted(declared)}


SOURCES = ("body", "query", "path", "header", "cookie")
PYDANTIC_PREFIXES = ("Value error, ", "Assertion failed, ")


def unsatisfiable() -> dict[int | str, dict[str, Any]]:
    """The 422 entry of an operation that checks a request against its pool at intake (docs/api.md,
    "Checked at intake"), to merge after :func:`responses`."""
    return {
        422: {
            "model": ErrorBody,
            "description": "INVALID_INPUT (details.path names the field) or UNSATISFIABLE (no node of "
            "the pool, as it is built now, could ever hold the request)",
        }
    }


def _path(loc: tuple[Any, ...]) -> str:
    parts = [clip_input(p) for p in loc if p not in SOURCES]  # keys are input
    return ".".join(parts)


def json_path(loc: tuple[Any, ...], body: Any, error_type: str) -> str:
    """The dotted JSON path the caller sent (``devices.0.selector.matchExpressions.0.op``) for a pydantic
    error location in a request body: steps that the body does not have are pydantic's names of union
    members and validators (``SelectorBody``, ``str``, ``function-after[...]``, ``[key]``) and are left
    out, except the last step of a ``missing`` error, the field that was not sent."""
    if not loc or loc[0] != "body":
        return _path(loc)
    steps: list[str] = []
    data = body
    parts = loc[1:]
    for index, part in enumerate(parts):
        if isinstance(data, dict) and isinstance(part, str) and part in data:
            data = data[part]
        elif isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data):
            data = data[part]
        elif not (index == len(parts) - 1 and error_type == "missing"):
            continue  # a union member's or a validator's name, not a step of the body
        steps.append(clip_input(str(part)))  # keys are input
    return ".".join(steps)


def plain_message(message: str) -> str:
    """A validation message without pydantic's ``Value error, `` prefix."""
    for prefix in PYDANTIC_PREFIXES:
        if message.startswith(prefix):
            return message[len(prefix) :]
    return message


def _jsonable(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return str(value)


def document_errors(schema: dict[str, Any]) -> dict[str, Any]:
    """The OpenAPI document with the one error shape everywhere: FastAPI's default 422 response
    (``HTTPValidationError``, a shape this service never answers) becomes :class:`ErrorBody`, and each
    operation's description ends with the error statuses and codes it can answer. Changes ``schema``."""
    components = schema.get("components", {}).get("schemas", {})
    default_422 = {"$ref": "#/components/schemas/HTTPValidationError"}
    error_body = {"$ref": "#/components/schemas/ErrorBody"}
    for item in schema.get("paths", {}).values():
        for operation in item.values():
            answers = operation.get("responses", {})
            for answer in answers.values():
                content = answer.get("content", {}).get("application/json", {})
                if content.get("schema") == default_422:
                    content["schema"] = error_body
                    answer["description"] = responses(422)[422]["description"]
            errors = [f"`{s}` {answers[s]['description']}" for s in sorted(answers) if s >= "400"]
            if errors:
                lines = [operation.get("description", "").rstrip(), "Errors: " + "; ".join(errors) + "."]
                operation["description"] = "\n\n".join(line for line in lines if line)
    components.pop("HTTPValidationError", None)
    components.pop("ValidationError", None)
    return schema


def _not_an_object(content_type: str) -> str:
    """The message for a body that is not a JSON object, naming a content type that is not JSON (a
    ``curl -d`` without ``-H 'Content-Type: application/json'`` sends a form)."""
    media = content_type.split(";", 1)[0].strip().lower()
    if media == "application/json" or media.endswith("+json"):
        return "the body must be a JSON object"
    return (
        f"the body must be a JSON object sent as Content-Type: application/json (it was {media or 'missing'})"
    )


def install_error_handlers(app: FastAPI) -> None:
    """Map AppError, validation errors, HTTP errors and unexpected errors to the one shape (and say so
    in the OpenAPI document: :func:`document_errors`)."""
    plain_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = document_errors(plain_openapi())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

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
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors: list[dict[str, Any]] = []
        for e in exc.errors():
            loc, kind = tuple(e.get("loc", ())), e.get("type", "")
            item = {
                "path": _path(loc) if kind == "json_invalid" else json_path(loc, exc.body, kind),
                "message": plain_message(e.get("msg", "")),
                "type": kind,
            }
            position = (e.get("ctx") or {}).get("position")
            if isinstance(position, int):
                item["position"] = position  # a selector shorthand's 0-based character offset
            if item not in errors:  # a union's members may report one field alike
                errors.append(item)
        for e in errors:
            if e["type"] == "missing" and e["path"] == "":
                e["message"] = "a JSON body is required"
            if e["path"] == "" and e["type"] in ("model_attributes_type", "dict_type"):
                e["message"] = _not_an_object(request.headers.get("content-type", ""))
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
            message = f"the body could not be read as JSON: {exc.detail}"
            error = {"path": "", "message": message, "type": "json_invalid"}
            body = {
                "error": {
                    "code": "INVALID_INPUT",
                    "message": message,
                    "details": {"path": "", "errors": [error]},
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

    @app.exception_handler(ResponseValidationError)
    async def _answer_off_contract(request: Request, exc: ResponseValidationError) -> JSONResponse:
        # a service answered a shape its route's response model does not declare (app/answers/):
        # a defect of this service, named in the log so the model (or the service) can be fixed
        problems = [f"{_path(tuple(e.get('loc', ())))}: {e.get('msg', '')}" for e in exc.errors()]
        log.error(
            "answer of %s %s does not match its response model: %s",
            request.method,
            request.url.path,
            "; ".join(problems),
        )
        return JSONResponse(
            {"error": {"code": "INTERNAL", "message": "internal error", "details": {}}}, status_code=500
        )

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        # reached only by an error outside the access-log middleware (which logs and answers the rest
        # itself, once); Starlette re-raises it after this answer and the server logs the traceback
        return JSONResponse(AppError("internal error").to_body(), status_code=500)

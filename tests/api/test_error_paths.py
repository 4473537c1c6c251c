"""422 answers name the JSON path the caller sent, never pydantic's names of union members or validators
(``devices.0.selector.SelectorBody.matchExpressions.0.op``), and no message starts with ``Value error, ``
(issue 10, "Error texts"). A refused request writes nothing."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from app.api.errors import json_path, plain_message
from tests.factories import add_node, gpu_node, make_pool


def _selector(expression: dict[str, Any]) -> dict[str, Any]:
    return {"devices": [{"class": "gpu", "count": 1, "selector": {"matchExpressions": [expression]}}]}


CASES = [
    (_selector({"key": "a", "op": "Bad"}), "devices.0.selector.matchExpressions.0.op", "Input should be"),
    (
        _selector({"key": "a", "op": "Gt", "values": ["x"]}),
        "devices.0.selector.matchExpressions.0",
        "Gt needs",
    ),
    (_selector({"key": "9a", "op": "Exists"}), "devices.0.selector.matchExpressions.0.key", "a key starts"),
    ({"devices": [{"class": "gpu", "count": 1, "selector": "a in ("}]}, "devices.0.selector", "selector:"),
    ({"devices": [{"class": "gpu", "count": 0}]}, "devices.0.count", "Input should be greater"),
    ({"duration": [1]}, "duration", "Input should be"),
    ({"duration": "soon"}, "duration", "duration must be like"),
    ({"tenantId": None}, "tenantId", "Input should be a valid string"),
    ({"bogus": 1}, "bogus", "Extra inputs"),
    ({"resources": {"BAD": 1}}, "resources.BAD", "String should match"),
    ({"resources": {"cpu": "lots"}}, "resources.cpu", "must be a JSON number"),
    ({"gang": {"members": "x"}}, "gang.members", "Input should be a valid integer"),
    ({"start": "2026-01-01T00:00:00"}, "start", "start needs a timezone"),
    ({"devices": []}, "", "a request claims at least one device or resource"),
]


@pytest.mark.parametrize(("change", "path", "message"), CASES)
async def test_a_refusal_names_the_field_as_sent(
    admin_client: httpx.AsyncClient, engine: Any, change: dict[str, Any], path: str, message: str
) -> None:
    pool = await make_pool(admin_client)
    await add_node(admin_client, pool, gpu_node("paths-a", 2))
    body = {"tenantId": "acme", "poolId": pool, "devices": [{"class": "gpu", "count": 1}], "duration": "1h"}
    body = {**body, "idempotencyKey": "paths", **change}
    r = await admin_client.post("/v1/reservations", json=body)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "INVALID_INPUT" and error["details"]["path"] == path
    assert error["message"] == (f"{path}: " if path else "") + error["details"]["errors"][0]["message"]
    assert error["details"]["errors"][0]["message"].startswith(message)
    for item in error["details"]["errors"]:
        assert "Body" not in item["path"] and "[" not in item["path"] and "function" not in item["path"]
        assert not item["message"].startswith("Value error")
    async with engine.connect() as conn:
        assert (await conn.exec_driver_sql("SELECT count(*) FROM reservations")).scalar_one() == 0


@pytest.mark.parametrize(
    ("loc", "body", "kind", "path"),
    [
        (
            ("body", "devices", 0, "selector", "SelectorBody", "matchExpressions", 0, "op"),
            {"devices": [{"selector": {"matchExpressions": [{"op": "x"}]}}]},
            "literal_error",
            "devices.0.selector.matchExpressions.0.op",
        ),
        (("body", "duration", "str"), {"duration": [1]}, "string_type", "duration"),
        (
            ("body", "resources", "BAD", "[key]"),
            {"resources": {"BAD": 1}},
            "string_pattern_mismatch",
            "resources.BAD",
        ),
        (("body", "devices", 0, "count"), {"devices": [{}]}, "missing", "devices.0.count"),
        (("body", "gang", "GangBody", "members"), {"gang": {}}, "missing", "gang.members"),
        (("body",), [], "model_attributes_type", ""),
        (("query", "limit"), None, "greater_than_equal", "limit"),
    ],
)
def test_json_path_keeps_only_the_steps_of_the_body(
    loc: tuple[Any, ...], body: Any, kind: str, path: str
) -> None:
    assert json_path(loc, body, kind) == path


@pytest.mark.parametrize(
    ("message", "plain"),
    [
        ("Value error, duration must be positive", "duration must be positive"),
        ("Assertion failed, no", "no"),
        ("Field required", "Field required"),
    ],
)
def test_plain_message_drops_pydantic_prefixes(message: str, plain: str) -> None:
    assert plain_message(message) == plain


async def test_an_answer_off_its_model_is_a_logged_internal_error(caplog: pytest.LogCaptureFixture) -> None:
    from fastapi import FastAPI

    from app.answers.quota import Quota
    from app.api.errors import install_error_handlers

    app = FastAPI()
    install_error_handlers(app)

    @app.get("/quota", response_model=Quota)
    async def answer() -> dict[str, Any]:
        return {"tenantId": "acme", "poolId": "pool_x", "limits": {}, "used": {}, "spare": 1}

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        r = await client.get("/quota")
    assert r.status_code == 500 and r.json()["error"]["code"] == "INTERNAL"
    assert "does not match its response model" in caplog.text and "spare" in caplog.text


async def test_a_past_start_has_the_errors_list_of_every_422(
    admin_client: httpx.AsyncClient, engine: Any
) -> None:
    """A start in the past is refused by the service, not by request validation; its 422 still carries
    ``details.errors`` items of the same shape (``path``, ``message``, ``type``), and nothing is written."""
    pool = await make_pool(admin_client)
    await add_node(admin_client, pool, gpu_node("past-a", 2))
    body = {"tenantId": "acme", "poolId": pool, "devices": [{"class": "gpu", "count": 1}], "duration": "1h"}
    body["idempotencyKey"] = "past"
    past = await admin_client.post("/v1/reservations", json={**body, "start": "2001-01-01T00:00:00Z"})
    typo = await admin_client.post("/v1/reservations", json={**body, "duration": "soon"})
    assert (past.status_code, typo.status_code) == (422, 422), past.text
    error, other = past.json()["error"], typo.json()["error"]
    assert error["code"] == "INVALID_INPUT" and error["details"]["path"] == "start"
    [item] = error["details"]["errors"]
    assert item == {"path": "start", "message": error["message"], "type": "value_error"}
    assert "in the past" in item["message"]
    assert set(item) == set(other["details"]["errors"][0])
    async with engine.connect() as conn:
        assert (await conn.exec_driver_sql("SELECT count(*) FROM reservations")).scalar_one() == 0

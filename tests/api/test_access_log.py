"""Access log and request ids (issue 9, "Done when" 5): one line per request with method, route template,
status, duration, key id and request id; ``X-Request-Id`` on every response; a 500 logs one traceback that
carries the request id; ``BC_LOG_FORMAT=json`` gives JSON lines. Real log output: pytest's capture of the
``better_compute`` records in process, and a real service process's stderr."""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.main import create_app
from app.observability.logs import formatter
from tests.api.metrics_text import parse
from tests.conftest import ADMIN_KEY, settings_for
from tests.factories import add_node, gpu_node, make_pool, reservation
from tests.servers import Server, running_server

REQUEST_ID = "X-Request-Id"


async def _boom() -> None:
    raise RuntimeError("a bug in a route")


@pytest.fixture
async def client(database_url: str, clean_db: AsyncEngine) -> AsyncIterator[httpx.AsyncClient]:
    """The real app plus one route with a bug (``GET /test/boom`` raises), without a key."""
    application = create_app(settings_for(database_url), run_migrations=False)
    application.add_api_route("/test/boom", _boom)
    async with application.router.lifespan_context(application):
        # raise_app_exceptions (the default): an exception re-raised by the app would fail the request
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=application), base_url="http://test"
        ) as c:
            yield c


def _access(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "better_compute.access"]


async def test_one_access_line_per_request_with_its_fields(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="better_compute")
    auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
    pool = (await client.post("/v1/pools", json={"name": "logged"}, headers=auth)).json()["id"]
    caplog.clear()
    r = await client.get(f"/v1/pools/{pool}", headers={**auth, REQUEST_ID: "dash-7f3a.b:1"})
    assert r.status_code == 200 and r.headers[REQUEST_ID] == "dash-7f3a.b:1"
    anonymous = await client.get("/v1/reservations/res_nope")
    assert anonymous.status_code == 401
    [mine, theirs] = _access(caplog)
    assert (mine.method, mine.route, mine.status, mine.request_id) == (
        "GET",
        "/v1/pools/{pool_id}",
        200,
        "dash-7f3a.b:1",
    )
    assert isinstance(mine.duration_ms, float) and mine.duration_ms > 0
    assert mine.key_id == "bootstrap"  # the request guard authenticated the bootstrap admin key
    # answered before any route ran, and still under its template; no key authenticated: "-"
    assert (theirs.route, theirs.status, theirs.key_id) == ("/v1/reservations/{reservation_id}", 401, "-")
    assert theirs.request_id == anonymous.headers[REQUEST_ID] and theirs.request_id.startswith("req_")
    line = formatter("text").format(mine)
    assert "GET /v1/pools/{pool_id} 200 " in line and "ms key=" in line and "[dash-7f3a.b:1]" in line
    assert pool not in line  # the template, never the raw path


@pytest.mark.parametrize(
    "given",
    ["a" * 129, "two words", "line\r\nbreak", "-starts-with-dash", "", "ünïcode"],
    ids=["too-long", "space", "crlf", "leading-dash", "empty", "non-ascii"],
)
async def test_a_malformed_request_id_is_replaced(client: httpx.AsyncClient, given: str) -> None:
    r = await client.get("/healthz", headers={REQUEST_ID: given.encode()})
    assert r.status_code == 200
    assert r.headers[REQUEST_ID].startswith("req_") and r.headers[REQUEST_ID] != given


async def test_every_answer_carries_a_request_id(client: httpx.AsyncClient) -> None:
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    answers = {
        401: await client.get("/v1/pools"),
        404: await client.get("/v1/nowhere", headers=admin),  # without a key: 401 (the guard runs first)
        405: await client.delete("/v1/reservations", headers=admin),
        422: await client.post("/v1/pools", json={"name": 7}, headers=admin),
        500: await client.get("/test/boom"),
    }
    for status, r in answers.items():
        assert r.status_code == status, (status, r.text)
        assert r.headers[REQUEST_ID].startswith("req_"), status
    assert len({r.headers[REQUEST_ID] for r in answers.values()}) == len(answers)  # one id per request


async def test_a_500_logs_one_traceback_with_the_request_id(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="better_compute")
    r = await client.get("/test/boom", headers={REQUEST_ID: "trace-me-1"})
    assert r.status_code == 500 and r.headers[REQUEST_ID] == "trace-me-1"
    assert r.json() == {"error": {"code": "INTERNAL", "message": "internal error", "details": {}}}
    with_traceback = [rec for rec in caplog.records if rec.exc_info]
    assert len(with_traceback) == 1
    [error] = with_traceback
    assert error.request_id == "trace-me-1" and "GET /test/boom" in error.getMessage()
    assert "[trace-me-1]" in formatter("text").format(error).splitlines()[0]
    [access] = _access(caplog)
    assert (access.status, access.route, access.request_id) == (500, "/test/boom", "trace-me-1")


@pytest.fixture(scope="module")
def json_server(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A service process logging JSON lines, with a scheduler plugin whose filter has a bug."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("BC_LOG_FORMAT", "json")
        env.setenv("BC_SCHEDULER_PLUGINS", '["tests.example_plugins:exploding"]')
        with running_server(database_url, tmp_path_factory.mktemp("json-log")) as server:
            yield server


def _json_lines(server: Server) -> list[dict[str, Any]]:
    lines = [line for line in server.log.read_text().splitlines() if line.startswith("{")]
    return [json.loads(line) for line in lines]


async def test_json_lines_in_a_real_process(json_server: Server) -> None:
    auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
    async with httpx.AsyncClient(base_url=json_server.url, headers=auth, timeout=30) as http:
        pool = await make_pool(http)
        await add_node(http, pool, gpu_node("ok-1", 2))
        await add_node(http, pool, gpu_node("bad-1", 2, labels={"explode": "yes"}))
        fine = await http.get(f"/v1/pools/{pool}", headers={REQUEST_ID: "json-ok-1"})
        body = reservation(pool, 1)
        broken = await http.post("/v1/capacity/preview", json=body, headers={REQUEST_ID: "json-500"})
        after = await http.get("/healthz")  # the connection and the process carry on
    assert fine.status_code == 200 and broken.status_code == 500 and after.status_code == 200
    assert broken.headers[REQUEST_ID] == "json-500"
    records = _json_lines(json_server)
    access = {r["request_id"]: r for r in records if r.get("name") == "better_compute.access"}
    assert access["json-ok-1"]["route"] == "/v1/pools/{pool_id}" and access["json-ok-1"]["status"] == 200
    assert access["json-ok-1"]["method"] == "GET" and isinstance(access["json-ok-1"]["key_id"], str)
    assert access["json-500"]["status"] == 500 and access["json-500"]["route"] == "/v1/capacity/preview"
    assert {"timestamp", "level", "message", "duration_ms"} <= set(access["json-500"])
    # exactly one traceback in the whole output, in one JSON line naming the request
    output = json_server.log.read_text()
    assert output.count("Traceback (most recent call last)") == 1, output[-5000:]
    [error] = [r for r in records if "exc_info" in r]
    assert error["request_id"] == "json-500" and "RuntimeError: a plugin bug" in error["exc_info"]
    assert error["level"] == "ERROR"


def _send_half_a_body(server: Server, request_id: str) -> None:
    """POST /v1/reservations declaring 100 body bytes, send 12 of them, and hang up (a real socket)."""
    head = (
        f"POST /v1/reservations HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {ADMIN_KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: 100\r\n{REQUEST_ID}: {request_id}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as conn:
        conn.sendall(head.encode() + b'{"tenantId":')


def test_a_client_gone_mid_body_is_499_without_a_traceback(json_server: Server) -> None:
    def http_requests(text: str, code: str) -> float:
        labels = {"route": "/v1/reservations", "method": "POST", "code": code}
        return parse(text).get(("bc_http_requests_total", frozenset(labels.items())), 0.0)

    before = httpx.get(json_server.url + "/metrics").text
    tracebacks = json_server.log.read_text().count("Traceback (most recent call last)")
    _send_half_a_body(json_server, "gone-mid-body")
    deadline = time.monotonic() + 20
    while not any(r.get("request_id") == "gone-mid-body" for r in _json_lines(json_server)):
        assert time.monotonic() < deadline, json_server.output()
        time.sleep(0.1)
    [access] = [r for r in _json_lines(json_server) if r.get("request_id") == "gone-mid-body"]
    assert (access["status"], access["route"], access["key_id"]) == (499, "/v1/reservations", "bootstrap")
    after = httpx.get(json_server.url + "/metrics").text
    assert http_requests(after, "499") - http_requests(before, "499") == 1
    assert http_requests(after, "500") == http_requests(before, "500")
    assert json_server.log.read_text().count("Traceback (most recent call last)") == tracebacks

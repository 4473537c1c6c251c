"""The typed contract (issue 10, "Done when" 1): every success answer in ``openapi/openapi.json`` is a
named schema, every error answer is ``ErrorBody`` (no FastAPI ``HTTPValidationError``), operation ids are
unique camelCase verbs, and a walk over every operation of the real app answers what the document says."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator

from tests.factories import gpu_node

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
DOC = json.loads((ROOT / "openapi" / "openapi.json").read_text())
VERBS = (
    "get|list|create|import|archive|cordon|uncordon|set|preview|release|extend|revoke|explain|build|compare"
    "|record|check|send"
    "get|list|create|import|archive|cordon|uncordon|set|preview|release|revoke|explain|build|compare|record"
    "|check|send|drain|undrain|delete"
)
OPERATION_ID = re.compile(rf"^({VERBS})([A-Z][a-z0-9]*)+$")
TEXT_ANSWERS = {"getMetrics"}  # Prometheus text, not JSON


def _operations() -> list[tuple[str, str, dict[str, Any]]]:
    return [(method, path, op) for path, item in DOC["paths"].items() for method, op in item.items()]


def test_every_success_answer_is_a_named_schema() -> None:
    for method, path, op in _operations():
        successes = {s: r for s, r in op["responses"].items() if s.startswith("2")}
        assert successes, (method, path)
        for status, answer in successes.items():
            if status == "204" or op["operationId"] in TEXT_ANSWERS:
                continue
            schema = answer["content"]["application/json"]["schema"]
            assert set(schema) == {"$ref"}, (method, path, status, schema)
            name = schema["$ref"].rsplit("/", 1)[-1]
            assert DOC["components"]["schemas"][name].get("properties"), name  # typed fields


def test_no_fastapi_validation_shapes_remain_and_errors_are_error_body() -> None:
    text = json.dumps(DOC)
    assert "HTTPValidationError" not in text and '"ValidationError"' not in text
    for method, path, op in _operations():
        errors = {s: r for s, r in op["responses"].items() if s[0] in "45"}
        for status, answer in errors.items():
            schema = answer["content"]["application/json"]["schema"]
            assert schema == {"$ref": "#/components/schemas/ErrorBody"}, (method, path, status)
            assert f"`{status}`" in op["description"], (method, path, status)  # codes listed


def test_an_idempotent_retry_is_declared_beside_the_created_answer() -> None:
    answers = DOC["paths"]["/v1/reservations"]["post"]["responses"]
    assert answers["200"]["content"] == answers["201"]["content"]


def test_operation_ids_are_unique_camel_case_verbs() -> None:
    ids = [op["operationId"] for _, _, op in _operations()]
    assert len(ids) == len(set(ids))
    for operation_id in ids:
        assert OPERATION_ID.match(operation_id), operation_id


@pytest.mark.parametrize(
    ("operation_id", "ok"),
    [("explainPlacement", True), ("placement_explain", False), ("createPool", True), ("healthz", False)],
)
def test_the_operation_id_pattern(operation_id: str, ok: bool) -> None:
    assert bool(OPERATION_ID.match(operation_id)) is ok


def test_list_operations_page_with_limit_and_cursor() -> None:
    for path in ("/v1/reservations", "/v1/pools", "/v1/pools/{pool_id}/nodes"):
        op = DOC["paths"][path]["get"]
        assert {"limit", "cursor"} <= {p["name"] for p in op["parameters"]}, path
        name = op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
        assert set(DOC["components"]["schemas"][name]["properties"]) == {"items", "nextCursor"}, path


def _template(path: str) -> re.Pattern[str]:
    return re.compile("^" + re.sub(r"\{[^}]+\}", "[^/]+", path) + "$")


TEMPLATES = [(method, _template(path), op) for method, path, op in _operations()]


class Recorder:
    """Checks every answer against the document's schema for its operation and status."""

    def __init__(self) -> None:
        self.seen: dict[str, set[int]] = {}

    def check(self, response: httpx.Response) -> None:
        method, path = response.request.method.lower(), response.request.url.path
        [op] = [op for m, pattern, op in TEMPLATES if m == method and pattern.match(path)]
        status = str(response.status_code)
        assert status in op["responses"], (op["operationId"], status, response.text)
        self.seen.setdefault(op["operationId"], set()).add(response.status_code)
        content = op["responses"][status].get("content", {}).get("application/json")
        if content is None:
            return
        validator = Draft202012Validator({**content["schema"], "components": DOC["components"]})
        problems = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(response.json())]
        assert not problems, (op["operationId"], status, problems)


async def test_every_operation_answers_its_declared_schema(client_for: Any) -> None:
    from tests.conftest import ADMIN_KEY

    recorder = Recorder()
    client = client_for(ADMIN_KEY)
    async with client:

        async def call(method: str, url: str, **kwargs: Any) -> httpx.Response:
            response = await client.request(method, url, **kwargs)
            recorder.check(response)
            return response

        await call("GET", "/healthz")
        await call("GET", "/readyz")
        await call("GET", "/metrics")
        key = (await call("POST", "/v1/api-keys", json={"principal": "ci", "grants": []})).json()
        await call("GET", "/v1/api-keys", params={"limit": 1})
        await call("DELETE", f"/v1/api-keys/{key['id']}")
        pool = (await call("POST", "/v1/pools", json={"name": "walk"})).json()["id"]
        await call("GET", "/v1/pools", params={"limit": 1})
        await call("GET", f"/v1/pools/{pool}")
        node = (await call("POST", f"/v1/pools/{pool}/nodes", json=gpu_node("walk-a", 4))).json()["id"]
        topo = (DATA / "topo" / "13-2x-a100-nv12-5nic.txt").read_text()
        await call("POST", f"/v1/pools/{pool}/nodes/import", json={"name": "walk-b", "topo": topo})
        await call("GET", f"/v1/pools/{pool}/nodes", params={"limit": 1})
        await call("GET", f"/v1/nodes/{node}")
        await call("POST", f"/v1/nodes/{node}/cordon")
        await call("POST", f"/v1/nodes/{node}/uncordon")
        await call(
            "PUT", f"/v1/nodes/{node}/taints", json={"taints": [{"key": "dedicated", "value": "acme"}]}
        )
        await call("PUT", f"/v1/nodes/{node}/labels", json={"labels": {"rack": "r1"}})
        await call("POST", f"/v1/nodes/{node}/health", json={"ready": True})
        hello = {"poolId": pool, "name": "walk-agent", "topo": topo, "capabilities": ["devices.limits"]}
        agent_node = (await call("POST", "/v1/nodes/hello", json=hello)).json()["nodeId"]
        await call("POST", f"/v1/nodes/{agent_node}/heartbeat", json={"devices": []})
        await call("PUT", f"/v1/tenants/acme/quotas/{pool}", json={"limits": {"gpu": 16}})
        await call("GET", f"/v1/tenants/acme/quotas/{pool}")
        body = {
            "tenantId": "acme",
            "poolId": pool,
            "devices": [{"class": "gpu", "count": 2, "selector": "gpuProduct in (H100-SXM5-80GB)"}],
            "resources": {"cpu": 4},
            "duration": "1h",
            "idempotencyKey": "walk-1",
        }
        await call("POST", "/v1/capacity/preview", json=body)
        await call("POST", "/v1/capacity/preview", json={**body, "devices": [{"class": "gpu", "count": 64}]})
        placed = (await call("POST", "/v1/reservations", json=body)).json()
        await call("POST", "/v1/reservations", json=body)  # the idempotent retry: 200
        pending = {**body, "devices": [{"class": "gpu", "count": 64}], "idempotencyKey": "walk-2"}
        await call("POST", "/v1/reservations", json=pending)
        await call("GET", f"/v1/reservations/{placed['id']}")
        await call("GET", f"/v1/reservations/{placed['id']}", params={"waitSeconds": 1})
        await call("GET", f"/v1/reservations/{placed['id']}", params={"waitSeconds": 31})
        bulk = [{**body, "idempotencyKey": "walk-b1"}, {**body, "devices": []}, body]
        await call("POST", "/v1/reservations/batch", json={"items": bulk})
        await call("POST", "/v1/reservations/batch", json={"items": []})
        await call("GET", "/v1/reservations", params={"limit": 1})
        await call("GET", f"/v1/pools/{pool}/occupancy")  # bookings and scalar steps
        await call("GET", f"/v1/pools/{pool}/occupancy", params={"from": "2026-12-01T12:00:00"})  # 422
        later = datetime.fromisoformat(placed["allocations"][0]["end"]) + timedelta(hours=1)
        extend = f"/v1/reservations/{placed['id']}/extend"
        await call("POST", extend, json={"end": later.isoformat()})  # 200
        await call("POST", extend, json={"end": "2000-01-01T00:00:00Z"})  # 422: before its end
        await call("POST", f"/v1/reservations/{placed['id']}/release")
        await call("GET", "/v1/usage", params={"groupBy": "node"})  # the released one's hours
        await call("GET", "/v1/usage", params={"groupBy": "resource", "to": "2026-12-01T12:00:00Z"})
        await call("GET", "/v1/usage", params={"groupBy": "rack"})  # 422
        await call("POST", extend, json={"end": (later + timedelta(hours=1)).isoformat()})  # 409: released
        await call("POST", "/v1/reservations", json={**body, "devices": [{"class": "gpu", "count": 0}]})
        fleet = json.loads((DATA / "explain" / "seed-fleet.json").read_text())
        request = json.loads((DATA / "explain" / "seed-request.json").read_text())
        now = "2026-10-12T12:00:00+00:00"
        await call("POST", "/v1/placement/explain", json={"fleet": fleet, "request": request, "now": now})
        await call("POST", "/v1/placement/fleet", json={"base": fleet, "now": now})
        record = {"job_id": "j1", "kind": "local", "target": "workstation", "state": "succeeded", "cpus": 4}
        await call("PUT", "/v1/placement/jobs/j1", json={**record, "finished_at": now})
        await call("GET", "/v1/placement/jobs")
        await call("GET", "/v1/audit", params={"limit": 2})  # the audit log: the requests above
        await call("POST", "/v1/placement/compare", json={"fleet": fleet, "now": now})
        await call("POST", f"/v1/nodes/{node}/drain", json={"reschedule": True})
        await call("POST", f"/v1/nodes/{node}/drain")  # no body: reschedule false
        await call("POST", f"/v1/nodes/{node}/undrain")
        spare = (await call("POST", f"/v1/pools/{pool}/nodes", json=gpu_node("walk-c", 2))).json()["id"]
        await call("DELETE", f"/v1/nodes/{spare}")
        await call("DELETE", f"/v1/nodes/{spare}")  # 404: deleted
        await call("POST", f"/v1/pools/{pool}/archive")
        await call("POST", "/v1/capacity/preview", json={**body, "idempotencyKey": "walk-3"})

    answered = {op for op, statuses in recorder.seen.items() if any(200 <= s < 300 for s in statuses)}
    assert answered == {op["operationId"] for _, _, op in _operations()}
    assert recorder.seen["createReservation"] >= {200, 201, 422}


def _error_classes(cls: type) -> list[type]:
    return [cls, *(c for sub in cls.__subclasses__() for c in _error_classes(sub))]


def test_the_codes_each_error_answer_names_exist_with_that_status() -> None:
    import app.main  # noqa: F401  (every router, so every AppError subclass, is imported)
    from app.errors import AppError

    statuses = {cls.code: cls.status for cls in _error_classes(AppError)}
    for method, path, op in _operations():
        for status, answer in op["responses"].items():
            if status[0] not in "45":
                continue
            codes = re.findall(r"\b[A-Z][A-Z_]{3,}\b", answer["description"])
            assert codes, (method, path, status)
            for code in codes:
                assert statuses.get(code) == int(status), (op["operationId"], status, code)
    conflicts = DOC["paths"]["/v1/pools"]["post"]["responses"]["409"]["description"]
    assert conflicts == "CONFLICT"

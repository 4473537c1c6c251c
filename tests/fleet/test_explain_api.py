"""``POST /v1/placement/explain`` against the real app (real PostgreSQL behind the auth): the same JSON as
the CLI for the same inputs, 422 INVALID_INPUT naming the field, 401 / 403 without the grant."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from app.fleet.cli import placement_app

DATA = Path(__file__).resolve().parents[1] / "data" / "explain"
NOW = "2026-10-12T12:00:00+00:00"


def load(name: str) -> dict[str, Any]:
    return json.loads((DATA / name).read_text())


def cli_json(*args: str) -> dict[str, Any]:
    result = CliRunner().invoke(placement_app, ["explain", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


async def test_same_json_as_the_cli(admin_client: httpx.AsyncClient) -> None:
    body = {"fleet": load("seed-fleet.json"), "request": load("seed-request.json"), "now": NOW}
    r = await admin_client.post("/v1/placement/explain", json=body)
    assert r.status_code == 200, r.text
    fleet, request = str(DATA / "seed-fleet.json"), str(DATA / "seed-request.json")
    assert r.json() == cli_json(fleet, request, "--now", NOW)
    assert r.json() == load("seed-explain.json")


async def test_same_json_as_the_cli_with_estimate_and_max_age(admin_client: httpx.AsyncClient) -> None:
    body = {
        "fleet": load("seed-fleet.json"),
        "request": load("seed-request-for-estimate.json"),
        "now": NOW,
        "maxAge": 30,
        "estimate": load("seed-estimate.json"),
    }
    r = await admin_client.post("/v1/placement/explain", json=body)
    assert r.status_code == 200, r.text
    expected = cli_json(
        str(DATA / "seed-fleet.json"),
        str(DATA / "seed-request-for-estimate.json"),
        "--now",
        NOW,
        "--max-age",
        "30",
        "--estimate",
        str(DATA / "seed-estimate.json"),
    )
    assert r.json() == expected
    assert r.json()["held"] is True and r.json()["max_age_seconds"] == 30


@pytest.mark.parametrize(
    ("change", "path"),
    [
        (lambda b: b["fleet"]["targets"][1]["node"].__setitem__("cpus", 0), "fleet.targets.1.node.cpus"),
        (lambda b: b["fleet"].__setitem__("schema_name", "vq.placement-fleet/9"), "fleet.schema_name"),
        (lambda b: b["request"].__setitem__("cpus", 17), "request.cpus"),
        (
            lambda b: b.__setitem__("estimate", {"schema_name": "vq.estimate-receipt/1"}),
            "estimate.schema_name",
        ),
        (lambda b: b.__setitem__("now", "2026-10-12T12:00:00"), "now"),
    ],
)
async def test_malformed_documents_are_422_naming_the_field(
    admin_client: httpx.AsyncClient, change: Any, path: str
) -> None:
    body = {"fleet": load("seed-fleet.json"), "request": load("seed-request.json"), "now": NOW}
    change(body)
    r = await admin_client.post("/v1/placement/explain", json=body)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "INVALID_INPUT"
    assert error["details"]["path"] == path


async def test_needs_a_key_with_the_explain_grant(
    admin_client: httpx.AsyncClient, anon_client: httpx.AsyncClient, client_for: Any
) -> None:
    body = {"fleet": load("seed-fleet.json"), "request": load("seed-request.json"), "now": NOW}
    assert (await anon_client.post("/v1/placement/explain", json=body)).status_code == 401
    keys = {}
    for name, action in (("reader", "compute:capacity:read"), ("planner", "compute:placement:explain")):
        r = await admin_client.post(
            "/v1/api-keys", json={"principal": name, "grants": [{"action": action, "resource": "*"}]}
        )
        assert r.status_code == 201, r.text
        keys[name] = r.json()["key"]
    async with client_for(keys["reader"]) as reader:
        r = await reader.post("/v1/placement/explain", json=body)
        assert r.status_code == 403 and r.json()["error"]["code"] == "FORBIDDEN"
    async with client_for(keys["planner"]) as planner:
        r = await planner.post("/v1/placement/explain", json=body)
        assert r.status_code == 200 and r.json()["selected"]["target"] == "cluster-a/compute"

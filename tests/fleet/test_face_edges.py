"""Edges of the explain / fleet faces found by a newcomer's trial: the estimate's program mismatch names
the estimate document, a JSON object naming one target twice is refused over HTTP, a body that is not
JSON has no field path, and a rebuilt fleet keeps each record as written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
from test_build import NOW, answer, base_fleet
from typer.testing import CliRunner

from app.fleet.cli import placement_app

DATA = Path(__file__).resolve().parents[1] / "data" / "explain"


def _load(name: str) -> dict[str, Any]:
    return json.loads((DATA / name).read_text())


async def test_estimate_for_another_program_names_the_estimate(
    admin_client: httpx.AsyncClient, tmp_path: Path
) -> None:
    estimate = {**_load("seed-estimate.json"), "program": "other"}
    body = {
        "fleet": _load("seed-fleet.json"),
        "request": _load("seed-request-for-estimate.json"),
        "estimate": estimate,
        "now": NOW.isoformat(),
    }
    r = await admin_client.post("/v1/placement/explain", json=body)
    assert r.status_code == 422 and r.json()["error"]["details"]["path"] == "estimate.program"
    path = tmp_path / "est.json"
    path.write_text(json.dumps(estimate))
    result = CliRunner().invoke(
        placement_app,
        [
            "explain",
            str(DATA / "seed-fleet.json"),
            str(DATA / "seed-request-for-estimate.json"),
            "--estimate",
            str(path),
            "--now",
            NOW.isoformat(),
        ],
    )
    assert result.exit_code == 2 and str(path) in result.output and "program" in result.output


async def test_two_answers_for_one_target_are_refused_over_http(admin_client: httpx.AsyncClient) -> None:
    one = json.dumps(answer())
    raw = (
        '{"base": ' + json.dumps(base_fleet()) + ', "now": "' + NOW.isoformat() + '", '
        '"capacity": {"workstation": ' + one + ', "workstation": ' + one + "}}"
    )
    r = await admin_client.post(
        "/v1/placement/fleet", content=raw, headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 422, r.text
    assert r.json()["error"]["details"]["path"] == "workstation"
    assert "named twice" in r.json()["error"]["message"]


async def test_a_body_that_is_not_json_has_no_field_path(admin_client: httpx.AsyncClient) -> None:
    r = await admin_client.post(
        "/v1/placement/explain", content='{"fleet": ', headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 422
    error = r.json()["error"]
    assert error["code"] == "INVALID_INPUT" and error["details"]["path"] == ""
    assert "not valid JSON" in error["message"]


def test_rebuilt_fleet_keeps_records_without_evidence_as_written(tmp_path: Path) -> None:
    base = tmp_path / "base.json"
    base.write_text(json.dumps(base_fleet()))
    cap = tmp_path / "cap.json"
    cap.write_text(json.dumps(answer()))
    out = tmp_path / "out.json"
    result = CliRunner().invoke(
        placement_app,
        ["fleet", str(base), "-o", str(out), "--capacity", f"workstation={cap}", "--now", NOW.isoformat()],
    )
    assert result.exit_code == 0, result.output
    rebuilt = {t["name"]: t for t in json.loads(out.read_text())["targets"]}
    written = {t["name"]: t for t in base_fleet()["targets"]}
    for name in ("lab-node", "cluster-a/compute", "cluster-c/any"):
        assert rebuilt[name] == written[name], name  # no maintenance/speed defaults added
    assert rebuilt["workstation"]["free"]["cpus"] == 24

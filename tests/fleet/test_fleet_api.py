"""POST /v1/placement/fleet and /v1/placement/compare through the real app (httpx, real PostgreSQL)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from test_build import NOW, OLD, answer, base_fleet, waits_jobs
from test_compare import fleet as compare_fleet
from test_compare import records

from app.fleet.documents import dump_document

DATA = Path(__file__).resolve().parent.parent / "data"


def _pbs(name: str) -> str:
    (path,) = (DATA / "pbs").glob(f"{name}*.txt")
    return path.read_text()


async def test_fleet_endpoint_applies_every_kind_of_evidence(admin_client: httpx.AsyncClient) -> None:
    body: dict[str, Any] = {
        "base": base_fleet(),
        "now": NOW.isoformat(),
        "capacity": {"workstation": answer()},
        "queueHistory": {
            "cluster-a/compute": {
                "target": "cluster-a",
                "jobs": [j.model_dump(exclude_none=True) for j in waits_jobs([1, 2, 3, 4, 5])],
            }
        },
        "schedulerShape": {
            "cluster-a/compute": {"sinfo": "48|190000|gpu:4|2:00:00|1-4\n"},
            "cluster-b/gpu": {"qstat": _pbs("qstat-01"), "pbsnodes": _pbs("pbsnodes-01")},
        },
        "runtimeRoot": {
            "lab-node": {
                "schema_name": "vq.runtime-generations/1",
                "root": "/opt/r",
                "programs": {
                    "vibe-qc": {"current": "f" * 64, "generations": [{"id": "f" * 64, "verified": True}]}
                },
            }
        },
    }
    response = await admin_client.post("/v1/placement/fleet", json=body)
    assert response.status_code == 200, response.text
    result = response.json()
    targets = {t["name"]: t for t in result["fleet"]["targets"]}
    assert targets["workstation"]["free"] == {"cpus": 24, "mem_mb": 64000, "gpus": 1}
    assert targets["cluster-a/compute"]["queue_wait_seconds"] == {"low": 60, "high": 300, "source": "history"}
    assert targets["cluster-a/compute"]["node"]["cpus"] == 48
    assert targets["cluster-b/gpu"]["node"]["mem_mb"] == 386704
    assert targets["lab-node"]["programs"]["vibe-qc"] == ["f" * 64]
    assert targets["slow-host"]["observed_at"] == OLD
    assert {(r["target"], r["source"], r["outcome"]) for r in result["report"]} == {
        ("lab-node", "runtime-root", "applied"),
        ("workstation", "capacity", "applied"),
        ("cluster-a/compute", "queue-history", "applied"),
        ("cluster-a/compute", "scheduler-shape", "applied"),
        ("cluster-b/gpu", "scheduler-shape", "applied"),
    }


async def test_fleet_endpoint_refusals_name_the_field(admin_client: httpx.AsyncClient) -> None:
    cases = [
        ({"capacity": {"cluster-a/compute": answer()}}, "capacity.cluster-a/compute"),
        ({"capacity": {"workstation": {**answer(), "free_cpus": -1}}}, "capacity.workstation.free_cpus"),
        (
            {"schedulerShape": {"cluster-c/any": {"sinfo": "1|1|(null)|1|1\n"}}},
            "schedulerShape.cluster-c/any",
        ),
        ({"schedulerShape": {"cluster-a/compute": {"slurm": "x"}}}, "schedulerShape.cluster-a/compute"),
        ({"queueHistory": {"workstation": {"jobs": []}}}, "queueHistory.workstation"),
        (
            {"queueHistory": {"cluster-a/compute": {"jobs": [{"job_id": "x"}]}}},
            "queueHistory.cluster-a/compute.jobs.0.kind",
        ),
        (
            {
                "runtimeRoot": {
                    "workstation": {"schema_name": "vq.runtime-generations/1", "root": "rel", "programs": {}}
                }
            },
            "runtimeRoot.workstation.root",
        ),
    ]
    for extra, path in cases:
        response = await admin_client.post("/v1/placement/fleet", json={"base": base_fleet(), **extra})
        assert response.status_code == 422, (extra, response.text)
        assert response.json()["error"]["details"]["path"] == path


async def test_compare_endpoint_totals(admin_client: httpx.AsyncClient) -> None:
    body = {
        "fleet": dump_document(compare_fleet()),
        "history": {
            "schema_name": "vq.job-history/1",
            "jobs": [j.model_dump(exclude_none=True) for j in records()],
        },
        "now": NOW.isoformat(),
    }
    response = await admin_client.post("/v1/placement/compare", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["totals"] == {
        "compared": 6,
        "same": 3,
        "different": 1,
        "held_by_either": 2,
        "skipped": 1,
    }
    bad = await admin_client.post("/v1/placement/compare", json={**body, "history": {"schema_name": "x"}})
    assert bad.status_code == 422 and bad.json()["error"]["details"]["path"] == "history.schema_name"


async def test_fleet_and_compare_need_a_key(anon_client: httpx.AsyncClient) -> None:
    assert (await anon_client.post("/v1/placement/fleet", json={"base": base_fleet()})).status_code == 401
    assert (
        await anon_client.post("/v1/placement/compare", json={"fleet": {}, "history": {}})
    ).status_code == 401

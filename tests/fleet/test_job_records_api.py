"""Job records stored by the service feed compare (issue 6: "stored by the service: an endpoint ...")."""

from __future__ import annotations

import httpx


def _record(job_id: str, **extra: object) -> dict[str, object]:
    return {
        "job_id": job_id,
        "kind": "scheduler",
        "target": "cluster-a/compute",
        "state": "succeeded",
        "scheduler_submitted_at": "2026-10-12T08:00:00+00:00",
        "scheduler_started_at": "2026-10-12T09:00:00+00:00",
        **extra,
    }


async def test_record_and_read_back_job_history(admin_client: httpx.AsyncClient) -> None:
    for i in range(3):
        r = await admin_client.put(f"/v1/placement/jobs/j{i}", json=_record(f"j{i}"))
        assert r.status_code == 200, r.text
    # a newer record of the same job replaces the older one
    await admin_client.put("/v1/placement/jobs/j0", json=_record("j0", state="failed"))
    history = (await admin_client.get("/v1/placement/jobs", params={"kind": "scheduler"})).json()
    assert history["schema_name"] == "vq.job-history/1"
    assert sorted(j["job_id"] for j in history["jobs"]) == ["j0", "j1", "j2"]
    assert next(j for j in history["jobs"] if j["job_id"] == "j0")["state"] == "failed"
    assert (await admin_client.get("/v1/placement/jobs", params={"kind": "local"})).json()["jobs"] == []


async def test_bad_job_records_are_422_and_store_nothing(admin_client: httpx.AsyncClient) -> None:
    mismatch = await admin_client.put("/v1/placement/jobs/a", json=_record("b"))
    assert mismatch.status_code == 422 and mismatch.json()["error"]["details"]["path"] == "job_id"
    bad_state = await admin_client.put("/v1/placement/jobs/c", json=_record("c", state="exploded"))
    assert bad_state.status_code == 422 and bad_state.json()["error"]["details"]["path"] == "state"
    assert (await admin_client.get("/v1/placement/jobs")).json()["jobs"] == []


async def test_compare_reads_the_stored_records_when_the_body_has_none(
    admin_client: httpx.AsyncClient,
) -> None:
    from test_build import NOW
    from test_compare import fleet as compare_fleet
    from test_compare import records

    from app.fleet.documents import dump_document

    jobs = [j.model_dump(exclude_none=True) for j in records()]
    for job in jobs:
        assert (await admin_client.put(f"/v1/placement/jobs/{job['job_id']}", json=job)).status_code == 200
    body = {"fleet": dump_document(compare_fleet()), "now": NOW.isoformat()}
    stored = (await admin_client.post("/v1/placement/compare", json=body)).json()
    given = (
        await admin_client.post(
            "/v1/placement/compare",
            json={**body, "history": {"schema_name": "vq.job-history/1", "jobs": jobs}},
        )
    ).json()
    assert (
        stored["totals"]
        == given["totals"]
        == {
            "compared": 6,
            "same": 3,
            "different": 1,
            "held_by_either": 2,
            "skipped": 1,
        }
    )

"""placement compare (docs/fleet.md): totals by hand."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from app.fleet.compare import admission_blockers, compare_orderings, recent_finished_local_jobs, render_text
from app.fleet.documents import load_fleet
from app.fleet.history import JobRecord

NOW = datetime(2026, 10, 12, 12, 0, tzinfo=UTC)
SEEN = (NOW - timedelta(seconds=60)).isoformat()
D1 = "a" * 64


def fleet() -> Any:
    daemon = {"kind": "daemon", "observed_at": SEEN, "reachable": True, "programs": {"vibe-qc": [D1]}}
    return load_fleet(
        {
            "schema_name": "vq.placement-fleet/1",
            "targets": [
                {
                    "name": "alpha",
                    **daemon,
                    "walltime_unlimited": True,
                    "node": {"cpus": 16, "mem_mb": 64000},
                    "free": {"cpus": 16, "mem_mb": 64000},
                },
                {
                    "name": "beta",
                    **daemon,
                    "max_walltime_seconds": 7200,
                    "node": {"cpus": 8, "mem_mb": 32000},
                    "free": {"cpus": 8, "mem_mb": 32000},
                    "speed_factor": 2.0,
                    "speed_source": "benchmark",
                },
                {
                    "name": "gamma",
                    **daemon,
                    "maintenance": True,
                    "walltime_unlimited": True,
                    "node": {"cpus": 64, "mem_mb": 256000},
                    "free": {"cpus": 64, "mem_mb": 256000},
                },
                {
                    "name": "lane",
                    "kind": "scheduler",
                    "observed_at": SEEN,
                    "reachable": True,
                    "queue": "compute",
                    "programs": {"vibe-qc": [D1]},
                    "node": {"cpus": 128, "mem_mb": 512000},
                    "walltime_unlimited": True,
                },
            ],
        }
    )


def local(job_id: str, minutes_ago: int, **fields: Any) -> JobRecord:
    body = {
        "kind": "local",
        "target": "alpha",
        "state": "succeeded",
        "program": "vibe-qc",
        "cpus": 4,
        "mem_mb": 8000,
        "finished_at": (NOW - timedelta(minutes=minutes_ago)).isoformat(),
    }
    body.update(fields)
    return JobRecord(job_id=job_id, **body)


def records() -> list[JobRecord]:
    return [
        local("j1", 1),  # fits alpha and beta: capacity alpha (12 cpus left vs 4), completion beta (faster)
        local("j2", 2, cpus=12),  # beta too small: both alpha
        local("j3", 3, wall_time_seconds=10000),  # beta's limit is 7200 s: both alpha
        local("j4", 4, cpus=32, state="failed"),  # fits nowhere (gamma is closed): held by both
        local("j5", 5, mem_mb=None),  # no declared memory: skipped
        JobRecord(
            job_id="s1", kind="scheduler", target="lane", state="succeeded", finished_at=NOW.isoformat()
        ),
        local("j7", 0, state="running", finished_at=None),  # not finished: left out
        local("j8", 8, program="other"),  # installed nowhere: held
        local("j9", 9, cpus=2, mem_mb=40000),  # beta lacks memory: both alpha
        local("j10", 10, state="cancelled"),  # not finished: left out
    ]


def test_totals_computed_by_hand() -> None:
    comparison = compare_orderings(fleet(), records(), NOW)
    by_id = {item.job.job_id: item for item in comparison.jobs}
    assert [item.job.job_id for item in comparison.jobs] == ["j1", "j2", "j3", "j4", "j8", "j9"]
    assert (by_id["j1"].capacity.choice, by_id["j1"].completion_time.choice) == ("alpha", "beta")
    assert by_id["j1"].differ
    for same in ("j2", "j3", "j9"):
        assert (by_id[same].capacity.choice, by_id[same].completion_time.choice) == ("alpha", "alpha")
    for held in ("j4", "j8"):
        assert (by_id[held].capacity.choice, by_id[held].completion_time.choice) == (None, None)
    assert comparison.totals == {"compared": 6, "same": 3, "different": 1, "held_by_either": 2, "skipped": 1}
    assert comparison.skipped == (("j5", "no declared --mem-mb"),)


def test_blockers_are_reported_per_ordering() -> None:
    comparison = compare_orderings(fleet(), records(), NOW)
    by_id = {item.job.job_id: item for item in comparison.jobs}
    assert by_id["j2"].capacity.blockers == {"beta": ["cpus: 8 free, 12 needed"], "gamma": ["closed"]}
    assert by_id["j3"].capacity.blockers["beta"] == ["walltime: 10000 s requested, limit 7200 s"]
    assert by_id["j4"].capacity.blockers["alpha"] == ["cpus: 16 free, 32 needed"]
    assert by_id["j8"].capacity.blockers["alpha"] == ["program other not installed"]
    assert "lane" not in by_id["j1"].capacity.blockers  # scheduler lanes are not in the snapshot


def test_jobs_limit_takes_the_most_recent_finished_local_jobs() -> None:
    assert [r.job_id for r in recent_finished_local_jobs(records(), 3)] == ["j1", "j2", "j3"]
    comparison = compare_orderings(fleet(), records(), NOW, jobs=5)
    # j1..j5 are the five most recent finished local jobs; j5 is skipped for its missing memory
    assert comparison.totals == {"compared": 4, "same": 2, "different": 1, "held_by_either": 1, "skipped": 1}


def test_stale_snapshot_blocks_both_orderings() -> None:
    comparison = compare_orderings(fleet(), records(), NOW + timedelta(hours=1))
    assert comparison.totals["held_by_either"] == 6
    assert comparison.jobs[0].capacity.blockers["alpha"] == ["stale: observed 3660 s ago, max 300 s"]
    comparison = compare_orderings(fleet(), records(), NOW + timedelta(hours=1), max_age_seconds=7200)
    assert comparison.totals["same"] == 3


@pytest.mark.parametrize(
    ("changes", "blockers"),
    [
        ({"reachable": False}, ["unreachable"]),
        ({"free": None}, ["free capacity unknown"]),
        ({"observed_at": None}, ["no observation time"]),
        ({"observed_at": (NOW + timedelta(seconds=120)).isoformat()}, ["observed 120 s in the future"]),
        ({"walltime_unlimited": False}, ["walltime: 600 s requested, limit unknown"]),
    ],
)
def test_admission_blockers(changes: dict[str, Any], blockers: list[str]) -> None:
    data = fleet().model_dump(mode="json", exclude_none=True)
    alpha = {**data["targets"][0], **changes}
    alpha = {k: v for k, v in alpha.items() if v is not None}
    target = load_fleet({**data, "targets": [alpha]}).targets[0]
    job = local("x", 1, wall_time_seconds=600)
    assert admission_blockers(target, job, NOW, 300) == blockers


def test_json_and_text_reports() -> None:
    comparison = compare_orderings(fleet(), records(), NOW)
    body = comparison.to_json()
    assert body["schema_name"] == "vq.placement-compare/1"
    assert body["totals"]["different"] == 1
    assert body["jobs"][0]["capacity"] == {
        "choice": "alpha",
        "held": False,
        "blockers": {"gamma": ["closed"]},
    }
    text = render_text(comparison)
    assert "j1: capacity -> alpha, completion-time -> beta (differ)" in text
    assert text.endswith("compared 6: same 3, different 1, held by either 2; skipped 1\n")

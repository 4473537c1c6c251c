"""``better-compute placement fleet|compare`` (local faces of docs/explain.md's fleet build and compare)."""

from __future__ import annotations

import json
from pathlib import Path

from test_build import NOW, answer, base_fleet
from test_compare import fleet as compare_fleet
from test_compare import records
from typer.testing import CliRunner

from app.fleet.cli import placement_app
from app.fleet.documents import dump_document

runner = CliRunner()


def write(path: Path, body: object) -> Path:
    path.write_text(json.dumps(body))
    return path


def test_fleet_with_capacity_answers_only(tmp_path: Path) -> None:
    base = write(tmp_path / "base.json", base_fleet())
    ws = write(tmp_path / "ws.json", answer())
    out = tmp_path / "fleet.json"
    result = runner.invoke(
        placement_app, ["fleet", str(base), "--capacity", f"workstation={ws}", "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    fleet = json.loads(out.read_text())
    ws_record = next(t for t in fleet["targets"] if t["name"] == "workstation")
    assert ws_record["free"] == {"cpus": 24, "mem_mb": 64000, "gpus": 1}
    assert "workstation: capacity: applied: observed 2026-10-12T11:59:25+00:00" in result.stderr


def test_fleet_refuses_writing_over_the_base(tmp_path: Path) -> None:
    base = write(tmp_path / "base.json", base_fleet())
    result = runner.invoke(placement_app, ["fleet", str(base), "-o", str(base)])
    assert result.exit_code == 2
    assert "refusing to write over the base file" in result.stderr
    assert json.loads(base.read_text()) == base_fleet()


def test_fleet_refusals_exit_2(tmp_path: Path) -> None:
    base = write(tmp_path / "base.json", base_fleet())
    ws = write(tmp_path / "ws.json", answer())
    bad = write(tmp_path / "bad.json", {**answer(), "free_cpus": "many"})
    hosts = tmp_path / "hosts.toml"
    hosts.write_text('[hosts.cluster-a]\naddress = "127.0.0.1"\nuser = "x"\nport = 9\nscheduler = "slurm"\n')
    cases = [
        (["--capacity", f"cluster-a/compute={ws}"], "scheduler lane"),
        (["--capacity", f"workstation={ws}", "--capacity", f"workstation={ws}"], "two answers"),
        (["--capacity", f"workstation={bad}"], "free_cpus"),
        (["--capacity", f"workstation={ws}", "--collect", "workstation", "--hosts", str(hosts)], "both"),
        (["--collect", "workstation", "--hosts", str(hosts)], "not a configured"),
        (["--scheduler-shape", "cluster-c/any=cluster-a", "--hosts", str(hosts)], "no queue"),
        (["--runtime-root", "workstation=relative/root", "--hosts", str(hosts)], "not a configured"),
        (["--queue-history", "cluster-a/compute"], "needs --history"),
    ]
    for args, text in cases:
        result = runner.invoke(placement_app, ["fleet", str(base), *args])
        assert result.exit_code == 2, args
        assert text in result.stderr, (args, result.stderr)


def test_fleet_queue_history_from_a_job_history_file(tmp_path: Path) -> None:
    from test_build import waits_jobs

    base = write(tmp_path / "base.json", base_fleet())
    jobs = [job.model_dump(exclude_none=True) for job in waits_jobs([1, 2, 3, 4, 5])]
    history = write(tmp_path / "jobs.json", {"schema_name": "vq.job-history/1", "jobs": jobs})
    args = ["fleet", str(base), "--queue-history", "cluster-a/compute=cluster-a", "--history", str(history)]
    result = runner.invoke(placement_app, args)
    assert result.exit_code == 0, result.stderr
    lane = next(t for t in json.loads(result.stdout)["targets"] if t["name"] == "cluster-a/compute")
    # waits_jobs dates its jobs relative to the test's NOW; the CLI's clock is later, still within 14 days
    assert lane["queue_wait_seconds"]["source"] in ("history", "declared")


def test_compare_json(tmp_path: Path) -> None:
    fleet_path = write(tmp_path / "fleet.json", dump_document(compare_fleet()))
    jobs = [job.model_dump(exclude_none=True) for job in records()]
    history = write(tmp_path / "jobs.json", {"schema_name": "vq.job-history/1", "jobs": jobs})
    args = ["compare", str(fleet_path), "--history", str(history), "--now", NOW.isoformat(), "--json"]
    result = runner.invoke(placement_app, args)
    assert result.exit_code == 0, result.stderr
    body = json.loads(result.stdout)
    assert body["totals"] == {"compared": 6, "same": 3, "different": 1, "held_by_either": 2, "skipped": 1}
    again = runner.invoke(placement_app, args)
    assert again.stdout == result.stdout  # same files and --now: same report


def test_compare_malformed_history(tmp_path: Path) -> None:
    fleet_path = write(tmp_path / "fleet.json", dump_document(compare_fleet()))
    history = write(tmp_path / "jobs.json", {"schema_name": "vq.job-history/1", "jobs": [{"job_id": "x"}]})
    result = runner.invoke(placement_app, ["compare", str(fleet_path), "--history", str(history)])
    assert result.exit_code == 2
    assert "jobs.0.kind" in result.stderr

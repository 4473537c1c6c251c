"""Fleet build (docs/fleet.md .. "Daemon targets"): capacity overlay, queue history,
Slurm and PBS shapes, runtime roots, over an in-process SSH server; every refusal contacts no host."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fleet_sshd import Answer, FleetSSHServer

from app.errors import InvalidInput
from app.fleet.build import CapacityEvidence, FleetEvidence, ShapeEvidence, build_fleet
from app.fleet.build_plan import BuildPlan, FleetBuildRefused, check_plan, parse_assignment
from app.fleet.capacity import load_capacity_answer, overlay_capacity
from app.fleet.collect import build_from_hosts, capacity_command
from app.fleet.documents import PlacementFleet, dump_document, load_fleet
from app.fleet.history import JobRecord, nearest_rank, queue_wait_from_history
from app.fleet.pbs import pbsnodes_command, qstat_command
from app.fleet.runtimes import generations_command, load_runtime_listing, overlay_runtimes
from app.fleet.slurm import shape_command
from app.fleet.ssh import HostConfig

DATA = Path(__file__).resolve().parent.parent / "data"
NOW = datetime(2026, 10, 12, 12, 0, tzinfo=UTC)
OLD = "2026-10-12T09:00:00+00:00"
D1, D2, D3 = "a" * 64, "b" * 64, "c" * 64


def _pbs(name: str) -> str:
    (path,) = (DATA / "pbs").glob(f"{name}*.txt")
    return path.read_text()


def base_fleet() -> dict[str, Any]:
    daemon = {
        "kind": "daemon",
        "observed_at": OLD,
        "reachable": True,
        "os": "Linux",
        "programs": {"vibe-qc": [D1], "old-tool": [D3]},
        "walltime_unlimited": True,
        "node": {"cpus": 32, "mem_mb": 128000, "scratch_mb": 500000},
        "free": {"cpus": 32, "mem_mb": 120000, "scratch_mb": 250000},
    }
    lane = {
        "kind": "scheduler",
        "observed_at": OLD,
        "reachable": True,
        "programs": {"vibe-qc": [D1]},
        "node": {"cpus": 8, "mem_mb": 1000, "scratch_mb": 1000000},
        "max_walltime_seconds": 3600,
        "queue_wait_seconds": {"low": 60, "high": 600, "source": "declared"},
    }
    return {
        "schema_name": "vq.placement-fleet/1",
        "targets": [
            {"name": "workstation", **daemon},
            {"name": "lab-node", **daemon},
            {"name": "slow-host", **daemon},
            {"name": "loud-host", **daemon},
            {"name": "cluster-a/compute", **lane, "queue": "compute"},
            {"name": "cluster-b/gpu", **lane, "queue": "gpuQ"},
            {"name": "cluster-c/any", **lane},
        ],
    }


def answer(**overrides: Any) -> dict[str, Any]:
    body = {
        "schema_name": "vq.broker-capacity/1",
        "sampled_at": "2026-10-12T11:59:30+00:00",
        "snapshot_age_seconds": 5,
        "state_root_used": True,
        "admission": "open",
        "queue_ready": True,
        "free_cpus": 24,
        "free_mem_mb": 64000,
        "free_gpus": 1,
        "gpus": 2,
        "programs": {"vibe-qc": "OK", "old-tool": "MISSING"},
    }
    body.update(overrides)
    return body


def target(fleet: PlacementFleet, name: str) -> dict[str, Any]:
    return next(dump_document(t) for t in fleet.targets if t.name == name)


# --- capacity overlay ----------------------------------------------------------------------------


def test_overlay_sets_only_the_seed_fields() -> None:
    base = base_fleet()["targets"][0]
    record, _ = overlay_capacity(base, load_capacity_answer(answer()))
    assert record["observed_at"] == "2026-10-12T11:59:25+00:00"  # sampled_at less the snapshot age
    assert record["reachable"] is True
    assert record["free"] == {"cpus": 24, "mem_mb": 64000, "gpus": 1}
    assert record["node"] == {"cpus": 32, "mem_mb": 128000, "scratch_mb": 500000, "gpus": 2}
    assert record["programs"] == {"vibe-qc": [D1]}
    for kept in ("os", "walltime_unlimited", "kind", "name"):
        assert record[kept] == base[kept]


def test_answer_is_dated_by_this_hosts_clock_when_collected() -> None:
    called = datetime(2026, 10, 12, 11, 0, tzinfo=UTC)
    record, _ = overlay_capacity(base_fleet()["targets"][0], load_capacity_answer(answer()), called)
    assert record["observed_at"] == "2026-10-12T10:59:55+00:00"


@pytest.mark.parametrize(
    "overrides",
    [{"admission": "closed"}, {"queue_ready": False}, {"free_cpus": None}, {"free_mem_mb": None}],
)
def test_free_removed_unless_admission_open_and_queue_ready(overrides: dict[str, Any]) -> None:
    record, summary = overlay_capacity(base_fleet()["targets"][0], load_capacity_answer(answer(**overrides)))
    assert "free" not in record
    assert "nothing free now" in summary


def test_state_root_not_used_is_unreachable() -> None:
    record, _ = overlay_capacity(
        base_fleet()["targets"][0], load_capacity_answer(answer(state_root_used=False))
    )
    assert record["reachable"] is False


def test_unknown_gpus_keep_the_node_record() -> None:
    record, _ = overlay_capacity(base_fleet()["targets"][0], load_capacity_answer(answer(gpus=None)))
    assert "gpus" not in record["node"]


@pytest.mark.parametrize(
    ("data", "path"),
    [
        ({**answer(), "schema_name": "vq.other/1"}, "schema_name"),
        ({**answer(), "free_cpus": -1}, "free_cpus"),
        ({**answer(), "sampled_at": "2026-10-12T11:59:30"}, "sampled_at"),
        ({**answer(), "admission": "ajar"}, "admission"),
        ({**answer(), "surprise": 1}, "surprise"),
        ({k: v for k, v in answer().items() if k != "state_root_used"}, "state_root_used"),
    ],
)
def test_malformed_answer_is_refused(data: dict[str, Any], path: str) -> None:
    with pytest.raises(InvalidInput) as error:
        load_capacity_answer(data)
    assert error.value.path == path


# --- queue history --------------------------------------------------------------------------------


def job(job_id: str, submitted: str | None, started: str | None, target_name: str = "cluster-a") -> JobRecord:
    return JobRecord(
        job_id=job_id,
        kind="scheduler",
        target=target_name,
        state="succeeded",
        scheduler_submitted_at=submitted,
        scheduler_started_at=started,
    )


def waits_jobs(waits_minutes: list[int], start_hours_ago: int = 1) -> list[JobRecord]:
    records = []
    for i, wait in enumerate(waits_minutes):
        started = NOW - timedelta(hours=start_hours_ago + i)
        submitted = started - timedelta(minutes=wait)
        records.append(job(f"j{i:03d}", submitted.isoformat(), started.isoformat()))
    return records


def test_nearest_rank_percentiles() -> None:
    values = [float(v) for v in range(1, 11)]
    assert (nearest_rank(values, 10), nearest_rank(values, 90)) == (1.0, 9.0)
    assert (nearest_rank([5.0], 10), nearest_rank([5.0], 90)) == (5.0, 5.0)
    five = [10.0, 20.0, 30.0, 40.0, 50.0]
    assert (nearest_rank(five, 10), nearest_rank(five, 90)) == (10.0, 50.0)


def test_history_interval_from_recorded_waits() -> None:
    # 20 waits of 1..20 minutes: p10 = rank 2 = 120 s, p90 = rank 18 = 1080 s.
    outcome = queue_wait_from_history(waits_jobs(list(range(1, 21))), "cluster-a", NOW)
    assert outcome.queue_wait is not None
    assert (outcome.queue_wait.low, outcome.queue_wait.high, outcome.queue_wait.source) == (
        120,
        1080,
        "history",
    )
    assert outcome.used == 20


def test_history_exclusions_and_window() -> None:
    records = waits_jobs([1, 2, 3, 4, 5])
    records += [
        job("missing", None, NOW.isoformat()),
        job("garbled", "yesterday", NOW.isoformat()),
        job("naive", "2026-10-12T10:00:00", NOW.isoformat()),
        job("backwards", (NOW - timedelta(hours=1)).isoformat(), (NOW - timedelta(hours=2)).isoformat()),
        job("future", (NOW - timedelta(hours=1)).isoformat(), (NOW + timedelta(hours=1)).isoformat()),
        job(
            "ancient", (NOW - timedelta(days=20, hours=1)).isoformat(), (NOW - timedelta(days=20)).isoformat()
        ),
        job("elsewhere", (NOW - timedelta(hours=3)).isoformat(), (NOW - timedelta(hours=1)).isoformat(), "b"),
    ]
    outcome = queue_wait_from_history(records, "cluster-a", NOW)
    assert outcome.used == 5
    assert outcome.queue_wait is not None and (outcome.queue_wait.low, outcome.queue_wait.high) == (60, 300)
    assert outcome.excluded == {
        "missing times": 1,
        "unparsable times": 2,
        "backwards": 1,
        "in the future": 1,
        "started over 14 days ago": 1,
    }


def test_history_uses_the_most_recent_jobs_only() -> None:
    # 60 jobs; the 50 most recent (started 1..50 h ago) waited 1 minute, the older 10 waited 100.
    records = waits_jobs([1] * 50 + [100] * 10)
    outcome = queue_wait_from_history(records, "cluster-a", NOW)
    assert outcome.queue_wait is not None and (outcome.queue_wait.low, outcome.queue_wait.high) == (60, 60)
    outcome = queue_wait_from_history(records, "cluster-a", NOW, jobs=60)
    assert outcome.queue_wait is not None and outcome.queue_wait.high == 6000


def test_too_few_waits_keep_the_base() -> None:
    outcome = queue_wait_from_history(waits_jobs([1, 2, 3, 4]), "cluster-a", NOW)
    assert outcome.queue_wait is None
    assert "fewer than 5" in outcome.message(5)
    assert (
        queue_wait_from_history(waits_jobs([1, 2, 3, 4]), "cluster-a", NOW, minimum=4).queue_wait is not None
    )


def test_history_applied_and_kept_in_the_build() -> None:
    base = load_fleet(base_fleet())
    evidence = FleetEvidence(
        queue_history=[("cluster-a/compute", "cluster-a"), ("cluster-b/gpu", "cluster-b")],
        jobs=waits_jobs([1, 2, 3, 4, 5]),
    )
    result = build_fleet(base, evidence, NOW)
    assert target(result.fleet, "cluster-a/compute")["queue_wait_seconds"] == {
        "low": 60,
        "high": 300,
        "source": "history",
    }
    assert target(result.fleet, "cluster-b/gpu")["queue_wait_seconds"]["source"] == "declared"
    assert [(e.target, e.outcome) for e in result.report] == [
        ("cluster-a/compute", "applied"),
        ("cluster-b/gpu", "kept"),
    ]
    # the observation time of a lane is not refreshed by its history
    assert target(result.fleet, "cluster-a/compute")["observed_at"] == OLD


# --- runtime listings -----------------------------------------------------------------------------


def listing(**programs: Any) -> dict[str, Any]:
    return {
        "schema_name": "vq.runtime-generations/1",
        "root": "/opt/portable-runtimes/vibe-qc",
        "programs": programs,
    }


def test_runtime_overlay_orders_current_first_then_identity() -> None:
    doc = load_runtime_listing(
        listing(
            **{
                "vibe-qc": {
                    "current": D2,
                    "generations": [
                        {"id": D3, "verified": True},
                        {"id": D2, "verified": True},
                        {"id": D1, "verified": True},
                        {"id": "d" * 64, "verified": False},
                    ],
                },
                "new-tool": {"current": "e" * 64, "generations": [{"id": "e" * 64, "verified": False}]},
                "bad name!": {"generations": [{"id": D1, "verified": True}]},
                "other": {"current": "x" * 64, "generations": [{"id": D3, "verified": True}]},
            }
        )
    )
    programs, skipped = overlay_runtimes({"vibe-qc": [D1], "old-tool": [D3]}, doc)
    assert programs == {"vibe-qc": [D2, D1, D3], "old-tool": [D3], "other": [D3]}
    assert "program 'bad name!': not a placement program name" in skipped
    assert "program new-tool: no verified generation, base record kept" in skipped
    assert "program vibe-qc: 1 unverified generation(s) not counted" in skipped


# --- plan refusals (pure) -------------------------------------------------------------------------

HOSTS: dict[str, Any] = {
    "workstation": None,
    "lab-node": None,
    "slow-host": None,
    "loud-host": None,
    "cluster-a": "slurm",
    "cluster-b": "pbs",
    "cluster-a/compute": "slurm",
}

REFUSALS = [
    (BuildPlan(capacity=("nowhere",)), "capacity.nowhere", "no such target"),
    (BuildPlan(capacity=("cluster-a/compute",)), "capacity.cluster-a/compute", "scheduler lane"),
    (BuildPlan(capacity=("workstation", "workstation")), "capacity.workstation", "two answers"),
    (BuildPlan(collect=("cluster-a/compute",)), "collect.cluster-a/compute", "scheduler lane"),
    (BuildPlan(collect=("nowhere",)), "collect.nowhere", "no such target"),
    (BuildPlan(collect=("workstation",), capacity=("workstation",)), "collect.workstation", "both"),
    (BuildPlan(collect=("lab-node", "lab-node")), "collect.lab-node", "named twice"),
    (BuildPlan(queue_history=(("workstation", "x"),)), "queue-history.workstation", "not a scheduler lane"),
    (BuildPlan(queue_history=(("nowhere", "x"),)), "queue-history.nowhere", "not a scheduler lane"),
    (
        BuildPlan(queue_history=(("cluster-a/compute", "a"), ("cluster-a/compute", "b"))),
        "queue-history.cluster-a/compute",
        "twice",
    ),
    (BuildPlan(scheduler_shape=(("workstation", "cluster-a"),)), "scheduler-shape.workstation", "not a"),
    (
        BuildPlan(scheduler_shape=(("cluster-c/any", "cluster-a"),)),
        "scheduler-shape.cluster-c/any",
        "no queue",
    ),
    (
        BuildPlan(scheduler_shape=(("cluster-a/compute", "workstation"),)),
        "scheduler-shape.cluster-a/compute",
        "not a configured Slurm or PBS host",
    ),
    (
        BuildPlan(scheduler_shape=(("cluster-a/compute", "nowhere"),)),
        "scheduler-shape.cluster-a/compute",
        "not a configured",
    ),
    (
        BuildPlan(scheduler_shape=(("cluster-a/compute", "cluster-a"), ("cluster-a/compute", "cluster-a"))),
        "scheduler-shape.cluster-a/compute",
        "twice",
    ),
    (BuildPlan(runtime_root=(("cluster-a/compute", "/opt/r"),)), "runtime-root.cluster-a/compute", "lane"),
    (BuildPlan(runtime_root=(("nowhere", "/opt/r"),)), "runtime-root.nowhere", "no such target"),
    (BuildPlan(runtime_root=(("workstation", "opt/r"),)), "runtime-root.workstation", "not an absolute"),
    (
        BuildPlan(runtime_root=(("workstation", "/opt/r"), ("workstation", "/opt/s"))),
        "runtime-root.workstation",
        "twice",
    ),
]


@pytest.mark.parametrize(("plan", "path", "text"), REFUSALS)
def test_plan_refusals(plan: BuildPlan, path: str, text: str) -> None:
    with pytest.raises(FleetBuildRefused) as error:
        check_plan(load_fleet(base_fleet()), plan, HOSTS)
    assert error.value.path == path
    assert text in error.value.message


def test_unconfigured_hosts_are_refused() -> None:
    hosts = {"workstation": None}
    with pytest.raises(FleetBuildRefused, match="not a configured"):
        check_plan(load_fleet(base_fleet()), BuildPlan(collect=("lab-node",)), hosts)
    with pytest.raises(FleetBuildRefused, match="not a configured"):
        check_plan(load_fleet(base_fleet()), BuildPlan(runtime_root=(("lab-node", "/opt/r"),)), hosts)


@pytest.mark.parametrize(
    ("text", "required", "pair"),
    [
        ("workstation=/tmp/a.json", True, ("workstation", "/tmp/a.json")),
        ("cluster-a/compute", False, ("cluster-a/compute", None)),
        ("cluster-a/compute=cluster-a", False, ("cluster-a/compute", "cluster-a")),
    ],
)
def test_assignments(text: str, required: bool, pair: tuple[str, str | None]) -> None:
    assert parse_assignment(text, "--x", value_required=required) == pair


@pytest.mark.parametrize(("text", "required"), [("workstation", True), ("=a", False), ("a=", False)])
def test_bad_assignments(text: str, required: bool) -> None:
    with pytest.raises(FleetBuildRefused):
        parse_assignment(text, "--x", value_required=required)


# --- scheduler shapes from supplied output (the HTTP face) ----------------------------------------


def test_slurm_shape_applied() -> None:
    sinfo = "64|512000+|gpu:a100:4(S:0-1)|2-00:00:00|1-16\n36|190000|gpu:a100:8|1-00:00:00|1-8\n"
    result = build_fleet(
        load_fleet(base_fleet()),
        FleetEvidence(shapes={"cluster-a/compute": ShapeEvidence("slurm", sinfo)}),
        NOW,
    )
    lane = target(result.fleet, "cluster-a/compute")
    assert lane["node"] == {"cpus": 36, "mem_mb": 190000, "gpus": 4, "scratch_mb": 1000000}
    assert (lane["max_walltime_seconds"], lane["walltime_unlimited"], lane["max_nodes"]) == (86400, False, 8)
    assert (lane["observed_at"], lane["reachable"]) == (NOW.isoformat(), True)


def test_slurm_all_infinite_is_unlimited_and_keeps_max_nodes() -> None:
    sinfo = "32|128000|(null)|infinite|1-infinite\n"
    result = build_fleet(
        load_fleet(base_fleet()),
        FleetEvidence(shapes={"cluster-a/compute": ShapeEvidence("slurm", sinfo)}),
        NOW,
    )
    lane = target(result.fleet, "cluster-a/compute")
    assert lane["walltime_unlimited"] is True and "max_walltime_seconds" not in lane
    assert "max_nodes" not in lane  # base had none; an unlimited job size keeps the base


def test_unparseable_slurm_answer_is_unreachable() -> None:
    result = build_fleet(
        load_fleet(base_fleet()),
        FleetEvidence(shapes={"cluster-a/compute": ShapeEvidence("slurm", "sinfo: error: nope\n")}),
        NOW,
    )
    lane = target(result.fleet, "cluster-a/compute")
    assert (lane["reachable"], lane["observed_at"]) == (False, NOW.isoformat())
    assert lane["node"]["cpus"] == 8  # the rest of the record is kept
    assert result.report[0].outcome == "unreachable"


def test_pbs_shape_from_torque_fixtures() -> None:
    shape = ShapeEvidence("pbs", qstat=_pbs("qstat-01"), pbsnodes=_pbs("pbsnodes-01"))
    result = build_fleet(load_fleet(base_fleet()), FleetEvidence(shapes={"cluster-b/gpu": shape}), NOW)
    lane = target(result.fleet, "cluster-b/gpu")
    assert lane["node"] == {"cpus": 28, "mem_mb": 386704, "gpus": 2, "scratch_mb": 1000000}
    assert lane["max_walltime_seconds"] == 3600  # no resources_max.walltime: base kept
    assert (lane["reachable"], lane["observed_at"], lane["maintenance"]) == (True, NOW.isoformat(), False)


def test_pbs_disabled_queue_is_maintenance_and_unrouted_nodes_keep_base() -> None:
    qstat = _pbs("qstat-01").replace("Queue: gpuQ", "Queue: gpuQ\n  resources_max.walltime = 48:00:00")
    qstat = qstat.replace("  started = True\n", "  started = False\n")
    nodes = _pbs("pbsnodes-01").replace("gpuQ", "otherQ")
    shape = ShapeEvidence("pbs", qstat=qstat, pbsnodes=nodes)
    result = build_fleet(load_fleet(base_fleet()), FleetEvidence(shapes={"cluster-b/gpu": shape}), NOW)
    lane = target(result.fleet, "cluster-b/gpu")
    assert (lane["maintenance"], lane["max_walltime_seconds"]) == (True, 172800)
    assert lane["node"] == {"cpus": 8, "mem_mb": 1000, "scratch_mb": 1000000}
    assert "routes to no usable node" in result.report[0].message


def test_pbs_without_qstat_answer_is_unreachable() -> None:
    shape = ShapeEvidence("pbs", failure="qstat: no answer")
    result = build_fleet(load_fleet(base_fleet()), FleetEvidence(shapes={"cluster-b/gpu": shape}), NOW)
    assert target(result.fleet, "cluster-b/gpu")["reachable"] is False


def test_capacity_failure_is_unreachable_nothing_free() -> None:
    evidence = FleetEvidence(collected={"workstation": CapacityEvidence(failure="no answer within 1 s")})
    result = build_fleet(load_fleet(base_fleet()), evidence, NOW)
    ws = target(result.fleet, "workstation")
    assert (ws["reachable"], ws["observed_at"], "free" in ws) == (False, NOW.isoformat(), False)
    assert (
        result.report[0].line()
        == "workstation: collect: unreachable: no answer (no answer within 1 s): nothing free"
    )


# --- live collection over the in-process SSH server -----------------------------------------------


def configured(server: FleetSSHServer) -> dict[str, HostConfig]:
    return {name: server.host(name, scheduler) for name, scheduler in HOSTS.items() if "/" not in name}


def script_hosts(server: FleetSSHServer, fleet: PlacementFleet) -> None:
    import json

    targets = {t.name: t for t in fleet.targets}
    server.answer(
        "workstation", capacity_command(targets["workstation"]), Answer(stdout=json.dumps(answer()))
    )
    server.answer(
        "lab-node",
        capacity_command(targets["lab-node"]),
        Answer(stdout=json.dumps(answer(admission="closed", gpus=None))),
    )
    server.answer("slow-host", capacity_command(targets["slow-host"]), Answer(hang=True))
    server.answer("loud-host", capacity_command(targets["loud-host"]), Answer(flood=3_000_000))
    server.answer(
        "cluster-a", shape_command("compute"), Answer(stdout="48|190000+|gpu:4,shard:16|2:00:00|1-4\n")
    )
    server.answer("cluster-b", qstat_command("gpuQ"), Answer(stdout=_pbs("qstat-01"), drop_first=True))
    server.answer("cluster-b", pbsnodes_command(), Answer(stdout=_pbs("pbsnodes-01")))
    server.answer(
        "lab-node",
        generations_command("/opt/portable-runtimes/vibe-qc"),
        Answer(
            stdout=json.dumps(
                listing(**{"vibe-qc": {"current": D2, "generations": [{"id": D2, "verified": True}]}})
            )
        ),
    )


async def test_live_build_against_ssh_hosts(ssh_server: FleetSSHServer) -> None:
    base = load_fleet(base_fleet())
    script_hosts(ssh_server, base)
    plan = BuildPlan(
        collect=("workstation", "lab-node", "slow-host", "loud-host"),
        scheduler_shape=(("cluster-a/compute", "cluster-a"), ("cluster-b/gpu", "cluster-b")),
        runtime_root=(("lab-node", "/opt/portable-runtimes/vibe-qc"),),
    )
    result = await build_from_hosts(
        base,
        plan,
        configured(ssh_server),
        timeout_seconds=1.5,
        max_output_bytes=1_000_000,
        clock=lambda: NOW,
    )
    ws = target(result.fleet, "workstation")
    assert ws["observed_at"] == "2026-10-12T11:59:55+00:00"  # our clock at the call less 5 s
    assert ws["free"] == {"cpus": 24, "mem_mb": 64000, "gpus": 1}
    assert ws["programs"] == {"vibe-qc": [D1]}
    lab = target(result.fleet, "lab-node")
    assert "free" not in lab and lab["reachable"] is True
    assert lab["programs"] == {"vibe-qc": [D2]}  # runtime root, then old-tool removed as MISSING
    for name in ("slow-host", "loud-host"):
        record = target(result.fleet, name)
        assert (record["reachable"], record["observed_at"], "free" in record) == (
            False,
            NOW.isoformat(),
            False,
        )
    lane_a = target(result.fleet, "cluster-a/compute")
    assert lane_a["node"] == {"cpus": 48, "mem_mb": 190000, "gpus": 4, "scratch_mb": 1000000}
    assert (lane_a["max_walltime_seconds"], lane_a["max_nodes"]) == (7200, 4)
    lane_b = target(result.fleet, "cluster-b/gpu")
    assert lane_b["node"] == {"cpus": 28, "mem_mb": 386704, "gpus": 2, "scratch_mb": 1000000}
    assert lane_b["reachable"] is True
    outcomes = {(e.target, e.source): (e.outcome, e.message) for e in result.report}
    assert outcomes[("slow-host", "collect")][0] == "unreachable"
    assert "no answer within 1.5 s" in outcomes[("slow-host", "collect")][1]
    assert "output exceeded 1000000 bytes" in outcomes[("loud-host", "collect")][1]
    # only the named hosts were contacted; cluster-b's qstat was replayed once after a dropped connection
    assert sorted(set(ssh_server.connections)) == [
        "cluster-a",
        "cluster-b",
        "lab-node",
        "loud-host",
        "slow-host",
        "workstation",
    ]
    assert ssh_server.connections.count("cluster-b") == 3
    assert (
        "workstation",
        "vq broker capacity --json --program old-tool --program vibe-qc",
    ) in ssh_server.commands


async def test_unreachable_scheduler_host(ssh_server: FleetSSHServer) -> None:
    base = load_fleet(base_fleet())
    ssh_server.answer("cluster-a", shape_command("compute"), Answer(hang=True))
    ssh_server.answer("cluster-b", qstat_command("gpuQ"), Answer(stdout=_pbs("qstat-01")))
    ssh_server.answer("cluster-b", pbsnodes_command(), Answer(flood=2_000_000))
    plan = BuildPlan(scheduler_shape=(("cluster-a/compute", "cluster-a"), ("cluster-b/gpu", "cluster-b")))
    result = await build_from_hosts(
        base, plan, configured(ssh_server), timeout_seconds=1, max_output_bytes=500_000, clock=lambda: NOW
    )
    assert target(result.fleet, "cluster-a/compute")["reachable"] is False
    lane_b = target(result.fleet, "cluster-b/gpu")
    assert lane_b["reachable"] is True and lane_b["node"]["cpus"] == 8  # pbsnodes failed: base node kept
    assert "pbsnodes failed" in next(e.message for e in result.report if e.target == "cluster-b/gpu")


async def test_runtime_root_without_listing_keeps_programs(ssh_server: FleetSSHServer) -> None:
    base = load_fleet(base_fleet())
    plan = BuildPlan(runtime_root=(("workstation", "/opt/none"),))
    result = await build_from_hosts(base, plan, configured(ssh_server), timeout_seconds=5, clock=lambda: NOW)
    ws = target(result.fleet, "workstation")
    assert ws["programs"] == {"vibe-qc": [D1], "old-tool": [D3]}
    assert ws["observed_at"] == OLD and ws["reachable"] is True  # a listing is not reachability evidence
    assert result.report[0].outcome == "kept" and "exit status 127" in result.report[0].message


@pytest.mark.parametrize(("plan", "path", "text"), REFUSALS)
async def test_refusals_contact_no_host(
    ssh_server: FleetSSHServer, plan: BuildPlan, path: str, text: str
) -> None:
    base = load_fleet(base_fleet())
    script_hosts(ssh_server, base)
    with pytest.raises(FleetBuildRefused) as error:
        await build_from_hosts(
            base,
            plan,
            configured(ssh_server) | {"cluster-a/compute": ssh_server.host("cluster-a", "slurm")},
            capacity={name: load_capacity_answer(answer()) for name in plan.capacity},
            timeout_seconds=5,
            clock=lambda: NOW,
        )
    assert error.value.path == path
    assert ssh_server.connections == []

"""Seed 004 "Hard requirements first": every requirement's accept and reject case, with its reason text.

Pure tests (no database): each case starts from an eligible target and request and changes one thing.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from app.fleet.documents import load_fleet, load_request
from app.fleet.explain import explain_placement
from app.fleet.prediction import Explanation

NOW = datetime(2026, 10, 12, 12, 0, 0, tzinfo=UTC)
DIGEST = "a" * 64
OTHER_DIGEST = "b" * 64


def lane(**changes: Any) -> dict[str, Any]:
    """An eligible scheduler lane for :func:`request` (seed 004's cluster-a/compute, completed)."""
    target = {
        "name": "cluster-a/compute",
        "kind": "scheduler",
        "observed_at": "2026-10-12T11:59:00+00:00",
        "reachable": True,
        "os": "Linux",
        "arch": "x86_64",
        "isa_levels": ["x86-64-v2", "x86-64-v3", "x86-64-v4"],
        "programs": {"vibe-qc": [DIGEST, OTHER_DIGEST]},
        "accounts": ["chem"],
        "queue": "compute",
        "data_access": ["shared-inputs", "results"],
        "licenses": ["solver-base", "solver-gradients"],
        "node": {"cpus": 128, "mem_mb": 512000, "scratch_mb": 1000000, "gpus": 4},
        "max_nodes": 16,
        "max_walltime_seconds": 172800,
        "queue_wait_seconds": {"low": 14400, "high": 28800, "source": "history"},
        "speed_factor": 2.0,
        "speed_source": "benchmark",
        "staging_mb_per_second": 200,
        "transfer_mb_per_second": 200,
    }
    return _apply(target, changes)


def daemon(**changes: Any) -> dict[str, Any]:
    """An eligible daemon host (seed 004's workstation, completed) for a request without a queue."""
    target = {
        "name": "workstation",
        "kind": "daemon",
        "observed_at": "2026-10-12T11:59:00+00:00",
        "reachable": True,
        "os": "Linux",
        "arch": "x86_64",
        "isa_levels": ["x86-64-v2", "x86-64-v3", "x86-64-v4"],
        "programs": {"vibe-qc": [DIGEST]},
        "accounts": ["chem"],
        "data_access": ["shared-inputs", "results"],
        "licenses": ["solver-base", "solver-gradients"],
        "walltime_unlimited": True,
        "node": {"cpus": 32, "mem_mb": 128000, "scratch_mb": 500000, "gpus": 2},
        "free": {"cpus": 32, "mem_mb": 120000, "scratch_mb": 250000, "gpus": 2},
        "staging_mb_per_second": 100,
        "transfer_mb_per_second": 100,
    }
    return _apply(target, changes)


def request(**changes: Any) -> dict[str, Any]:
    """Seed 004's example request (queue left out so that daemons can qualify)."""
    body = {
        "schema_name": "vq.placement-request/1",
        "program": "vibe-qc",
        "runtime_digest": DIGEST,
        "os": "Linux",
        "isa_level": "x86-64-v4",
        "account": "chem",
        "required_data_access": ["shared-inputs", "results"],
        "cpus": 16,
        "nodes": 1,
        "mem_mb_per_node": 64000,
        "mpi_ranks": 2,
        "threads_per_rank": 8,
        "scratch_mb_per_node": 100000,
        "wall_time_seconds": 14400,
        "runtime_seconds": {"low": 6000, "high": 8400},
        "input_mb": 100,
        "output_mb": 500,
    }
    return _apply(body, changes)


def _apply(document: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    out = dict(document)
    for key, value in changes.items():
        if value is DROP:
            out.pop(key, None)
        else:
            out[key] = value
    return out


DROP = object()


def explain(targets: list[dict[str, Any]], req: dict[str, Any], **kwargs: Any) -> Explanation:
    fleet = load_fleet({"schema_name": "vq.placement-fleet/1", "targets": targets})
    return explain_placement(fleet, load_request(req), kwargs.pop("now", NOW), **kwargs)


def reasons(target: dict[str, Any], req: dict[str, Any], **kwargs: Any) -> list[str]:
    """The reasons one target is rejected for; [] when it is a candidate."""
    result = explain([target], req, **kwargs)
    if result.candidates:
        assert not result.rejected
        return []
    return list(result.rejected[0].reasons)


def node(**changes: Any) -> dict[str, Any]:
    return _apply({"cpus": 128, "mem_mb": 512000, "scratch_mb": 1000000, "gpus": 4}, changes)


def test_base_documents_are_eligible() -> None:
    assert reasons(lane(), request()) == []
    assert reasons(daemon(), request()) == []
    assert reasons(lane(), request(queue="compute")) == []


CASES: list[tuple[str, dict[str, Any], dict[str, Any], list[str]]] = [
    # --- unreachable or in maintenance when observed
    ("reachable", lane(reachable=True), request(), []),
    ("unreachable", lane(reachable=False), request(), ["availability: unreachable when observed"]),
    ("reachability unknown", lane(reachable=DROP), request(), ["availability: reachability unknown"]),
    ("maintenance", lane(maintenance=True), request(), ["availability: in maintenance when observed"]),
    (
        "unreachable and in maintenance",
        daemon(reachable=False, maintenance=True),
        request(),
        ["availability: unreachable when observed", "availability: in maintenance when observed"],
    ),
    # --- freshness: max age (default 300 s, equality fits) and clock skew (more than 60 s ahead)
    ("age equals max age", lane(observed_at="2026-10-12T11:55:00+00:00"), request(), []),
    (
        "stale",
        lane(observed_at="2026-10-12T11:54:59+00:00"),
        request(),
        ["freshness: observed 301 s ago, older than the max age of 300 s"],
    ),
    ("60 s in the future", lane(observed_at="2026-10-12T12:01:00+00:00"), request(), []),
    (
        "61 s in the future",
        lane(observed_at="2026-10-12T12:01:01+00:00"),
        request(),
        ["freshness: observed 61 s in the future, beyond the 60 s clock-skew allowance"],
    ),
    ("other offset, same instant", lane(observed_at="2026-10-12T13:59:00+02:00"), request(), []),
    ("observation time unknown", lane(observed_at=DROP), request(), ["freshness: observation time unknown"]),
    # --- program and runtime digest (never substituted)
    ("program missing", lane(programs={"other": [DIGEST]}), request(), ["program: lacks vibe-qc"]),
    ("no programs", daemon(programs=DROP), request(), ["program: lacks vibe-qc"]),
    (
        "runtime digest missing",
        lane(programs={"vibe-qc": [OTHER_DIGEST]}),
        request(),
        [f"program: lacks vibe-qc runtime {DIGEST}"],
    ),
    ("runtime digest not current", lane(programs={"vibe-qc": [OTHER_DIGEST, DIGEST]}), request(), []),
    ("no digest requested", lane(programs={"vibe-qc": [OTHER_DIGEST]}), request(runtime_digest=DROP), []),
    # --- operating system (exact, case-sensitive)
    ("os differs", lane(os="Darwin"), request(), ["os: Darwin, want Linux"]),
    ("os case differs", lane(os="linux"), request(), ["os: linux, want Linux"]),
    ("os unknown", lane(os=DROP), request(), ["os: unknown, want Linux"]),
    ("os not requested", lane(os=DROP), request(os=DROP), []),
    # --- architecture and ISA level
    (
        "other architecture",
        lane(arch="aarch64", isa_levels=["armv8.2-a"]),
        request(),
        ["isa: arch aarch64 cannot run x86-64-v4 (x86_64)", "isa: x86-64-v4 not supported (supports armv8.2-a)"],
    ),
    (
        "other architecture, level listed",
        lane(arch="aarch64"),
        request(),
        ["isa: arch aarch64 cannot run x86-64-v4 (x86_64)"],
    ),
    ("arch alias amd64", lane(arch="amd64"), request(), []),
    ("arch unknown, level listed", lane(arch=DROP), request(), []),
    (
        "ISA level unsupported",
        lane(isa_levels=["x86-64-v2", "x86-64-v3"]),
        request(),
        ["isa: x86-64-v4 not supported (supports x86-64-v2, x86-64-v3)"],
    ),
    (
        "ISA levels unknown",
        lane(isa_levels=DROP),
        request(),
        ["isa: supported ISA levels unknown, want x86-64-v4"],
    ),
    ("ISA not requested", lane(isa_levels=DROP, arch="aarch64"), request(isa_level=DROP), []),
    # --- account (unknown permissions reject; exact match including case)
    ("account unknown", lane(accounts=DROP), request(), ["account: permitted accounts unknown, want chem"]),
    ("account case", lane(accounts=["Chem"]), request(), ["account: chem not permitted (permits Chem)"]),
    ("no accounts permitted", lane(accounts=[]), request(), ["account: chem not permitted (permits none)"]),
    ("account permitted", lane(accounts=["bio", "chem"]), request(), []),
    ("account not requested", lane(accounts=DROP), request(account=DROP), []),
    # --- queue / partition
    ("queue matches", lane(), request(queue="compute"), []),
    ("queue differs", lane(queue="debug"), request(queue="compute"), ["queue: debug, want compute"]),
    (
        "queue unknown, name matches",
        lane(name="compute", queue=DROP),
        request(queue="compute"),
        ["queue: unknown, want compute"],
    ),
    (
        "daemon with queue requested",
        daemon(),
        request(queue="compute"),
        ["queue: a daemon host has no queue, want compute"],
    ),
    ("queue not requested", lane(queue=DROP), request(queue=None), []),
    # --- data access
    ("data access lacking", lane(data_access=["results"]), request(), ["data_access: lacks shared-inputs"]),
    (
        "data access unknown",
        lane(data_access=DROP),
        request(),
        ["data_access: unknown, want shared-inputs, results"],
    ),
    (
        "data access none recorded",
        lane(data_access=[]),
        request(),
        ["data_access: lacks shared-inputs, results"],
    ),
    ("data access empty requirement", lane(data_access=DROP), request(required_data_access=[]), []),
    # --- licenses
    (
        "license lacking",
        lane(licenses=["solver-base"]),
        request(required_licenses=["solver-base", "solver-gradients"]),
        ["licenses: lacks solver-gradients"],
    ),
    (
        "licenses unknown",
        lane(licenses=DROP),
        request(required_licenses=["solver-base"]),
        ["licenses: unknown, want solver-base"],
    ),
    ("licenses held", lane(), request(required_licenses=["solver-base", "solver-gradients"]), []),
    ("licenses not required", lane(licenses=DROP), request(), []),
    # --- nodes per job
    (
        "too many nodes",
        lane(max_nodes=2),
        request(nodes=4, cpus=64, mpi_ranks=8, threads_per_rank=8, mem_mb_per_node=1000),
        ["nodes: needs 4, a job may have at most 2"],
    ),
    ("nodes at the limit", lane(max_nodes=4), request(nodes=4, cpus=64, mpi_ranks=8, threads_per_rank=8), []),
    (
        "node limit unknown",
        lane(max_nodes=DROP),
        request(nodes=2, cpus=32, mpi_ranks=4, threads_per_rank=8),
        ["nodes: needs 2, per-job node limit unknown"],
    ),
    ("one node, limit unknown", lane(max_nodes=DROP), request(), []),
    (
        "daemon is one node",
        daemon(),
        request(nodes=2, cpus=16, mpi_ranks=2, threads_per_rank=8),
        ["nodes: needs 2, a job may have at most 1"],
    ),
    # --- CPUs: the seed's worked example, three 8-thread ranks on two nodes
    (
        "whole-rank layout, 12-CPU lane",
        lane(node=node(cpus=12)),
        request(cpus=24, nodes=2, mpi_ranks=3, threads_per_rank=8),
        ["node_shape: needs 16 CPUs per node (3 ranks x 8 threads on 2 node(s)), node has 12"],
    ),
    (
        "whole-rank layout, 16-CPU lane",
        lane(node=node(cpus=16)),
        request(cpus=24, nodes=2, mpi_ranks=3, threads_per_rank=8),
        [],
    ),
    (
        "no layout: ceil(cpus / nodes) fits 12",
        lane(node=node(cpus=12)),
        request(cpus=24, nodes=2, mpi_ranks=DROP, threads_per_rank=DROP),
        [],
    ),
    (
        "no layout: ceil(25 / 2) = 13",
        lane(node=node(cpus=12)),
        request(cpus=25, nodes=2, mpi_ranks=DROP, threads_per_rank=DROP),
        ["node_shape: needs 13 CPUs per node (25 CPUs on 2 node(s)), node has 12"],
    ),
    (
        "node CPUs unknown",
        lane(node=node(cpus=DROP)),
        request(),
        ["node_shape: needs 16 CPUs per node (2 ranks x 8 threads on 1 node(s)), node CPUs unknown"],
    ),
    (
        "no node record",
        lane(node=DROP),
        request(scratch_mb_per_node=DROP),
        [
            "node_shape: needs 16 CPUs per node (2 ranks x 8 threads on 1 node(s)), node CPUs unknown",
            "node_shape: needs 64000 MB of memory per node, node memory unknown",
        ],
    ),
    # --- memory per node
    (
        "too little memory",
        lane(node=node(mem_mb=32000)),
        request(),
        ["node_shape: needs 64000 MB of memory per node, node has 32000 MB"],
    ),
    ("memory equal", lane(node=node(mem_mb=64000)), request(), []),
    (
        "memory unknown",
        lane(node=node(mem_mb=DROP)),
        request(),
        ["node_shape: needs 64000 MB of memory per node, node memory unknown"],
    ),
    ("memory not requested", lane(node=node(mem_mb=DROP)), request(mem_mb_per_node=DROP), []),
    # --- scratch per node (nodes never combine)
    (
        "too little scratch",
        lane(node=node(scratch_mb=50000)),
        request(),
        ["scratch: needs 100000 MB per node, node has 50000 MB"],
    ),
    (
        "zero scratch",
        lane(node=node(scratch_mb=0)),
        request(),
        ["scratch: needs 100000 MB per node, node has 0 MB"],
    ),
    (
        "scratch is per node",
        lane(node=node(scratch_mb=60000)),
        request(nodes=2, cpus=16, mpi_ranks=2, threads_per_rank=8),
        ["scratch: needs 100000 MB per node, node has 60000 MB"],
    ),
    (
        "scratch unknown",
        lane(node=node(scratch_mb=DROP)),
        request(),
        ["scratch: needs 100000 MB per node, node scratch unknown"],
    ),
    ("scratch not requested", lane(node=node(scratch_mb=DROP)), request(scratch_mb_per_node=DROP), []),
    # --- GPUs per node
    (
        "too few GPUs",
        lane(node=node(gpus=0)),
        request(gpus_per_node=2),
        ["gpus: needs 2 per node, node has 0"],
    ),
    ("GPUs fit", lane(node=node(gpus=2)), request(gpus_per_node=2), []),
    (
        "GPU count unknown",
        lane(node=node(gpus=DROP)),
        request(gpus_per_node=1),
        ["gpus: needs 1 per node, node GPU count unknown"],
    ),
    ("GPUs not requested", lane(node=node(gpus=DROP)), request(), []),
    # --- walltime limit
    ("walltime at the limit", lane(max_walltime_seconds=172800), request(wall_time_seconds=172800), []),
    (
        "walltime over the limit",
        lane(max_walltime_seconds=172800),
        request(wall_time_seconds=172801),
        ["walltime_limit: requests 172801 s, over the limit of 172800 s"],
    ),
    (
        "fast estimate does not admit an oversized request",
        lane(max_walltime_seconds=3600),
        request(wall_time_seconds=7200, runtime_seconds={"low": 60, "high": 120}),
        ["walltime_limit: requests 7200 s, over the limit of 3600 s"],
    ),
    (
        "walltime limit unknown",
        lane(max_walltime_seconds=DROP),
        request(),
        ["walltime_limit: unknown and not recorded as unlimited"],
    ),
    (
        "walltime limit unknown, no request",
        lane(max_walltime_seconds=DROP),
        request(wall_time_seconds=DROP),
        ["walltime_limit: unknown and not recorded as unlimited"],
    ),
    ("walltime unlimited", daemon(), request(wall_time_seconds=10_000_000, runtime_seconds=DROP), []),
    ("walltime checked without runtime", lane(), request(runtime_seconds=DROP, wall_time_seconds=172800), []),
    (
        "walltime checked without runtime, over",
        lane(),
        request(runtime_seconds=DROP, wall_time_seconds=172900),
        ["walltime_limit: requests 172900 s, over the limit of 172800 s"],
    ),
    # --- execution upper bound / speed against both limits (equality fits)
    (
        "execution equals requested walltime",
        lane(speed_factor=0.5, speed_source="declared"),
        request(runtime_seconds={"low": 6000, "high": 8400}, wall_time_seconds=16800),
        [],
    ),
    (
        "execution over requested walltime",
        lane(speed_factor=0.5, speed_source="declared"),
        request(runtime_seconds={"low": 6000, "high": 8400}, wall_time_seconds=16799),
        ["execution_bound: up to 16800 s (8400 s at speed 0.5) exceeds the requested walltime of 16799 s"],
    ),
    (
        "execution equality with a decimal speed",
        lane(speed_factor=0.7, speed_source="declared"),
        request(runtime_seconds={"low": 5, "high": 7}, wall_time_seconds=10),
        [],
    ),
    (
        "slow target cannot finish within the requested limit",
        daemon(speed_factor=0.25, speed_source="benchmark"),
        request(wall_time_seconds=14400),
        ["execution_bound: up to 33600 s (8400 s at speed 0.25) exceeds the requested walltime of 14400 s"],
    ),
    (
        "execution over the target's limit",
        lane(max_walltime_seconds=172800),
        request(wall_time_seconds=DROP, runtime_seconds={"low": 100000, "high": 400000}),
        ["execution_bound: up to 200000 s (400000 s at speed 2) exceeds the walltime limit of 172800 s"],
    ),
    (
        "execution at the target's limit",
        lane(max_walltime_seconds=172800),
        request(wall_time_seconds=DROP, runtime_seconds={"low": 100000, "high": 345600}),
        [],
    ),
    (
        "execution over both limits",
        lane(max_walltime_seconds=3600),
        request(wall_time_seconds=3600, runtime_seconds={"low": 8000, "high": 8000}),
        [
            "execution_bound: up to 4000 s (8000 s at speed 2) exceeds the walltime limit of 3600 s",
            "execution_bound: up to 4000 s (8000 s at speed 2) exceeds the requested walltime of 3600 s",
        ],
    ),
]


@pytest.mark.parametrize(("target", "req", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_hard_requirement(target: dict[str, Any], req: dict[str, Any], expected: list[str]) -> None:
    assert reasons(target, req) == expected


def test_max_age_option() -> None:
    stale = lane(observed_at="2026-10-12T11:50:00+00:00")
    assert reasons(stale, request()) == ["freshness: observed 600 s ago, older than the max age of 300 s"]
    assert reasons(stale, request(), max_age_seconds=600) == []
    assert reasons(stale, request(), max_age_seconds=599) == [
        "freshness: observed 600 s ago, older than the max age of 599 s"
    ]


def test_every_reason_is_listed_in_seed_order() -> None:
    target = lane(
        reachable=False,
        maintenance=True,
        observed_at="2026-10-12T10:00:00+00:00",
        programs={},
        os="Darwin",
        isa_levels=None,
        accounts=None,
        queue="debug",
        data_access=None,
        licenses=[],
        max_nodes=1,
        node={"cpus": 4},
        max_walltime_seconds=None,
    )
    req = request(
        queue="compute",
        nodes=2,
        cpus=16,
        mpi_ranks=2,
        threads_per_rank=8,
        gpus_per_node=1,
        required_licenses=["solver-base"],
    )
    assert reasons(target, req) == [
        "availability: unreachable when observed",
        "availability: in maintenance when observed",
        "freshness: observed 7200 s ago, older than the max age of 300 s",
        "program: lacks vibe-qc",
        "os: Darwin, want Linux",
        "isa: supported ISA levels unknown, want x86-64-v4",
        "account: permitted accounts unknown, want chem",
        "queue: debug, want compute",
        "data_access: unknown, want shared-inputs, results",
        "licenses: lacks solver-base",
        "nodes: needs 2, a job may have at most 1",
        "node_shape: needs 8 CPUs per node (2 ranks x 8 threads on 2 node(s)), node has 4",
        "node_shape: needs 64000 MB of memory per node, node memory unknown",
        "scratch: needs 100000 MB per node, node scratch unknown",
        "gpus: needs 1 per node, node GPU count unknown",
        "walltime_limit: unknown and not recorded as unlimited",
    ]


def test_runtime_digest_is_never_substituted() -> None:
    result = explain([lane(programs={"vibe-qc": [OTHER_DIGEST, DIGEST]})], request())
    assert result.selected is not None and result.selected.runtime_digest == DIGEST
    result = explain([lane(programs={"vibe-qc": [OTHER_DIGEST, DIGEST]})], request(runtime_digest=DROP))
    assert result.selected is not None and result.selected.runtime_digest == OTHER_DIGEST  # current runtime


def test_held_with_reasons_when_nothing_is_eligible() -> None:
    result = explain([lane(reachable=False), daemon(os="Darwin")], request())
    assert result.held and result.selected is None and result.candidates == ()
    assert result.held_reason == "no eligible target: 2 of 2 rejected"
    assert [r.reasons for r in result.rejected] == [
        ("availability: unreachable when observed",),
        ("os: Darwin, want Linux",),
    ]
    empty = explain([], request())
    assert empty.held and empty.held_reason == "the fleet has no targets"


def test_slow_target_held_when_none_finishes_within_the_requested_limit() -> None:
    slow = daemon(speed_factor=0.5, speed_source="benchmark")
    result = explain([slow], request(wall_time_seconds=14400, runtime_seconds={"low": 7000, "high": 8000}))
    assert result.held
    fast = lane(name="fast", speed_factor=4.0)
    result = explain(
        [slow, fast], request(wall_time_seconds=14400, runtime_seconds={"low": 7000, "high": 8000})
    )
    assert result.selected is not None and result.selected.target.name == "fast"

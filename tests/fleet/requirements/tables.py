"""The documents the hard-requirement tables start from, and the two ways to run one case.

Each case starts from an eligible target (:func:`lane`, :func:`daemon`) and request (:func:`request`)
and changes one thing; :func:`direct` runs one requirement's ``check`` alone, :func:`reasons` the whole
explanation (every other requirement then passes, so both give the same reasons).
"""

from __future__ import annotations

from datetime import UTC, datetime
from types import ModuleType
from typing import Any

from app.fleet.documents import load_fleet, load_request
from app.fleet.explain import explain_placement
from app.fleet.prediction import Explanation
from app.fleet.requirements.context import Context

NOW = datetime(2026, 10, 12, 12, 0, 0, tzinfo=UTC)
DIGEST = "a" * 64
OTHER_DIGEST = "b" * 64


def lane(**changes: Any) -> dict[str, Any]:
    """An eligible scheduler lane for :func:`request` (the worked example's cluster-a/compute, completed)."""
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
    """An eligible daemon host (the worked example's workstation, completed) for a request without a queue."""
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
    """the worked example's example request (queue left out so that daemons can qualify)."""
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


def direct(
    requirement: ModuleType, target: dict[str, Any], req: dict[str, Any], max_age: int = 300
) -> list[str]:
    """``requirement.check`` alone on the loaded documents, dated at :data:`NOW`."""
    loaded = load_fleet({"schema_name": "vq.placement-fleet/1", "targets": [target]}).targets[0]
    age = (NOW - loaded.observed_at).total_seconds() if loaded.observed_at is not None else None
    return requirement.check(loaded, load_request(req), Context(NOW, max_age, age))


def check_case(
    requirement: ModuleType, target: dict[str, Any], req: dict[str, Any], expected: list[str]
) -> None:
    """One table row: the requirement alone and the whole explanation give exactly ``expected``, and
    every reason carries the requirement's name."""
    assert direct(requirement, target, req) == expected
    assert reasons(target, req) == expected
    assert all(text.startswith(requirement.NAME + ": ") for text in expected)

"""Validation of vq.placement-fleet/1 and vq.placement-request/1 (docs/explain.md):
every malformed document is refused with InvalidInput naming the field; nothing is guessed."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from app.errors import InvalidInput
from app.fleet.documents import (
    FleetTarget,
    PlacementFleet,
    PlacementRequestDoc,
    dump_document,
    load_fleet,
    load_request,
)

DIGEST = "e" * 64

FLEET: dict[str, Any] = {
    "schema_name": "vq.placement-fleet/1",
    "targets": [
        {
            "name": "cluster-a/compute",
            "kind": "scheduler",
            "observed_at": "2026-10-12T11:59:00+00:00",
            "reachable": True,
            "os": "Linux",
            "arch": "x86_64",
            "isa_levels": ["x86-64-v3"],
            "programs": {"vibe-qc": [DIGEST, "sha256:" + "f" * 64]},
            "accounts": ["chem"],
            "queue": "compute",
            "data_access": ["results"],
            "licenses": ["solver-base"],
            "node": {"cpus": 128, "mem_mb": 512000, "scratch_mb": 0, "gpus": 0},
            "max_nodes": 16,
            "max_walltime_seconds": 172800,
            "queue_wait_seconds": {"low": 0, "high": 28800.5, "source": "scheduler-estimate"},
            "speed_factor": 1.5,
            "speed_source": "declared",
            "staging_mb_per_second": 200,
            "transfer_mb_per_second": 12.5,
        },
        {
            "name": "workstation",
            "kind": "daemon",
            "observed_at": "2026-10-12T11:59:00Z",
            "reachable": False,
            "maintenance": True,
            "programs": {"vibe-qc": [DIGEST]},
            "walltime_unlimited": True,
            "node": {"cpus": 32, "mem_mb": 128000},
            "free": {"cpus": 0, "mem_mb": 0, "scratch_mb": 0, "gpus": 0},
        },
    ],
}

REQUEST: dict[str, Any] = {
    "schema_name": "vq.placement-request/1",
    "program": "vibe-qc",
    "cpus": 24,
    "nodes": 2,
    "mpi_ranks": 3,
    "threads_per_rank": 8,
}


def test_valid_documents_load() -> None:
    fleet = load_fleet(FLEET)
    assert isinstance(fleet, PlacementFleet) and isinstance(fleet.targets[0], FleetTarget)
    lane, daemon = fleet.targets
    assert lane.programs["vibe-qc"][0] == DIGEST  # the current runtime first
    assert daemon.speed_factor == 1.0 and daemon.speed_source == "assumed"  # the documented default
    assert daemon.job_max_nodes == 1 and lane.job_max_nodes == 16
    assert daemon.accounts is None and daemon.queue is None  # omitted = unknown, never guessed
    request = load_request(REQUEST)
    assert isinstance(request, PlacementRequestDoc)
    assert request.cpus_per_node == 16  # ceil(3 / 2) * 8: the worked example of docs/explain.md


def test_dump_round_trips() -> None:
    fleet = load_fleet(FLEET)
    assert load_fleet(dump_document(fleet)) == fleet
    dumped = dump_document(fleet)["targets"][0]
    assert dumped["observed_at"] == "2026-10-12T11:59:00+00:00"
    assert dumped["staging_mb_per_second"] == 200 and dumped["transfer_mb_per_second"] == 12.5


Mutation = Callable[[dict[str, Any]], Any]


def _set(path: str, value: Any) -> Mutation:
    def mutate(document: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = document
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if value is _DELETE:
            del node[last]
        else:
            node[last] = value

    return mutate


_DELETE = object()

FLEET_ERRORS: list[tuple[str, Mutation, str]] = [
    ("schema missing", _set("schema_name", _DELETE), "schema_name"),
    ("schema unknown", _set("schema_name", "vq.placement-fleet/2"), "schema_name"),
    ("targets missing", _set("targets", _DELETE), "targets"),
    ("unknown field", _set("targets.0.max_wall_time", 5), "targets.0.max_wall_time"),
    ("name missing", _set("targets.0.name", _DELETE), "targets.0.name"),
    ("name with space", _set("targets.0.name", "cluster a"), "targets.0.name"),
    ("duplicate name", _set("targets.1.name", "cluster-a/compute"), "targets.1.name"),
    ("kind unknown", _set("targets.0.kind", "cloud"), "targets.0.kind"),
    ("naive time", _set("targets.0.observed_at", "2026-10-12T11:59:00"), "targets.0.observed_at"),
    ("time not a string", _set("targets.0.observed_at", 1760270340), "targets.0.observed_at"),
    ("reachable as text", _set("targets.0.reachable", "yes"), "targets.0.reachable"),
    ("cpus as float", _set("targets.0.node.cpus", 128.0), "targets.0.node.cpus"),
    ("cpus as string", _set("targets.0.node.cpus", "128"), "targets.0.node.cpus"),
    ("cpus zero", _set("targets.0.node.cpus", 0), "targets.0.node.cpus"),
    ("cpus boolean", _set("targets.0.node.cpus", True), "targets.0.node.cpus"),
    ("scratch negative", _set("targets.0.node.scratch_mb", -1), "targets.0.node.scratch_mb"),
    ("gpus negative", _set("targets.0.node.gpus", -1), "targets.0.node.gpus"),
    ("label with comma", _set("targets.0.queue", "compute,debug"), "targets.0.queue"),
    ("label path", _set("targets.0.data_access", ["/shared/inputs"]), "targets.0.data_access.0"),
    ("label URL", _set("targets.0.licenses", ["https://lic"]), "targets.0.licenses.0"),
    ("duplicate label", _set("targets.0.accounts", ["chem", "chem"]), "targets.0.accounts.1"),
    (
        "too many labels",
        _set("targets.0.data_access", [f"l{i}" for i in range(257)]),
        "targets.0.data_access",
    ),
    ("empty digest list", _set("targets.0.programs", {"vibe-qc": []}), "targets.0.programs.vibe-qc"),
    (
        "bad digest",
        _set("targets.0.programs", {"vibe-qc": ["<runtime sha256>"]}),
        "targets.0.programs.vibe-qc.0",
    ),
    (
        "duplicate digest",
        _set("targets.0.programs", {"vibe-qc": [DIGEST, DIGEST]}),
        "targets.0.programs.vibe-qc.1",
    ),
    (
        "bad program name",
        _set("targets.0.programs", {"vibe qc": [DIGEST]}),
        "targets.0.programs.vibe qc.[key]",
    ),
    (
        "unlimited with a limit",
        _set("targets.0.walltime_unlimited", True),
        "targets.0.walltime_unlimited",
    ),
    ("walltime zero", _set("targets.0.max_walltime_seconds", 0), "targets.0.max_walltime_seconds"),
    ("daemon queue", _set("targets.1.queue", "compute"), "targets.1.queue"),
    ("daemon two nodes", _set("targets.1.max_nodes", 2), "targets.1.max_nodes"),
    ("scheduler free", _set("targets.0.free", {"cpus": 1, "mem_mb": 1}), "targets.0.free"),
    ("free without cpus", _set("targets.1.free", {"mem_mb": 1}), "targets.1.free.cpus"),
    (
        "wait reversed",
        _set("targets.0.queue_wait_seconds", {"low": 9, "high": 1, "source": "history"}),
        "targets.0.queue_wait_seconds.high",
    ),
    (
        "wait source",
        _set("targets.0.queue_wait_seconds.source", "guess"),
        "targets.0.queue_wait_seconds.source",
    ),
    ("wait negative", _set("targets.0.queue_wait_seconds.low", -1), "targets.0.queue_wait_seconds.low"),
    ("speed zero", _set("targets.0.speed_factor", 0), "targets.0.speed_factor"),
    ("speed as string", _set("targets.0.speed_factor", "2"), "targets.0.speed_factor"),
    ("speed infinite", _set("targets.0.speed_factor", float("inf")), "targets.0.speed_factor"),
    ("speed without source", _set("targets.0.speed_source", _DELETE), "targets.0.speed_source"),
    ("speed source unknown", _set("targets.0.speed_source", "guessed"), "targets.0.speed_source"),
    ("rate zero", _set("targets.0.staging_mb_per_second", 0), "targets.0.staging_mb_per_second"),
]


@pytest.mark.parametrize(("mutate", "path"), [c[1:] for c in FLEET_ERRORS], ids=[c[0] for c in FLEET_ERRORS])
def test_malformed_fleet_names_the_field(mutate: Mutation, path: str) -> None:
    document = copy.deepcopy(FLEET)
    mutate(document)
    with pytest.raises(InvalidInput) as raised:
        load_fleet(document)
    assert raised.value.path == path
    assert raised.value.details["path"] == path
    assert raised.value.message.startswith(f"fleet: {path}: ")


REQUEST_ERRORS: list[tuple[str, Mutation, str]] = [
    ("schema unknown", _set("schema_name", "vq.placement-fleet/1"), "schema_name"),
    ("program missing", _set("program", _DELETE), "program"),
    ("cpus missing", _set("cpus", _DELETE), "cpus"),
    ("cpus mismatch layout", _set("cpus", 16), "cpus"),
    ("ranks without threads", _set("threads_per_rank", _DELETE), "threads_per_rank"),
    ("threads without ranks", _set("mpi_ranks", _DELETE), "mpi_ranks"),
    ("fewer ranks than nodes", _set("nodes", 4), "mpi_ranks"),
    ("nodes zero", _set("nodes", 0), "nodes"),
    ("ranks zero", _set("mpi_ranks", 0), "mpi_ranks"),
    ("walltime float", _set("wall_time_seconds", 3600.0), "wall_time_seconds"),
    ("walltime zero", _set("wall_time_seconds", 0), "wall_time_seconds"),
    ("scratch zero", _set("scratch_mb_per_node", 0), "scratch_mb_per_node"),
    ("gpus zero", _set("gpus_per_node", 0), "gpus_per_node"),
    ("memory zero", _set("mem_mb_per_node", 0), "mem_mb_per_node"),
    ("runtime reversed", _set("runtime_seconds", {"low": 2, "high": 1}), "runtime_seconds.high"),
    ("runtime zero", _set("runtime_seconds", {"low": 0, "high": 1}), "runtime_seconds.low"),
    ("runtime missing high", _set("runtime_seconds", {"low": 1}), "runtime_seconds.high"),
    ("input negative", _set("input_mb", -1), "input_mb"),
    ("queue list", _set("queue", "a,b"), "queue"),
    ("queue expression", _set("queue", "compute || debug"), "queue"),
    ("digest", _set("runtime_digest", "not a digest"), "runtime_digest"),
    ("os label", _set("os", "Linux 6"), "os"),
    ("duplicate access", _set("required_data_access", ["a", "a"]), "required_data_access.1"),
    ("duplicate license", _set("required_licenses", ["a", "b", "a"]), "required_licenses.2"),
    ("unknown field", _set("walltime", 5), "walltime"),
]


@pytest.mark.parametrize(
    ("mutate", "path"), [c[1:] for c in REQUEST_ERRORS], ids=[c[0] for c in REQUEST_ERRORS]
)
def test_malformed_request_names_the_field(mutate: Mutation, path: str) -> None:
    document = copy.deepcopy(REQUEST)
    mutate(document)
    with pytest.raises(InvalidInput) as raised:
        load_request(document)
    assert raised.value.path == path
    assert raised.value.message.startswith(f"request: {path}: ")


@pytest.mark.parametrize("document", [None, [], "fleet", 3])
def test_non_objects_are_refused(document: Any) -> None:
    with pytest.raises(InvalidInput, match="must be a JSON object"):
        load_fleet(document)
    with pytest.raises(InvalidInput, match="must be a JSON object"):
        load_request(document)


def test_null_optional_fields_mean_unknown() -> None:
    request = load_request({**REQUEST, "queue": None, "account": None, "required_data_access": None})
    assert request.queue is None and request.account is None and request.required_data_access is None
    fleet = load_fleet(
        {"schema_name": "vq.placement-fleet/1", "targets": [{"name": "t", "kind": "scheduler"}]}
    )
    target = fleet.targets[0]
    assert target.reachable is None and target.observed_at is None and target.node is None
    assert target.max_walltime_seconds is None and not target.walltime_unlimited

"""docs/explain.md "Hard requirements first": every requirement's accept and reject case, with its reason
text.

Pure tests (no database). Each requirement's own table is in tests/fleet/requirements/test_req_<name>.py;
here: the cases that cross requirements (all reasons in seed order, max age, digests, holds).
"""

from __future__ import annotations

from tests.fleet.requirements.tables import (
    DIGEST,
    DROP,
    OTHER_DIGEST,
    daemon,
    explain,
    lane,
    reasons,
    request,
)


def test_base_documents_are_eligible() -> None:
    assert reasons(lane(), request()) == []
    assert reasons(daemon(), request()) == []
    assert reasons(lane(), request(queue="compute")) == []


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

"""docs/explain.md "Then rank by predicted completion" and "A request from a calibrated estimate".

Pure tests: the four components with their sources, unknown components, the ranking rule, and the
calibrated-estimate fill rules.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest

from app.errors import InvalidInput
from app.fleet.documents import load_fleet, load_request
from app.fleet.estimate import load_estimate
from app.fleet.explain import explain_placement
from app.fleet.prediction import Explanation
from app.fleet.render import render_text, to_json

NOW = datetime(2026, 10, 12, 12, 0, 0, tzinfo=UTC)
DIGEST = "c" * 64


def target(name: str, kind: str = "scheduler", **changes: Any) -> dict[str, Any]:
    """An eligible target with no account/queue/data constraints: 64 CPUs, 256 GB, unlimited walltime."""
    body: dict[str, Any] = {
        "name": name,
        "kind": kind,
        "observed_at": "2026-10-12T11:59:30+00:00",
        "reachable": True,
        "programs": {"vibe-qc": [DIGEST]},
        "node": {"cpus": 64, "mem_mb": 256000},
        "walltime_unlimited": True,
        "staging_mb_per_second": 100,
        "transfer_mb_per_second": 100,
    }
    if kind == "scheduler":
        body["queue_wait_seconds"] = {"low": 100, "high": 300, "source": "declared"}
    body.update(changes)
    return {key: value for key, value in body.items() if value is not None}


def request(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "schema_name": "vq.placement-request/1",
        "program": "vibe-qc",
        "cpus": 16,
        "mem_mb_per_node": 64000,
        "runtime_seconds": {"low": 1000, "high": 2000},
        "input_mb": 100,
        "output_mb": 200,
    }
    body.update(changes)
    return {key: value for key, value in body.items() if value is not None}


def explain(targets: list[dict[str, Any]], req: dict[str, Any], estimate: Any = None) -> Explanation:
    fleet = load_fleet({"schema_name": "vq.placement-fleet/1", "targets": targets})
    loaded = load_estimate(estimate) if estimate is not None else None
    return explain_placement(fleet, load_request(req), NOW, estimate=loaded)


def components(result: Explanation, index: int = 0) -> dict[str, dict[str, Any]]:
    return to_json(result)["candidates"][index]["components"]


# --- components ------------------------------------------------------------------------------------


def test_scheduler_components_and_sources() -> None:
    result = explain([target("lane", speed_factor=2.0, speed_source="benchmark")], request())
    assert components(result) == {
        "staging": {"known": True, "low": 1, "high": 1, "source": "100 MB at 100 MB/s"},
        "queue_wait": {"known": True, "low": 100, "high": 300, "source": "declared"},
        "execution": {
            "known": True,
            "low": 500,
            "high": 1000,
            "source": "runtime 1000-2000 s / speed 2 (benchmark)",
        },
        "transfer": {"known": True, "low": 2, "high": 2, "source": "200 MB at 100 MB/s"},
    }
    assert to_json(result)["candidates"][0]["completion"] == {
        "complete": True,
        "low": 603,
        "high": 1303,
        "midpoint": 953,
    }


def test_no_input_and_no_output_are_zero() -> None:
    result = explain(
        [target("lane", staging_mb_per_second=None, transfer_mb_per_second=None)],
        request(input_mb=None, output_mb=0),
    )
    got = components(result)
    assert got["staging"] == {"known": True, "low": 0, "high": 0, "source": "no input"}
    assert got["transfer"] == {"known": True, "low": 0, "high": 0, "source": "no output"}


def test_unknown_rates_make_unknown_components() -> None:
    result = explain([target("lane", staging_mb_per_second=None, transfer_mb_per_second=None)], request())
    got = components(result)
    assert got["staging"] == {"known": False, "reason": "staging_mb_per_second unknown (100 MB of input)"}
    assert got["transfer"] == {"known": False, "reason": "transfer_mb_per_second unknown (200 MB of output)"}


def test_default_speed_is_assumed_one() -> None:
    result = explain([target("lane")], request())
    assert components(result)["execution"]["source"] == "runtime 1000-2000 s / speed 1 (assumed)"
    assert to_json(result)["candidates"][0]["speed_source"] == "assumed"


def test_daemon_free_now_waits_zero() -> None:
    free = {"cpus": 16, "mem_mb": 64000}
    result = explain([target("ws", kind="daemon", free=free)], request())
    assert components(result)["queue_wait"] == {"known": True, "low": 0, "high": 0, "source": "free now"}


@pytest.mark.parametrize(
    ("free", "req", "note"),
    [
        (None, {}, "no free capacity recorded"),
        ({"cpus": 8, "mem_mb": 64000}, {}, "cpus 8 free, 16 needed"),
        ({"cpus": 16, "mem_mb": 1000}, {}, "memory 1000 MB free, 64000 MB needed"),
        ({"cpus": 16, "mem_mb": 64000}, {"scratch_mb_per_node": 10}, "free scratch unknown"),
        (
            {"cpus": 16, "mem_mb": 64000, "scratch_mb": 5},
            {"scratch_mb_per_node": 10},
            "scratch 5 MB free, 10 MB needed",
        ),
        ({"cpus": 16, "mem_mb": 64000, "gpus": 0}, {"gpus_per_node": 1}, "gpus 0 free, 1 needed"),
        ({"cpus": 16, "mem_mb": 64000}, {"gpus_per_node": 1}, "free GPUs unknown"),
    ],
)
def test_daemon_not_free_now_uses_its_wait_model_or_is_unknown(
    free: dict[str, Any] | None, req: dict[str, Any], note: str
) -> None:
    node = {"cpus": 64, "mem_mb": 256000, "scratch_mb": 1000, "gpus": 2}
    wait = {"low": 60, "high": 600, "source": "history"}
    with_model = explain(
        [target("ws", kind="daemon", free=free, node=node, queue_wait_seconds=wait)], request(**req)
    )
    assert components(with_model)["queue_wait"] == {
        "known": True,
        "low": 60,
        "high": 600,
        "source": "history",
        "note": f"not free now: {note}",
    }
    without = explain([target("ws", kind="daemon", free=free, node=node)], request(**req))
    assert components(without)["queue_wait"] == {
        "known": False,
        "reason": f"not free now: {note}; no queue-wait estimate",
    }


def test_daemon_free_check_needs_all_cpus_and_fits_when_scratch_and_gpus_fit() -> None:
    free = {"cpus": 16, "mem_mb": 64000, "scratch_mb": 10, "gpus": 1}
    node = {"cpus": 64, "mem_mb": 256000, "scratch_mb": 1000, "gpus": 2}
    result = explain(
        [target("ws", kind="daemon", free=free, node=node)], request(scratch_mb_per_node=10, gpus_per_node=1)
    )
    assert components(result)["queue_wait"]["source"] == "free now"


def test_scheduler_without_wait_model_is_unknown() -> None:
    result = explain([target("lane", queue_wait_seconds=None)], request())
    assert components(result)["queue_wait"] == {"known": False, "reason": "no queue-wait estimate"}


def test_unknown_runtime_is_unknown_execution_not_a_partial_prediction() -> None:
    result = explain([target("lane")], request(runtime_seconds=None))
    body = to_json(result)["candidates"][0]
    assert body["components"]["execution"] == {"known": False, "reason": "no runtime estimate"}
    assert body["completion"] == {
        "complete": False,
        "known_low": 103,
        "known_high": 303,
        "unknown": ["execution"],
    }
    text = render_text(result)
    assert "completion  103-303 s + unknown (execution)" in text
    assert "midpoint" not in text.split("Candidates")[1]


# --- ranking ---------------------------------------------------------------------------------------


def test_ranking_order_with_unknown_components() -> None:
    wait = {"low": 100, "high": 300, "source": "declared"}  # midpoint 200
    targets = [
        # incomplete: ranked after every complete one, even though its known part is tiny
        target("b-unknown-wait", queue_wait_seconds=None),
        # complete, same midpoint as "mid-wide" but a lower upper bound
        target("mid-narrow", queue_wait_seconds={"low": 150, "high": 250, "source": "declared"}),
        target("mid-wide", queue_wait_seconds=wait),
        # the same completion as mid-wide (1103-2303 s) on a faster target: the faster one ranks first
        target(
            "fast-equal",
            speed_factor=2.0,
            speed_source="benchmark",
            queue_wait_seconds={"low": 600, "high": 1300, "source": "declared"},
        ),
        # identical to mid-wide: the name breaks the tie
        target("mid-wide-2", queue_wait_seconds=wait),
        # slowest complete prediction
        target("slow", queue_wait_seconds={"low": 5000, "high": 9000, "source": "history"}),
        # incomplete with a larger known part than b-unknown-wait: after it, despite its name
        target(
            "a-unknown-staging",
            staging_mb_per_second=None,
            queue_wait_seconds={"low": 9, "high": 9, "source": "declared"},
        ),
    ]
    result = explain(targets, request())
    order = [c.target.name for c in result.candidates]
    assert order == [
        "mid-narrow",
        "fast-equal",
        "mid-wide",
        "mid-wide-2",
        "slow",
        "b-unknown-wait",
        "a-unknown-staging",
    ]
    by_name = {c.target.name: c for c in result.candidates}
    # fast-equal: 1 + 600..1300 + 500..1000 + 2 = 1103..2303 ; mid-wide: 1 + 100..300 + 1000..2000 + 2
    assert (by_name["fast-equal"].completion.low, by_name["fast-equal"].completion.high) == (1103, 2303)
    assert (by_name["mid-wide"].completion.low, by_name["mid-wide"].completion.high) == (1103, 2303)
    assert [c.rank for c in result.candidates] == [1, 2, 3, 4, 5, 6, 7]
    assert result.selected is not None and result.selected.target.name == "mid-narrow"


def test_faster_target_with_longer_wait_can_win() -> None:
    slow_now = target(
        "ws", kind="daemon", speed_factor=0.5, speed_source="declared", free={"cpus": 64, "mem_mb": 256000}
    )
    fast_later = target("lane", speed_factor=4.0, speed_source="benchmark")
    result = explain([slow_now, fast_later], request(runtime_seconds={"low": 3600, "high": 7200}))
    assert [c.target.name for c in result.candidates] == ["lane", "ws"]


def test_selected_even_when_only_incomplete_predictions() -> None:
    result = explain([target("lane", queue_wait_seconds=None)], request())
    assert not result.held
    assert to_json(result)["selected"] == {"target": "lane", "runtime_digest": DIGEST}


# --- calibrated estimate ---------------------------------------------------------------------------


def estimate(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "schema_name": "vq.calibrated-estimate/1",
        "estimate_digest": "sha256:" + "d" * 64,
        "calibration_id": "cal-2026-09",
        "hardware_class": "x86-64-v4-epyc",
        "program": "vibe-qc",
        "runtime": {
            "calibrated": True,
            "receipt_low_seconds": 5000,
            "receipt_high_seconds": 7000,
            "calibrated_high_seconds": 9000,
        },
        "peak_memory": {"calibrated": True, "scope": "node", "peak_bytes": 50_000 * 1048576 + 1},
    }
    body.update(changes)
    return body


def test_estimate_fills_unset_fields() -> None:
    result = explain([target("lane")], request(runtime_seconds=None, mem_mb_per_node=None), estimate())
    body = to_json(result)
    assert body["request"]["runtime_seconds"] == {"low": 5000, "high": 9000}
    assert body["request"]["mem_mb_per_node"] == 50001  # rounded up to MiB
    assert body["estimate"] == {
        "estimate_digest": "sha256:" + "d" * 64,
        "calibration_id": "cal-2026-09",
        "hardware_class": "x86-64-v4-epyc",
        "fields": [
            {"field": "runtime_seconds", "outcome": "filled", "value": {"low": 5000, "high": 9000}},
            {"field": "mem_mb_per_node", "outcome": "filled", "value": 50001},
        ],
    }
    text = render_text(result)
    assert (
        "Estimate: digest sha256:" + "d" * 64 + ", calibration cal-2026-09, hardware class x86-64-v4-epyc"
        in text
    )
    assert "  runtime_seconds: filled (5000-9000 s)" in text
    assert "  mem_mb_per_node: filled (50001 MB)" in text


def test_explicit_values_are_kept() -> None:
    result = explain([target("lane")], request(), estimate())
    body = to_json(result)
    assert body["request"]["runtime_seconds"] == {"low": 1000, "high": 2000}
    assert body["estimate"]["fields"] == [
        {"field": "runtime_seconds", "outcome": "kept", "value": {"low": 1000, "high": 2000}},
        {"field": "mem_mb_per_node", "outcome": "kept", "value": 64000},
    ]
    assert "  runtime_seconds: kept (1000-2000 s)" in render_text(result)


@pytest.mark.parametrize(
    ("peak", "nodes", "outcome", "reason"),
    [
        ({"calibrated": True, "scope": "job", "peak_bytes": 1048576 * 10}, 1, "filled", None),
        (
            {"calibrated": True, "scope": "job", "peak_bytes": 1048576 * 10},
            2,
            "not filled",
            "a job-scope peak on a 2-node request is not per-node memory",
        ),
        (
            {"calibrated": True, "scope": "rank", "peak_bytes": 1048576 * 10},
            1,
            "not filled",
            "a rank-scope peak is not per-node memory",
        ),
        (
            {"calibrated": False, "scope": "node", "reason": "no peak sampled on this hardware class"},
            1,
            "not filled",
            "peak memory uncalibrated: no peak sampled on this hardware class",
        ),
    ],
)
def test_memory_fill_rules(peak: dict[str, Any], nodes: int, outcome: str, reason: str | None) -> None:
    req = request(mem_mb_per_node=None, nodes=nodes, cpus=16)
    result = explain([target("lane", max_nodes=4)], req, estimate(peak_memory=peak))
    fill = to_json(result)["estimate"]["fields"][1]
    assert fill["outcome"] == outcome
    if outcome == "filled":
        assert fill["value"] == 10
    else:
        assert fill["reason"] == reason
        assert "mem_mb_per_node" not in to_json(result)["request"]


def test_uncalibrated_runtime_is_not_filled_with_the_calibration_reason() -> None:
    runtime = {
        "calibrated": False,
        "receipt_low_seconds": 5000,
        "receipt_high_seconds": 7000,
        "reason": "fewer than 5 calibration runs",
    }
    result = explain([target("lane")], request(runtime_seconds=None), estimate(runtime=runtime))
    body = to_json(result)
    assert body["estimate"]["fields"][0] == {
        "field": "runtime_seconds",
        "outcome": "not filled",
        "reason": "runtime uncalibrated: fewer than 5 calibration runs",
    }
    assert body["candidates"][0]["components"]["execution"] == {
        "known": False,
        "reason": "no runtime estimate (runtime uncalibrated: fewer than 5 calibration runs)",
    }
    assert (
        "  runtime_seconds: not filled: runtime uncalibrated: fewer than 5 calibration runs"
        in render_text(result)
    )


def test_without_estimate_there_is_no_estimate_section() -> None:
    result = explain([target("lane")], request())
    assert "estimate" not in to_json(result)
    assert "Estimate:" not in render_text(result)


@pytest.mark.parametrize(
    ("change", "path"),
    [
        ({"schema_name": "vq.estimate-receipt/1"}, "schema_name"),
        ({"schema_name": "vq.calibrated-estimate/2"}, "schema_name"),
        ({"calibration_id": None}, "calibration_id"),
        (
            {"runtime": {"calibrated": True, "receipt_low_seconds": 1, "receipt_high_seconds": 2}},
            "runtime.calibrated_high_seconds",
        ),
        (
            {"runtime": {"calibrated": False, "receipt_low_seconds": 1, "receipt_high_seconds": 2}},
            "runtime.reason",
        ),
        (
            {
                "runtime": {
                    "calibrated": True,
                    "receipt_low_seconds": 3,
                    "receipt_high_seconds": 2,
                    "calibrated_high_seconds": 4,
                }
            },
            "runtime.receipt_high_seconds",
        ),
        ({"peak_memory": {"calibrated": True, "scope": "socket", "peak_bytes": 1}}, "peak_memory.scope"),
        ({"peak_memory": {"calibrated": True, "scope": "node"}}, "peak_memory.peak_bytes"),
        ({"extra": 1}, "extra"),
    ],
)
def test_malformed_estimates_are_refused(change: dict[str, Any], path: str) -> None:
    body = estimate(**change)
    body = {key: value for key, value in body.items() if value is not None}
    with pytest.raises(InvalidInput) as raised:
        load_estimate(body)
    assert raised.value.path == path
    assert path in raised.value.message


def test_raw_receipt_is_refused_with_a_hint() -> None:
    with pytest.raises(InvalidInput, match="raw estimate receipt is refused"):
        load_estimate(estimate(schema_name="vq.estimate-receipt/1"))


def test_estimate_for_another_program_is_refused() -> None:
    with pytest.raises(InvalidInput) as raised:
        explain([target("lane")], request(), estimate(program="other-code"))
    assert raised.value.path == "program"


def test_estimate_does_not_change_the_input_request() -> None:
    req = load_request(request(runtime_seconds=None))
    before = copy.deepcopy(req.model_dump())
    fleet = load_fleet({"schema_name": "vq.placement-fleet/1", "targets": [target("lane")]})
    explain_placement(fleet, req, NOW, estimate=load_estimate(estimate()))
    assert req.model_dump() == before

"""The worked example's fleet and request (made complete) through the CLI: expected text and JSON, the
JSON Schema in openapi/, byte-identical output across runs and processes, and exit code 2 naming the
field for malformed documents. Pure (no database)."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from typer.testing import CliRunner

from app.fleet.cli import placement_app
from app.fleet.documents import load_fleet, load_request
from app.fleet.explain import explain_placement
from app.fleet.render import to_json

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "explain"
SCHEMA = json.loads((ROOT / "openapi" / "vq.placement-explanation-1.schema.json").read_text())
NOW = "2026-10-12T12:00:00+00:00"
DIGEST = "3b1f7c0e9a4d2c5b8e6f1a0d9c8b7a6f5e4d3c2b1a0f9e8d7c6b5a4f3e2d1c0b"

runner = CliRunner()


def cli(*args: str) -> Any:
    return runner.invoke(placement_app, ["explain", *args])


def seed_args(*extra: str) -> list[str]:
    return [str(DATA / "seed-fleet.json"), str(DATA / "seed-request.json"), "--now", NOW, *extra]


def validate(body: dict[str, Any]) -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    jsonschema.Draft202012Validator(SCHEMA, format_checker=jsonschema.FormatChecker()).validate(body)


def test_seed_example_text() -> None:
    result = cli(*seed_args())
    assert result.exit_code == 0, result.output
    assert result.output == (DATA / "seed-explain.txt").read_text()
    # What docs/explain.md leads us to expect, stated outright rather than only as a golden file:
    assert f"Selected: cluster-a/compute, runtime digest {DIGEST}\n" in result.output
    assert "  1. cluster-a/compute (scheduler, data age 60 s, " in result.output
    assert "       completion  17403-33003 s (midpoint 25203 s)\n" in result.output
    assert "    - queue: a daemon host has no queue, want compute\n" in result.output


def test_seed_example_json() -> None:
    result = cli(*seed_args("--json"))
    assert result.exit_code == 0, result.output
    assert result.output == (DATA / "seed-explain.json").read_text()
    body = json.loads(result.output)
    validate(body)
    assert body["held"] is False
    assert body["selected"] == {"target": "cluster-a/compute", "runtime_digest": DIGEST}
    candidate = body["candidates"][0]
    assert candidate["components"]["queue_wait"] == {
        "known": True,
        "low": 14400,
        "high": 28800,
        "source": "history",
    }
    assert candidate["completion"] == {"complete": True, "low": 17403, "high": 33003, "midpoint": 25203}
    assert body["rejected"] == [
        {
            "target": "workstation",
            "kind": "daemon",
            "observed_at": "2026-10-12T11:59:00+00:00",
            "data_age_seconds": 60,
            "reasons": [
                "isa: supported ISA levels unknown, want x86-64-v4",
                "account: permitted accounts unknown, want chem",
                "queue: a daemon host has no queue, want compute",
                "data_access: unknown, want shared-inputs, results",
            ],
        }
    ]
    # The request is preserved: OS, account, queue, layout, walltime, data access.
    request = json.loads((DATA / "seed-request.json").read_text())
    assert body["request"] == request


def test_seed_example_with_estimate() -> None:
    args = [
        str(DATA / "seed-fleet.json"),
        str(DATA / "seed-request-for-estimate.json"),
        "--now",
        NOW,
        "--estimate",
        str(DATA / "seed-estimate.json"),
    ]
    text = cli(*args)
    assert text.exit_code == 0, text.output
    assert text.output == (DATA / "seed-explain-estimate.txt").read_text()
    as_json = cli(*args, "--json")
    assert as_json.output == (DATA / "seed-explain-estimate.json").read_text()
    body = json.loads(as_json.output)
    validate(body)
    assert body["request"]["mem_mb_per_node"] == 57221  # ceil(60e9 B / 1 MiB), job scope on one node
    assert [f["outcome"] for f in body["estimate"]["fields"]] == ["filled", "filled"]


@pytest.mark.parametrize("as_json", [False, True])
def test_identical_across_runs_and_processes(as_json: bool) -> None:
    extra = ("--json",) if as_json else ()
    first = cli(*seed_args(*extra)).output
    assert cli(*seed_args(*extra)).output == first
    code = (
        "import sys; from app.fleet.cli import placement_app; "
        "placement_app(sys.argv[1:], prog_name='placement')"
    )
    outputs = set()
    for seed in ("0", "1", "random"):
        run = subprocess.run(
            [sys.executable, "-c", code, "explain", *seed_args(*extra)],
            capture_output=True,
            cwd=ROOT,
            env={"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin"},
            check=False,
        )
        assert run.returncode == 0, run.stderr
        outputs.add(run.stdout)
    assert outputs == {first.encode()}


def test_held_output_validates_and_says_why() -> None:
    fleet = json.loads((DATA / "seed-fleet.json").read_text())
    request = json.loads((DATA / "seed-request.json").read_text())
    request["account"] = "physics"
    explanation = explain_placement(
        load_fleet(fleet), load_request(request), datetime(2026, 10, 12, 12, 0, tzinfo=UTC)
    )
    body = to_json(explanation)
    validate(body)
    assert body["held"] is True and body["selected"] is None and body["candidates"] == []
    assert body["held_reason"] == "no eligible target: 2 of 2 rejected"
    assert "account: physics not permitted (permits chem)" in body["rejected"][0]["reasons"]


def test_unknown_components_and_unknown_observation_validate() -> None:
    fleet = json.loads((DATA / "seed-fleet.json").read_text())
    fleet["targets"][0].pop("queue_wait_seconds")
    fleet["targets"][1].pop("observed_at")
    request = json.loads((DATA / "seed-request.json").read_text())
    request.pop("runtime_seconds")
    body = to_json(
        explain_placement(load_fleet(fleet), load_request(request), datetime(2026, 10, 12, 12, 0, tzinfo=UTC))
    )
    validate(body)
    assert body["candidates"][0]["completion"] == {
        "complete": False,
        "known_low": 3,
        "known_high": 3,
        "unknown": ["queue_wait", "execution"],
    }
    assert body["rejected"][0]["observed_at"] is None and body["rejected"][0]["data_age_seconds"] is None


def test_schema_rejects_a_drifted_document() -> None:
    body = json.loads((DATA / "seed-explain.json").read_text())
    body["candidates"][0]["completion"] = {"complete": True, "low": 1}
    with pytest.raises(jsonschema.ValidationError):
        validate(body)


# --- malformed documents: exit code 2 naming the file and field --------------------------------------


def write(tmp_path: Path, name: str, body: Any) -> str:
    path = tmp_path / name
    path.write_text(body if isinstance(body, str) else json.dumps(body))
    return str(path)


@pytest.mark.parametrize(
    ("document", "mutate", "field"),
    [
        ("fleet", lambda d: d["targets"][1]["node"].__setitem__("cpus", "32"), "targets.1.node.cpus"),
        ("fleet", lambda d: d["targets"][1].__setitem__("queue", "compute"), "targets.1.queue"),
        (
            "fleet",
            lambda d: d["targets"][0].__setitem__("walltime_unlimited", True),
            "targets.0.walltime_unlimited",
        ),
        ("fleet", lambda d: d["targets"][0].__setitem__("observed_at", "yesterday"), "targets.0.observed_at"),
        ("fleet", lambda d: d.__setitem__("schema_name", "vq.placement-fleet/2"), "schema_name"),
        ("request", lambda d: d.__setitem__("cpus", 24), "cpus"),
        ("request", lambda d: d.__setitem__("wall_time_seconds", -1), "wall_time_seconds"),
        ("request", lambda d: d.__setitem__("queue", "compute,debug"), "queue"),
        ("request", lambda d: d["runtime_seconds"].__setitem__("low", 9000), "runtime_seconds.high"),
    ],
)
def test_malformed_document_exits_2_naming_the_field(
    tmp_path: Path, document: str, mutate: Any, field: str
) -> None:
    fleet = json.loads((DATA / "seed-fleet.json").read_text())
    request = json.loads((DATA / "seed-request.json").read_text())
    mutate(fleet if document == "fleet" else request)
    result = cli(write(tmp_path, "fleet.json", fleet), write(tmp_path, "request.json", request), "--now", NOW)
    assert result.exit_code == 2
    assert f"{document}: {field}: " in result.output
    assert result.output.startswith("error: ")


def test_malformed_estimate_exits_2(tmp_path: Path) -> None:
    receipt = {"schema_name": "vq.estimate-receipt/1", "runtime_seconds": {"low": 1, "high": 2}}
    result = cli(*seed_args("--estimate", write(tmp_path, "receipt.json", receipt)))
    assert result.exit_code == 2
    assert "estimate: schema_name: a raw estimate receipt is refused" in result.output


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "must be a JSON object"),
    ],
)
def test_unreadable_documents_exit_2(tmp_path: Path, text: str, message: str) -> None:
    result = cli(write(tmp_path, "fleet.json", text), str(DATA / "seed-request.json"), "--now", NOW)
    assert result.exit_code == 2
    assert message in result.output
    missing = cli(str(tmp_path / "absent.json"), str(DATA / "seed-request.json"))
    assert missing.exit_code == 2 and "cannot read" in missing.output


@pytest.mark.parametrize("now", ["yesterday", "2026-10-12T12:00:00"])
def test_bad_now_exits_2(now: str) -> None:
    result = cli(str(DATA / "seed-fleet.json"), str(DATA / "seed-request.json"), "--now", now)
    assert result.exit_code == 2
    assert "--now" in result.output


def test_max_age_option_changes_the_answer() -> None:
    result = cli(*seed_args("--max-age", "30", "--json"))
    body = json.loads(result.output)
    assert body["held"] is True and body["max_age_seconds"] == 30
    assert body["rejected"][0]["reasons"][0] == "freshness: observed 60 s ago, older than the max age of 30 s"

"""The registry of hard requirements (app/fleet/requirements): the rules of docs/explain.md, "Hard
requirements and their reasons", in the page's order, one module, one signature and one table test each."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest

from app.fleet.requirements import REQUIREMENTS
from app.fleet.requirements.context import Context, reason

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "app" / "fleet" / "requirements"
HELPERS = {"__init__", "context"}

RULES = [
    "was unreachable or in maintenance when observed",
    "was observed longer ago than --max-age (default 300 s), or more than 60 s in the future (clock skew)",
    "lacks the program, or the requested runtime digest",
    "has a different or unknown operating system when os is requested",
    "has another architecture, or does not support the requested ISA level",
    "does not permit the requested account, or its permitted accounts are unknown",
    "is a daemon host, or has a different or unknown queue/partition, when queue is requested",
    "lacks any required data-access label, or its data access is unknown",
    "lacks any required license-eligibility label, or its license eligibility is unknown",
    "needs more nodes than one job may have there",
    "has nodes with too few CPUs for the whole-rank layout when declared (otherwise ceil(cpus / nodes)), or "
    "too little memory per node, or does not record that number when the request needs it",
    "has too little scratch per node, or unknown scratch capacity when scratch_mb_per_node is requested",
    "has too few GPUs per node, or an unknown GPU count, when gpus_per_node is requested",
    "cannot accept the explicit wall_time_seconds request, or has no known walltime limit and no positive "
    "evidence of unlimited walltime",
    "would exceed either its own walltime limit or the job's requested wall_time_seconds at the upper end of "
    "the predicted execution time",
]
"""What each requirement rejects, in the order the targets are checked."""


def test_registry_is_the_rule_list_in_the_documented_order() -> None:
    assert [requirement.RULE for requirement in REQUIREMENTS] == RULES
    page = (ROOT / "docs" / "explain.md").read_text()
    table = page[page.index("| requirement (its rule) |") :].split("\n\n", 1)[0]
    documented = re.findall(r"^\| `([a-z_]+)`", table, flags=re.M)
    assert [requirement.NAME for requirement in REQUIREMENTS] == documented


def test_every_module_is_registered_once_under_its_own_name() -> None:
    modules = sorted(path.stem for path in PACKAGE.glob("*.py") if path.stem not in HELPERS)
    names = [requirement.NAME for requirement in REQUIREMENTS]
    assert sorted(names) == modules and len(set(names)) == len(names)
    assert [requirement.__name__.rsplit(".", 1)[1] for requirement in REQUIREMENTS] == names


def test_one_signature() -> None:
    signatures = {str(inspect.signature(requirement.check)) for requirement in REQUIREMENTS}
    assert signatures == {
        "(target: 'FleetTarget', request: 'PlacementRequestDoc', ctx: 'Context') -> 'list[str]'"
    }


@pytest.mark.parametrize("requirement", REQUIREMENTS, ids=lambda r: r.NAME)
def test_each_requirement_has_its_table_test(requirement: object) -> None:
    name = requirement.NAME  # type: ignore[attr-defined]
    table = Path(__file__).parent / f"test_req_{name}.py"
    assert table.exists()
    text = table.read_text(encoding="utf-8")
    assert f"from app.fleet.requirements import {name} as requirement" in text
    assert re.search(rf"^def test_{name}\(.*\n    check_case\(requirement, ", text, re.M)


@pytest.mark.parametrize("requirement", REQUIREMENTS, ids=lambda r: r.NAME)
def test_every_reason_text_is_made_with_the_requirement_name(requirement: object) -> None:
    """Each module writes its reasons only through ``reason(NAME, ...)`` (or a shared rule of
    ``context`` with ``NAME``), so no reason can carry another prefix."""
    source = inspect.getsource(requirement)  # type: ignore[arg-type]
    calls = re.findall(r"\b(reason|missing_labels|per_node_shortfall)\(\s*(\w+)", source)
    assert calls and {argument for _, argument in calls} == {"NAME"}
    assert '": ' not in source.split("def check", 1)[1]  # no hand-made "<prefix>: " text


@pytest.mark.parametrize("requirement", REQUIREMENTS, ids=lambda r: r.NAME)
def test_each_table_rejects_and_accepts(requirement: object) -> None:
    name = requirement.NAME  # type: ignore[attr-defined]
    cases = importlib.import_module(f"tests.fleet.requirements.test_req_{name}").CASES
    assert any(expected for *_, expected in cases) and any(not expected for *_, expected in cases)


def test_reason_prefix() -> None:
    assert reason("os", "Darwin, want Linux") == "os: Darwin, want Linux"
    assert Context.__dataclass_fields__.keys() == {"now", "max_age_seconds", "age_seconds"}

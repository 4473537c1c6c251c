"""One home per reason text and condition name (docs/architecture.md, "Where each reason string is made").

Every string literal of ``app/`` (docstrings, dict keys, subscripts and column names left out; an
f-string read as its template, each value ``{}``) is searched for each text of :data:`HOMES`: an exact
text must equal a literal, a fragment must occur in one. The text must be found in its home module and
in no other. The CLI's client (``app/client``) and the node agent (``app/agent``) are separate programs
that only print what the service answers, so they are not searched.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a long module: it starts early in a parallel run (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "app"
SEPARATE_PROGRAMS = ("client", "agent")

# (text, exact?, home module): the NoSchedule reasons, the filters' rejections (docs/reasons.md), the
# pending texts, the lost races, and the conditions' types and reasons (docs/lifecycle.md)
HOMES: list[tuple[str, bool, str]] = [
    ("cordoned", True, "app/inventory/reasons.py"),
    ("not ready", True, "app/inventory/reasons.py"),
    ("heartbeat lost", True, "app/inventory/reasons.py"),
    ("tainted {}={}", False, "app/placement/schedulable.py"),
    ("pool is archived", True, "app/placement/schedulable.py"),
    ("not leasable", True, "app/placement/schedulable.py"),
    ("labels: {}", True, "app/placement/filters/labels.py"),
    ("missing {}", True, "app/placement/system_labels.py"),
    ("{} is {}, want {}", True, "app/placement/system_labels.py"),
    ("scalars: {} needs {}", False, "app/placement/filters/scalars.py"),
    ("selector: {} of {} {} match", False, "app/placement/filters/selector.py"),
    ("fits: {} of {} {} free", False, "app/placement/filters/fits.py"),
    ("topology: no NVLink-complete set", False, "app/placement/filters/topology.py"),
    ("picker {}: {}", False, "app/placement/filters/picker.py"),
    ("atoms booked in the window", False, "app/placement/filters/lease.py"),
    ("holds {} in the window", False, "app/placement/filters/lease.py"),
    ("admit {}: {}", False, "app/placement/plugins.py"),
    ("no node fits (", False, "app/placement/summary.py"),
    ("the pool has no nodes", True, "app/placement/summary.py"),
    ("the {}", True, "app/placement/summary.py"),
    ("has no device class", False, "app/placement/intake.py"),
    ("excluded after a lost commit race", False, "app/placement/options.py"),
    ("was booked concurrently", False, "app/capacity/commit/lost_races.py"),
    ("{} on {} ran out", False, "app/capacity/commit/lost_races.py"),
    ("conflicting attempts", False, "app/capacity/commit/lost_races.py"),
    ("device left", True, "app/inventory/hello.py"),
    ("repair: ", True, "app/capacity/controllers/repair.py"),
    ("Unschedulable", True, "app/capacity/conditions.py"),
    ("NoFit", True, "app/capacity/conditions.py"),
    ("QuotaExceeded", True, "app/capacity/conditions.py"),
    ("Ended", True, "app/capacity/conditions.py"),
    ("WindowEnded", True, "app/capacity/conditions.py"),
    ("WindowPassed", True, "app/capacity/conditions.py"),
    ("DeadlinePassed", True, "app/capacity/conditions.py"),
    ("passed while the reservation was {}", False, "app/capacity/conditions.py"),
    ("Released", True, "app/capacity/conditions.py"),
    ("Planned", True, "app/capacity/conditions.py"),
    ("Extended", True, "app/capacity/conditions.py"),
    ("ExtendRequested", True, "app/capacity/conditions.py"),
    ("extended from {} to {}", False, "app/capacity/conditions.py"),
    ("only a placed reservation can be extended", False, "app/capacity/reservations/extend.py"),
    ("cannot extend to {}: {}", False, "app/capacity/reservations/extend.py"),
    ("PlannedStart", True, "app/capacity/conditions.py"),
    ("planned for {} on {}", False, "app/capacity/conditions.py"),
    ("hold what it needs", False, "app/capacity/planning/planned.py"),
    ("Scheduled", True, "app/capacity/controllers/wake.py"),
    ("Woken", True, "app/capacity/controllers/wake.py"),
    ("Repaired", True, "app/capacity/controllers/repair.py"),
    ("Preempted", True, "app/capacity/placing/preemption.py"),
]


def _template(node: ast.JoinedStr) -> str:
    return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)


def literals(source: str) -> Iterator[str]:
    """The string literals of ``source`` that can make a text: no docstrings, dict keys, subscripts,
    keyword names or ``Column`` names; an f-string as its template."""
    tree = ast.parse(source)
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, (ast.Constant, ast.JoinedStr)):
            skip.add(id(node.value))  # docstrings and bare strings
        elif isinstance(node, ast.Dict):
            skip.update(id(k) for k in node.keys if k is not None)
        elif isinstance(node, ast.Subscript):
            skip.add(id(node.slice))
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "Column" and node.args:
            skip.add(id(node.args[0]))
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.JoinedStr):
            skip.update(id(v) for v in node.values)
            yield _template(node)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.value


def makers(text: str, exact: bool, sources: dict[str, str]) -> set[str]:
    """The modules of ``sources`` (path -> source) whose literals make ``text``."""
    return {
        path
        for path, source in sources.items()
        if any(s == text if exact else text in s for s in literals(source))
    }


def _app_sources() -> dict[str, str]:
    return {
        str(p.relative_to(ROOT)): p.read_text()
        for p in sorted(APP.rglob("*.py"))
        if p.relative_to(APP).parts[0] not in SEPARATE_PROGRAMS
    }


@pytest.mark.parametrize(("text", "exact", "home"), HOMES, ids=[h[0] for h in HOMES])
def test_each_text_is_made_in_its_home_alone(text: str, exact: bool, home: str) -> None:
    assert makers(text, exact, _app_sources()) == {home}


def test_a_second_maker_is_found() -> None:
    sources = {
        "home.py": 'FITS = "fits: {} of {} {} free"\nNOFIT = "NoFit"\n',
        "copy.py": 'def f(a, b, c):\n    return f"fits: {a} of {b} {c} free"\n',
        "keys.py": 'x = {"NoFit": 1}\ny = row["NoFit"]\n"""NoFit in a docstring"""\n',
    }
    assert makers("fits: {} of {} {} free", False, sources) == {"home.py", "copy.py"}
    assert makers("NoFit", True, sources) == {"home.py"}

"""Tests assert behaviour, never how long something took: a comparison of a wall-clock duration with a
constant fails on a loaded machine (a 1.0 s bound once failed at 1.23 s). Speed is measured by the
scripts in bench/, which print ratios. This test scans tests/ for such comparisons."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
# what a reviewer would grep for: an assert naming a duration, compared below a number
REVIEWER_PATTERN = re.compile(
    r"assert .*(elapsed|duration|took|seconds|perf_counter\(\)|time\.time\(\)).* <=? *[0-9.]+"
)
CLOCKS = {"monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns", "time", "time_ns"}
WALL_CLOCKS = {"now", "utcnow"}  # datetime.now(UTC): compared through .total_seconds()
BOUNDS = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)


def _is_clock_call(node: ast.AST) -> bool:
    """``time.monotonic()``, ``perf_counter()``, ``time.time()``, ``loop.time()`` and the like."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return (name in CLOCKS and not node.args) or name in WALL_CLOCKS


def _reads_clock(node: ast.AST, clock_names: set[str]) -> bool:
    return any(
        _is_clock_call(part) or (isinstance(part, ast.Name) and part.id in clock_names)
        for part in ast.walk(node)
    )


def _is_constant(node: ast.AST) -> bool:
    """A number, or arithmetic of numbers (``3 + 3``, ``2 * 0.5``)."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
    if isinstance(node, ast.BinOp):
        return _is_constant(node.left) and _is_constant(node.right)
    if isinstance(node, ast.UnaryOp):
        return _is_constant(node.operand)
    return False


def timed_assertions(source: str) -> list[int]:
    """Line numbers of asserts in ``source`` that compare a wall-clock reading (a clock call, or a name
    assigned from an expression that reads a clock: ``took = time.monotonic() - began``) with a
    constant, plus the lines the reviewer's pattern matches."""
    tree = ast.parse(source)
    clock_names: set[str] = set()
    for node in ast.walk(tree):  # names holding clock readings or durations made from them
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and node.value is not None:
            if _reads_clock(node.value, set()):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                clock_names |= {t.id for t in targets if isinstance(t, ast.Name)}
    found = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assert):
            continue
        for compare in (n for n in ast.walk(node.test) if isinstance(n, ast.Compare)):
            sides = [compare.left, *compare.comparators]
            for op, left, right in zip(compare.ops, sides[:-1], sides[1:], strict=True):
                if not isinstance(op, BOUNDS):
                    continue
                if (_reads_clock(left, clock_names) and _is_constant(right)) or (
                    _reads_clock(right, clock_names) and _is_constant(left)
                ):
                    found.add(node.lineno)
    for number, line in enumerate(source.splitlines(), start=1):
        if REVIEWER_PATTERN.search(line):
            found.add(number)
    return sorted(found)


@pytest.mark.parametrize(
    "snippet",
    # (split literals: the samples are not themselves assertions a repository grep should find)
    [
        "began = time.monotonic()\nwork()\ntook = time.monotonic() - began\nassert took <" + " 1.0\n",
        "started = time.monotonic()\nwork()\nassert time.monotonic() - started < 3 + 3\n",
        "t0 = time.perf_counter()\nwork()\nassert time.perf_counter() - t0 <=" + " 0.5\n",
        "t0 = time.time()\nwork()\nelapsed = time.time() - t0\nassert 2 > elapsed\n",
        "assert loop.time() - start < 1\n",
        "assert result.duration <" + " 5\n",
        "assert wait_seconds <=" + " 10, 'slow'\n",
        "t0 = datetime.now(UTC)\nwork()\nassert (datetime.now(UTC) - t0).total_seconds() <" + " 2\n",
    ],
)
def test_the_scan_finds_a_timed_assertion(snippet: str) -> None:
    assert timed_assertions(snippet), snippet


@pytest.mark.parametrize(
    "snippet",
    [
        # polling until a condition holds: the deadline only keeps a broken test from hanging
        "deadline = time.monotonic() + 60\nwhile time.monotonic() < deadline:\n    pass\n",
        "assert time.monotonic() < deadline, 'never happened'\n",
        "assert len(items) < 5\n",
        "assert body['waitSeconds'] == 30\n",
        "took = 3\nassert took == 3\n",
    ],
)
def test_the_scan_leaves_behaviour_alone(snippet: str) -> None:
    assert timed_assertions(snippet) == [], snippet


def test_no_test_compares_a_duration_with_a_constant() -> None:
    """Every test file but this one (its examples are the patterns); bench/ is outside tests/."""
    offenders = [
        f"{path.relative_to(TESTS.parent)}:{line}"
        for path in sorted(TESTS.rglob("*.py"))
        if path.resolve() != Path(__file__).resolve()
        for line in timed_assertions(path.read_text())
    ]
    assert offenders == [], "assert behaviour, and measure speed in bench/: " + ", ".join(offenders)

"""docs/extending.md is followed to the letter: its example scorer and filter (the fenced blocks marked
``<!-- extending-example: PATH -->``) are written into a copy of the repository, its registry edits
(the blocks marked ``<!-- extending-registration: PATH -->``) are applied there, and the registry,
bounds and declared-reads tests run on that copy. A copy of the page with a wrong snippet must fail them.

Each run is a pytest in a subprocess on the copied tree (a few seconds; pure tests, no database).
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "extending.md"
BLOCK = re.compile(
    r"<!-- extending-(example|registration): (\S+) -->\n[ \t]*```python\n(.*?)\n[ \t]*```", re.S
)
CHECKS = (
    "tests/placement/test_bounds.py",
    "tests/placement/test_scorer_contract.py",
    "tests/placement/test_filter_registry.py",
    "tests/placement/test_declared_reads.py",
    "tests/placement/test_scoring.py",
)
REGISTERED = (
    "from app.placement.filters import FILTER_NAMES\n"
    "from app.placement.scorers import SCORER_NAMES\n"
    "print('scorers', *SCORER_NAMES)\n"
    "print('filters', *FILTER_NAMES)\n"
)


def doc_blocks(text: str) -> list[tuple[str, str, str]]:
    """The marked blocks of the page: ``(kind, path, code)``, kind ``example`` or ``registration``."""
    return [(kind, path, textwrap.dedent(code)) for kind, path, code in BLOCK.findall(text)]


def _statement_key(stmt: ast.stmt) -> tuple[str, str] | None:
    if isinstance(stmt, ast.ImportFrom):
        return ("import", stmt.module or "")
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
        return ("assign", stmt.target.id)
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
        return ("assign", stmt.targets[0].id)
    return None


def apply_registration(source: str, block: str) -> str:
    """``source`` (a registry module) with each top-level statement that ``block`` restates (an import
    from the same module, an assignment to the same name) replaced by the block's version. Raises
    AssertionError when the module has no such statement: the page shows an edit that cannot be made."""
    lines = source.splitlines(keepends=True)
    module = ast.parse(source)
    edits: list[tuple[int, int, str]] = []
    for stmt in ast.parse(block).body:
        key = _statement_key(stmt)
        found = [old for old in module.body if key is not None and _statement_key(old) == key]
        assert len(found) == 1, f"the registry module has no single statement {key} to replace"
        segment = ast.get_source_segment(block, stmt)
        assert segment is not None and found[0].end_lineno is not None
        edits.append((found[0].lineno, found[0].end_lineno, segment + "\n"))
    for start, end, text in sorted(edits, reverse=True):
        lines[start - 1 : end] = [text]
    return "".join(lines)


def follow_the_doc(text: str, into: Path) -> Path:
    """A copy of the repository's ``app`` and ``tests`` under ``into`` with the page's examples written
    and its registrations applied; returns the copy's root."""
    copy = into / "repo"
    for part in ("app", "tests"):
        shutil.copytree(ROOT / part, copy / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    for kind, path, code in doc_blocks(text):
        target = copy / path
        if kind == "example":
            assert not target.exists(), f"{path} exists already: the example must be a new module"
            target.write_text(code + "\n")
        else:
            target.write_text(apply_registration(target.read_text(), code))
    return copy


def run_checks(copy: Path, checks: tuple[str, ...] = CHECKS) -> subprocess.CompletedProcess[str]:
    """Print the registries of the copy, then run ``checks`` there (by default the registry, bounds,
    declared-reads and scoring tests)."""
    env = {**os.environ, "PYTHONPATH": str(copy), "PYTHONDONTWRITEBYTECODE": "1"}
    # -n 0: this run is one test of a worker already; its checks run in this one process
    command = (
        f"{sys.executable} -c {_quote(REGISTERED)} && "
        f"{sys.executable} -m pytest -q -x -n 0 -p no:cacheprovider {' '.join(checks)}"
    )
    return subprocess.run(
        ["bash", "-c", command], cwd=copy, env=env, capture_output=True, text=True, timeout=600, check=False
    )


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def test_the_page_marks_a_scorer_a_filter_and_their_registrations() -> None:
    blocks = doc_blocks(DOC.read_text())
    assert [(kind, path) for kind, path, _ in blocks] == [
        ("example", "app/placement/scorers/lowfirst.py"),
        ("registration", "app/placement/scorers/__init__.py"),
        ("example", "app/placement/filters/drain.py"),
        ("registration", "app/placement/filters/__init__.py"),
    ]
    # two files per addition: the new module and the registry it is added to
    for kind, path, _ in blocks:
        assert (ROOT / path).exists() == (kind == "registration"), path


def test_following_the_page_registers_both_and_passes_the_checks(tmp_path: Path) -> None:
    result = run_checks(follow_the_doc(DOC.read_text(), tmp_path))
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    registered = dict(line.split(" ", 1) for line in result.stdout.splitlines()[:2])
    assert registered["scorers"].split() == ["binpack", "spread", "topology", "numa", "lowfirst"]
    assert registered["filters"].split()[:3] == ["schedulable", "drain", "labels"]


def test_the_pages_scorer_at_a_non_zero_weight_keeps_the_bound(tmp_path: Path) -> None:
    # weighted, the scorer adds to the pick score: the bounds are derived from the registry and hold it
    # (the scoring tests that pin a ranking would rightly change, so they are not run here)
    text = DOC.read_text()
    assert text.count("DEFAULT_WEIGHT = 0.0") == 1
    copy = follow_the_doc(text.replace("DEFAULT_WEIGHT = 0.0", "DEFAULT_WEIGHT = 0.5"), tmp_path)
    result = run_checks(copy, CHECKS[:-1])
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]


WRONG = {
    # the filter reads the node's labels without declaring it: the declared-reads test catches it
    "filter-undeclared-read": (
        'NODE_READS = ("inventory.name", "inventory.labels")',
        'NODE_READS = ("inventory.name",)',
    ),
    # a scorer without DEPENDS fails registration at import
    "scorer-without-depends": ("DEPENDS = PICK\n", ""),
    # a registration that drops a built-in scorer fails the registry test
    "registration-drops-a-builtin": (
        "ScorerSet.of(binpack, spread, topology, numa, lowfirst)",
        "ScorerSet.of(binpack, spread, topology, lowfirst)",
    ),
}


@pytest.mark.parametrize("case", sorted(WRONG))
def test_a_page_with_a_wrong_snippet_fails_the_checks(case: str, tmp_path: Path) -> None:
    right, wrong = WRONG[case]
    text = DOC.read_text()
    assert text.count(right) == 1, right  # the mutation must hit the page's snippet
    result = run_checks(follow_the_doc(text.replace(right, wrong), tmp_path))
    assert result.returncode != 0, result.stdout[-2000:]

"""The repository stands on its own (docs/architecture.md): nothing in it cites a file outside it, and every
repository path a doc names exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# the design and the specifications this project was first written from live outside the repository
OUTSIDE = re.compile("DESIGN" + r"\.md|STYLE" + r"\.md|seed" + r" 00[0-9]", re.IGNORECASE)
NAMED_PATH = re.compile(r"`((?:app|tests|docs|bench|alembic|openapi|examples)/[A-Za-z0-9_./-]+)`")


def _texts() -> list[Path]:
    return [
        ROOT / "README.md",
        *(ROOT / "docs").rglob("*.md"),
        *(ROOT / "app").rglob("*.py"),
        *(ROOT / "tests").rglob("*.py"),
        *(ROOT / "bench").rglob("*.py"),
    ]


def test_nothing_cites_a_file_outside_the_repository() -> None:
    cites = [str(p.relative_to(ROOT)) for p in _texts() if OUTSIDE.search(p.read_text())]
    assert cites == []


def test_the_check_sees_a_citation() -> None:
    assert OUTSIDE.search("as " + "DESIGN" + ".md says") and OUTSIDE.search("(" + "Seed" + " 004, explain)")


def test_every_path_a_doc_names_exists() -> None:
    missing = []
    for doc in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]:
        for named in NAMED_PATH.findall(doc.read_text()):
            path = named.rstrip(".")
            if "*" in path or "<" in path:
                continue
            if not (ROOT / path).exists():
                missing.append(f"{doc.relative_to(ROOT)}: {named}")
    assert missing == []


def test_the_architecture_page_names_every_module_of_the_rooms() -> None:
    """docs/architecture.md lists every module of app/capacity, app/placement and app/quota with its
    concern, so a new module cannot be left out of the map."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    left_out = [
        str(path.relative_to(ROOT))
        for package in ("capacity", "placement", "quota")
        for path in sorted((ROOT / "app" / package).rglob("*.py"))
        if path.name != "__init__.py"
        and f"`{path.name}`" not in page
        and str(path.relative_to(ROOT)) not in page
    ]
    assert left_out == []

"""``better-compute serve --workers 2`` (issue 28): one scrape of ``/metrics`` reports both workers'
counters summed (docs/metrics.md, "Workers"), and a key limited to 50 a minute gets 50 requests, not 50
per worker (docs/operating.md, "Rate limits").

Every request opens a connection of its own, several at once, so both workers accept some; the test
counts answers and samples, never times them.
"""

from __future__ import annotations

import ast
import asyncio
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.multiprocess import MultiProcessCollector
from sqlalchemy.ext.asyncio import AsyncEngine

from app.observability.multiprocess import FOLDER_VARIABLE
from tests.api.metrics_text import parse, value
from tests.conftest import ADMIN_KEY
from tests.servers import Server, running_server

REQUESTS = 100
LIMIT = 50
AT_ONCE = 8
ROUTE = "/v1/pools"

LINUX_PROC = pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc (Linux)")


@pytest.fixture
def two_workers(database_url: str, clean_db: AsyncEngine, tmp_path: Path) -> Iterator[Server]:
    """``serve --workers 2`` with every key limited to 50 requests a minute, counted in PostgreSQL."""
    limited = {"BC_RATE_LIMIT": f"{LIMIT}/minute", "BC_RATE_LIMIT_STORAGE": "postgresql"}
    with running_server(database_url, tmp_path, extra_env=limited, args=["--workers", "2"]) as server:
        yield server


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _metrics_folder(server: Server) -> Path:
    """The folder ``serve`` named for its workers (read from a worker's environment)."""
    for child in _children(server.process.pid):
        try:
            environment = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for entry in environment:
            name, _, folder = entry.decode(errors="replace").partition("=")
            if name == FOLDER_VARIABLE:
                return Path(folder)
    raise AssertionError(f"no worker of {server.process.pid} has {FOLDER_VARIABLE}:\n{server.output()}")


def _requests_per_process(folder: Path) -> dict[int, float]:
    """``bc_http_requests_total{route=ROUTE}`` of each process, from its own file."""
    served = {}
    for file in folder.glob("counter_*.db"):
        pid = int(file.stem.split("_")[1])
        served[pid] = sum(
            sample.value
            for metric in MultiProcessCollector.merge([str(file)])
            for sample in metric.samples
            if sample.name == "bc_http_requests_total" and sample.labels["route"] == ROUTE
        )
    return served


@LINUX_PROC
async def test_two_workers_answer_one_scrape_and_share_one_limit(two_workers: Server) -> None:
    folder = _metrics_folder(two_workers)
    fresh = httpx.Limits(max_keepalive_connections=0)  # a connection per request: both workers accept
    at_once = asyncio.Semaphore(AT_ONCE)
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    async with httpx.AsyncClient(
        base_url=two_workers.url, headers=headers, limits=fresh, timeout=60
    ) as client:

        async def one() -> httpx.Response:
            async with at_once:
                return await client.get(ROUTE)

        answers = await asyncio.gather(*(one() for _ in range(REQUESTS)))
        scrape = (await client.get("/metrics")).text

    statuses = Counter(answer.status_code for answer in answers)
    assert statuses == {200: LIMIT, 429: REQUESTS - LIMIT}, statuses
    assert {a.json()["error"]["code"] for a in answers if a.status_code == 429} == {"RATE_LIMITED"}

    samples = parse(scrape)
    counted = {
        code: value(samples, "bc_http_requests_total", route=ROUTE, method="GET", code=code)
        for code in ("200", "429")
    }
    assert counted == {"200": LIMIT, "429": REQUESTS - LIMIT}, scrape
    assert value(samples, "bc_guard_refusals_total", code="RATE_LIMITED") == REQUESTS - LIMIT
    assert value(samples, "bc_placement_attempts_total", result="placed", placer="inline") == 0
    families = [line for line in scrape.splitlines() if line.startswith("# TYPE ")]
    assert len(families) == len(set(families)), "a family reported twice"
    assert sum(line.startswith("bc_build_info{") for line in scrape.splitlines()) == 1

    per_process = _requests_per_process(folder)
    assert len(per_process) == 2, f"files of {sorted(per_process)} in {os.fspath(folder)}"
    assert sum(per_process.values()) == REQUESTS, per_process  # the scrape summed exactly these


def test_every_gauge_names_how_workers_merge_it() -> None:
    """A ``Gauge`` of the service says how a scrape merges the workers' values (docs/metrics.md,
    "Workers"): prometheus_client's default, ``all``, would report one series per worker process."""
    unnamed = []
    for path in (Path(__file__).resolve().parents[1] / "app").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", getattr(node.func, "attr", "")) == "Gauge"
            ):
                modes = [k.value for k in node.keywords if k.arg == "multiprocess_mode"]
                if not modes or (isinstance(modes[0], ast.Constant) and modes[0].value == "all"):
                    unnamed.append(f"{path.name}:{node.lineno}")
    assert unnamed == []

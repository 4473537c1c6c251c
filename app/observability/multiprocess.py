"""Metrics of several worker processes in one scrape: prometheus_client's multiprocess mode
(docs/metrics.md, "Workers").

``better-compute serve --workers N`` (N > 1) makes a fresh, private folder and names it in
``PROMETHEUS_MULTIPROC_DIR`` before uvicorn starts the workers (:func:`prepare_folder`). prometheus_client
reads that variable when a worker imports it, and from then on every counter and histogram of the worker
lives in memory-mapped files there, one per process. A scrape, answered by whichever worker accepted it,
reads every process's files (:func:`merged_registry`): counters and histograms are summed over the
workers, and a process that exited still counts (its files stay), so no sum ever goes down. A gauge is
merged as its ``multiprocess_mode`` says, which each gauge of :mod:`app.observability.metrics` must name
(``livesum`` for what each worker holds now, ``mostrecent`` or ``max`` for a value every worker reads
from the database). A worker that stops drops its live gauges (:func:`process_exited`).

What is the same in every worker is collected by the scraping worker alone, once: the build info and the
fleet gauges counted in PostgreSQL. The ``process_*`` and ``python_*`` series describe one process and
cannot be merged, so they are left out with several workers. With one process (``--workers 1``, tests)
none of this runs: the default registry is served as before.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

from prometheus_client import CollectorRegistry, multiprocess
from prometheus_client.registry import Collector

FOLDER_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client's own name for the folder


def prepare_folder() -> Path:
    """Make a fresh, empty folder only this user can read, name it in ``PROMETHEUS_MULTIPROC_DIR`` for
    the workers this process starts, and remove it when this process exits. Call it before the workers
    start and after this process imported prometheus_client (it keeps its own metrics in memory)."""
    folder = Path(tempfile.mkdtemp(prefix="bc-metrics-"))  # mode 0700, never a previous run's files
    os.environ[FOLDER_VARIABLE] = str(folder)
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def merged_registry(folder: Path, *same_everywhere: Collector) -> CollectorRegistry:
    """A registry whose scrape reads every process's files in ``folder``, plus the collectors
    ``same_everywhere`` of this process (values every worker would report alike)."""
    registry = CollectorRegistry(auto_describe=True)
    multiprocess.MultiProcessCollector(registry, path=str(folder))
    for collector in same_everywhere:
        registry.register(collector)
    return registry


def process_exited(folder: Path | None) -> None:
    """Drop this process's live gauges (``live*`` modes) from ``folder``, when there is one: the worker is
    stopping. Its counters and histograms stay counted."""
    if folder is not None:
        multiprocess.mark_process_dead(os.getpid(), str(folder))

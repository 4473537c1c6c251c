"""Benchmark: ``placement explain`` over fleets of 100, 1,000 and 10,000 targets (docs/explain.md).

A mixed fleet: scheduler lanes and daemon hosts, about a third of them rejected (stale, another OS,
lacking the account or too small), the rest ranked, some with unknown components. Prints the median of
``--repeat`` runs for each stage (validating the fleet document, explaining, JSON and text output), the
per-target cost of each, and the ratio of the 10,000-target time to 100 x the 100-target time (1.0 =
linear).

    python bench/explain.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.fleet.documents import load_fleet, load_request  # noqa: E402
from app.fleet.explain import explain_placement  # noqa: E402
from app.fleet.render import render_text, to_json  # noqa: E402

NOW = datetime(2026, 10, 12, 12, 0, tzinfo=UTC)
DIGEST = "a" * 64
SIZES = (100, 1_000, 10_000)


def fleet_document(size: int) -> dict[str, Any]:
    """``size`` targets: 3 of 4 scheduler lanes, 1 of 4 daemons; every 3rd one fails something."""
    targets = []
    for i in range(size):
        kind = "daemon" if i % 4 == 0 else "scheduler"
        target: dict[str, Any] = {
            "name": f"site-{i // 50}/lane-{i}",
            "kind": kind,
            "observed_at": "2026-10-12T11:59:00+00:00" if i % 9 != 3 else "2026-10-12T11:00:00+00:00",
            "reachable": True,
            "os": "Linux" if i % 9 != 6 else "Darwin",
            "arch": "x86_64",
            "isa_levels": ["x86-64-v2", "x86-64-v3", "x86-64-v4"],
            "programs": {"vibe-qc": [DIGEST, "b" * 64], "other": ["c" * 64]},
            "accounts": ["chem", "bio"] if i % 9 != 0 else ["bio"],
            "data_access": ["shared-inputs", "results"],
            "node": {"cpus": 64 + (i % 5) * 16, "mem_mb": 256000, "scratch_mb": 500000, "gpus": i % 3},
            "speed_factor": 1.0 + (i % 7) / 4,
            "speed_source": "benchmark",
            "staging_mb_per_second": 100 + i % 11,
        }
        if i % 5 != 2:
            target["transfer_mb_per_second"] = 200
        if kind == "daemon":
            target["walltime_unlimited"] = True
            target["free"] = {"cpus": (i * 7) % 80, "mem_mb": 200000, "scratch_mb": 100000}
            if i % 8 == 0:
                target["queue_wait_seconds"] = {"low": 60, "high": 900, "source": "declared"}
        else:
            target["queue"] = "compute"
            target["max_nodes"] = 16
            target["max_walltime_seconds"] = 172800
            target["queue_wait_seconds"] = {
                "low": 600 + i % 13 * 60,
                "high": 7200 + i % 17 * 300,
                "source": "history",
            }
        targets.append(target)
    return {"schema_name": "vq.placement-fleet/1", "targets": targets}


REQUEST = {
    "schema_name": "vq.placement-request/1",
    "program": "vibe-qc",
    "runtime_digest": DIGEST,
    "os": "Linux",
    "isa_level": "x86-64-v3",
    "account": "chem",
    "required_data_access": ["shared-inputs"],
    "cpus": 48,
    "mpi_ranks": 6,
    "threads_per_rank": 8,
    "mem_mb_per_node": 128000,
    "scratch_mb_per_node": 100000,
    "wall_time_seconds": 86400,
    "runtime_seconds": {"low": 6000, "high": 8400},
    "input_mb": 1000,
    "output_mb": 500,
}


def median_seconds(run: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    request = load_request(REQUEST)
    rows = []
    for size in SIZES:
        document = fleet_document(size)
        fleet = load_fleet(document)
        explanation = explain_placement(fleet, request, NOW)
        stages = {
            "validate": median_seconds(lambda d=document: load_fleet(d), args.repeat),
            "explain": median_seconds(lambda f=fleet: explain_placement(f, request, NOW), args.repeat),
            "json": median_seconds(lambda e=explanation: json.dumps(to_json(e), indent=2), args.repeat),
            "text": median_seconds(lambda e=explanation: render_text(e), args.repeat),
        }
        rows.append((size, len(explanation.candidates), len(explanation.rejected), stages))

    print(f"placement explain, median of {args.repeat} runs (ms; per target in µs)")
    header = f"{'targets':>8} {'ranked':>7} {'rejected':>8}"
    for stage in ("validate", "explain", "json", "text"):
        header += f" {stage + ' ms':>12} {'µs/tgt':>7}"
    header += f" {'total ms':>10}"
    print(header)
    for size, ranked, rejected, stages in rows:
        line = f"{size:>8} {ranked:>7} {rejected:>8}"
        for seconds in stages.values():
            line += f" {seconds * 1000:>12.2f} {seconds / size * 1e6:>7.1f}"
        line += f" {sum(stages.values()) * 1000:>10.1f}"
        print(line)
    small, large = rows[0], rows[-1]
    scale = large[0] / small[0]
    for stage in ("validate", "explain", "json", "text"):
        ratio = large[3][stage] / (small[3][stage] * scale)
        print(f"{stage}: {large[0]:,} targets take {ratio:.2f} x linear from {small[0]}")


if __name__ == "__main__":
    main()

"""Prometheus metrics of the capacity path (served at ``/metrics``)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

RESERVATIONS = Counter(
    "bc_reservations_total", "Reservations created, by outcome (placed, pending, replayed).", ["outcome"]
)
LOST_RACES = Counter("bc_commit_lost_races_total", "Guarded commits that lost a race and replanned.")
PLANS = Counter("bc_plans_total", "Plans made, by path (shortlist or full pool).", ["path"])
PLAN_SECONDS = Histogram(
    "bc_plan_seconds",
    "Time to read the snapshot and plan one request (seconds).",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)

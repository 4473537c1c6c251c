"""The kinds of docs/placement-rules.md's four lost-race reasons (the ``reason`` label of
``bc_lost_races_total``), in
the reasons' order: one home, imported by the guarded commit and the metrics (which the commit's quota
charge imports, so they cannot live in :mod:`app.capacity.commit.single` itself)."""

from __future__ import annotations

NOT_SCHEDULABLE = "not_schedulable"
ATOM_UNHEALTHY = "atom_unhealthy"
ATOM_BOOKED = "atom_booked"
SCALAR_RAN_OUT = "scalar_ran_out"
LOST_RACE_KINDS = (NOT_SCHEDULABLE, ATOM_UNHEALTHY, ATOM_BOOKED, SCALAR_RAN_OUT)

"""The kinds of seed 000's four lost-race reasons (the ``reason`` label of ``bc_lost_races_total``), in
the reasons' order: one home, imported by the guarded commit and the metrics (which the commit's quota
charge imports, so they cannot live in :mod:`app.capacity.commit.single` itself)."""

from __future__ import annotations

from collections.abc import Sequence

NOT_SCHEDULABLE = "not_schedulable"
ATOM_UNHEALTHY = "atom_unhealthy"
ATOM_BOOKED = "atom_booked"
SCALAR_RAN_OUT = "scalar_ran_out"
LOST_RACE_KINDS = (NOT_SCHEDULABLE, ATOM_UNHEALTHY, ATOM_BOOKED, SCALAR_RAN_OUT)


def unschedulable_after(reasons: Sequence[str]) -> str:
    """The pending reason once every attempt of a placement lost a race: ``Unschedulable after <n>
    conflicting attempts: <reason>; <reason>; ...`` with one lost-race reason per attempt, in attempt
    order. The one home of this text, used by the inline placer and the batch."""
    return f"Unschedulable after {len(reasons)} conflicting attempts: {'; '.join(reasons)}"

"""The books' invariants as one SQL sweep, shared by every stress and race test (issue 21, "The
invariants as a standing check"; the rules are on docs/lifecycle.md and docs/architecture.md).

:data:`CHECKS` maps an invariant's name to a query that returns the rows breaking it, so every check must
return no row. :func:`violations` runs them all and returns the failing ones. ``tests/capacity/
test_invariants.py`` writes a violating row for each check (bypassing the guards) and sees the sweep
report it, so no check is vacuous.

What is checked, after every run:

- no two bookings of one device overlap in time;
- at every instant where a holding starts (the held amount is a step function that only rises there),
  a node's scalar holdings are within ``floor(allocatable x ratio)`` and a tenant's quota holdings within
  its limit;
- placed reservations are complete: one live allocation per gang member on distinct nodes, scalar and
  quota holdings equal to what the spec asks over the window, bookings equal to the allocation's atoms
  (a whole-node lease books every atom of its node: its atoms plus those it holds unused), on its node
  and window, as many atoms as requested (a lease: at least as many);
- nothing is held after a release, an end, a cut or a preemption, and a pending reservation holds
  nothing but its planned window, which is live, starts at its ``planned_start`` and holds no quota
  (docs/lifecycle.md, "Planned starts");
- nothing is in use on an unhealthy or unbookable atom once BookingRepair has settled (the caller
  runs the sweep after the repairs, or leaves this check out while an atom is known to be broken);
- a whole-node lease books every atom of its node, and its node holds nothing else in its window
  (no other allocation's booking or scalar holding overlaps it);
- no reservation is placed twice: two allocations of a one-member reservation never hold at the same
  instant.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

# what a reservation asks of its tenant's quota, from its spec (a gang charges every member)
WANTED = """
    SELECT r.id, r.tenant_id, r.pool_id, d->>'class' AS resource,
           (d->>'count')::numeric * coalesce((r.spec->'gang'->>'members')::int, 1) AS n
      FROM reservations r, jsonb_array_elements(r.spec->'devices') d
     WHERE (d->>'count')::int > 0
    UNION ALL
    SELECT r.id, r.tenant_id, r.pool_id, x.key,
           x.value::numeric * coalesce((r.spec->'gang'->>'members')::int, 1)
      FROM reservations r, jsonb_each_text(coalesce(r.spec->'resources', '{}'::jsonb)) x
"""

# the instants an allocation held its node: [start, min(end, released at)), empty when released before
# its start
HELD = """tstzrange(lower({a}.during),
                     greatest(lower({a}.during),
                              least(upper({a}.during), coalesce({a}.released_at, upper({a}.during)))),
                     '[)')"""

# a whole-node lease's allocations, with the window their bookings and holdings cover
LEASES = (
    """
    SELECT a.id, a.node_id, a.reservation_id, """
    + HELD.format(a="a")
    + """ AS held
      FROM allocations a JOIN reservations r ON r.id = a.reservation_id
     WHERE r.spec->>'binding' = 'node'
"""
)

IS_LEASE = "(r.spec->>'binding' = 'node')"

CHECKS: dict[str, str] = {
    # two bookings of one device whose windows overlap
    "overlapping bookings": """
        SELECT a.device_id, a.allocation_id, b.allocation_id
          FROM device_bookings a
          JOIN device_bookings b
            ON a.device_pk = b.device_pk AND a.allocation_id < b.allocation_id AND a.during && b.during
    """,
    # the per-instant sweep: at every instant where a holding starts, what the node holds is within
    # floor(allocatable * ratio)
    "scalar over capacity at an instant": """
        WITH instants AS (SELECT DISTINCT node_id, resource, starts_at AS t FROM scalar_holdings)
        SELECT i.node_id, i.resource, i.t, sum(h.amount), floor(nr.allocatable * nr.ratio)
          FROM instants i
          JOIN scalar_holdings h
            ON h.node_id = i.node_id AND h.resource = i.resource AND h.starts_at <= i.t AND h.ends_at > i.t
          JOIN node_resources nr ON nr.node_id = i.node_id AND nr.resource = i.resource
         GROUP BY i.node_id, i.resource, i.t, nr.allocatable, nr.ratio
        HAVING sum(h.amount) > floor(nr.allocatable * nr.ratio)
    """,
    # the same sweep over each tenant's quota holdings against its limits
    "quota over limit at an instant": """
        WITH instants AS (SELECT DISTINCT tenant_id, pool_id, resource, starts_at AS t FROM quota_holdings)
        SELECT i.tenant_id, i.resource, i.t, sum(h.amount), l."limit"
          FROM instants i
          JOIN quota_holdings h
            ON h.tenant_id = i.tenant_id AND h.pool_id = i.pool_id AND h.resource = i.resource
           AND h.starts_at <= i.t AND h.ends_at > i.t
          JOIN quota_limits l
            ON l.tenant_id = i.tenant_id AND l.pool_id = i.pool_id AND l.resource = i.resource
         GROUP BY i.tenant_id, i.pool_id, i.resource, i.t, l."limit"
        HAVING sum(h.amount) > l."limit"
    """,
    # a live allocation holds exactly its resources over its window; a released one at most up to its
    # release instant (rows that had not started are gone)
    "scalar holdings != allocations": """
        WITH asked AS (
                SELECT a.id, a.node_id, x.key AS resource, x.value::numeric AS n, a.during, a.released_at
                  FROM allocations a, jsonb_each_text(a.resources) x
             )
        SELECT coalesce(q.id, h.allocation_id), coalesce(q.resource, h.resource), q.n, h.amount
          FROM asked q
          FULL JOIN scalar_holdings h ON h.allocation_id = q.id AND h.resource = q.resource
         WHERE q.id IS NULL
            OR (q.released_at IS NULL
                AND (h.allocation_id IS NULL OR h.amount <> q.n OR h.node_id <> q.node_id
                     OR h.starts_at <> lower(q.during) OR h.ends_at <> upper(q.during)))
            OR (q.released_at IS NOT NULL AND h.allocation_id IS NOT NULL
                AND (h.amount <> q.n OR h.starts_at <> lower(q.during) OR h.ends_at > q.released_at
                     OR h.ends_at > upper(q.during)))
    """,
    # a placed reservation (or one ended after it was placed) holds for its tenant exactly what its spec
    # asks over its window; a pending or queued one holds nothing, nor one ended while it waited; a
    # released or preempted one nothing after that instant
    "quota holdings != reservations": """
        WITH wanted AS ("""
    + WANTED
    + """),
             windows AS (   -- the window of the current placement: the allocations ending where the
                            -- live ones end (a repair that moved the work keeps the end; one that left
                            -- it pending dropped the quota, and a wake placed it anew)
                SELECT a.reservation_id AS id, min(lower(a.during)) AS s, max(upper(a.during)) AS e
                  FROM allocations a
                 WHERE upper(a.during) = (SELECT max(upper(l.during))
                                            FROM allocations l
                                           WHERE l.reservation_id = a.reservation_id
                                             AND l.released_at IS NULL)
                 GROUP BY 1
             )
        SELECT coalesce(w.id, h.reservation_id), coalesce(w.resource, h.resource), r.status, w.n, h.amount
          FROM wanted w
          JOIN reservations r ON r.id = w.id
          LEFT JOIN windows x ON x.id = w.id
          FULL JOIN quota_holdings h ON h.reservation_id = w.id AND h.resource = w.resource
         WHERE w.id IS NULL
            OR ((r.status = 'placed' OR (r.status = 'ended' AND x.id IS NOT NULL))
                AND (h.reservation_id IS NULL OR h.amount <> w.n OR h.tenant_id <> w.tenant_id
                     OR h.starts_at <> x.s OR h.ends_at <> x.e))
            OR (r.status IN ('pending', 'queued') AND h.reservation_id IS NOT NULL)
            -- ended while it waited (its deadline or start passed): never charged
            OR (r.status = 'ended' AND x.id IS NULL AND h.reservation_id IS NOT NULL)
            OR (r.status IN ('released', 'preempted') AND h.reservation_id IS NOT NULL
                AND h.ends_at > r.released_at)
    """,
    # a placed reservation has one live allocation per member, on distinct nodes; an ended one those it
    # had (its allocations are history with no releasedAt) or none; others have none
    "placed reservation without one live allocation per member": """
        SELECT r.id, r.status, count(a.id)
          FROM reservations r
          LEFT JOIN allocations a ON a.reservation_id = r.id AND a.released_at IS NULL AND NOT a.planned
         GROUP BY r.id, r.status, r.spec
        HAVING (r.status = 'placed' AND count(a.id) <> coalesce((r.spec->'gang'->>'members')::int, 1))
            -- an ended one keeps its allocations as history (none: it ended while it waited)
            OR (r.status = 'ended'
                AND count(a.id) NOT IN (0, coalesce((r.spec->'gang'->>'members')::int, 1)))
            OR (r.status NOT IN ('placed', 'ended') AND count(a.id) > 0)
            OR count(a.id) > coalesce((r.spec->'gang'->>'members')::int, 1)
            OR count(a.id) <> count(DISTINCT a.node_id)
    """,
    # a pending reservation keeps no live allocation but its planned window (lost races roll back to the
    # savepoint; a repair that found no room keeps the cut one as history) and nothing booked after that
    # cut; a planned window is checked by the next check
    "pending reservation holding something": """
        SELECT r.id, a.id FROM reservations r JOIN allocations a ON a.reservation_id = r.id
         WHERE r.status IN ('pending', 'queued')
           AND NOT (a.planned AND r.status = 'pending')
           AND (a.released_at IS NULL
                OR EXISTS (SELECT 1 FROM device_bookings b
                            WHERE b.allocation_id = a.id AND upper(b.during) > a.released_at)
                OR EXISTS (SELECT 1 FROM scalar_holdings h
                            WHERE h.allocation_id = a.id AND h.ends_at > a.released_at))
    """,
    # a planned window (docs/lifecycle.md, "Planned starts") belongs to a pending, not spot reservation
    # whose plannedStart is its start, is live and not started by the last sweep of planned starts'
    # instant; a reservation with a plannedStart has a planned window
    "planned window out of place": """
        SELECT r.id, r.status, a.id
          FROM reservations r
          LEFT JOIN allocations a ON a.reservation_id = r.id AND a.planned
         WHERE (a.id IS NOT NULL
                AND (r.status <> 'pending' OR r.planned_start IS NULL OR a.released_at IS NOT NULL
                     OR lower(a.during) <> r.planned_start
                     OR coalesce((r.spec->>'spot')::boolean, false)))
            OR (a.id IS NULL AND r.planned_start IS NOT NULL)
    """,
    # a live allocation's bookings are exactly its atoms; a whole-node lease's are its atoms and the
    # atoms it holds unused (on its node: the next check)
    "allocation atoms != bookings": (
        """
        SELECT a.id, a.atoms, array_agg(b.device_id ORDER BY b.device_id)
          FROM allocations a
          JOIN reservations r ON r.id = a.reservation_id
          LEFT JOIN device_bookings b ON b.allocation_id = a.id
         WHERE a.released_at IS NULL
         GROUP BY a.id, a.atoms, r.spec
        HAVING NOT (coalesce(array_agg(b.device_id) FILTER (WHERE b.device_id IS NOT NULL), '{}'::text[])
                    @> a.atoms)
            OR (NOT """
        + IS_LEASE
        + """ AND count(b.device_id) <> cardinality(a.atoms))
            OR count(b.device_id) <> count(DISTINCT b.device_id)
    """
    ),
    # bookings are on the allocation's node and over its window (cut at the release instant if released)
    "booking on another node or window": """
        SELECT b.device_id, a.id
          FROM device_bookings b
          JOIN allocations a ON a.id = b.allocation_id
          JOIN devices d ON d.pk = b.device_pk
         WHERE d.node_id <> a.node_id OR d.id <> b.device_id
            OR (a.released_at IS NULL AND b.during <> a.during)
            OR (a.released_at IS NOT NULL
                AND (lower(b.during) <> lower(a.during) OR upper(b.during) > a.released_at))
    """,
    # the atom count of a placed reservation is what its spec asked for (a lease: at least that, it
    # takes the whole node)
    "placed atoms != requested count": (
        """
        SELECT r.id, cardinality(a.atoms), s.n
          FROM reservations r
          JOIN allocations a ON a.reservation_id = r.id AND a.released_at IS NULL
          CROSS JOIN LATERAL (
                SELECT coalesce(sum((d->>'count')::int), 0) AS n
                  FROM jsonb_array_elements(r.spec->'devices') d
          ) s
         WHERE r.status = 'placed'
           AND (cardinality(a.atoms) < s.n OR (NOT """
        + IS_LEASE
        + """ AND cardinality(a.atoms) <> s.n))
    """
    ),
    # nothing is held after a release, an end or a preemption: no live allocation, no booking or holding
    # past that instant
    "released, ended or preempted reservation still holding": """
        SELECT r.id, r.status, a.id
          FROM reservations r
          JOIN allocations a ON a.reservation_id = r.id
         WHERE (r.status IN ('released', 'preempted')
                AND (a.released_at IS NULL
                     OR EXISTS (SELECT 1 FROM device_bookings b
                                 WHERE b.allocation_id = a.id AND upper(b.during) > r.released_at)
                     OR EXISTS (SELECT 1 FROM scalar_holdings h
                                 WHERE h.allocation_id = a.id AND h.ends_at > r.released_at)))
            OR (r.status = 'ended'
                AND (EXISTS (SELECT 1 FROM device_bookings b
                              WHERE b.allocation_id = a.id AND upper(b.during) > r.ends_at)
                     OR EXISTS (SELECT 1 FROM scalar_holdings h
                                 WHERE h.allocation_id = a.id AND h.ends_at > r.ends_at)))
    """,
    # once BookingRepair has settled, no placed reservation uses an unhealthy or unbookable atom for the
    # rest of its window (a lease's unused held atoms are not in use; gangs are not repaired yet,
    # docs/lifecycle.md "BookingRepair")
    "in use on an unavailable atom": """
        SELECT r.id, b.device_id
          FROM device_bookings b
          JOIN devices d ON d.pk = b.device_pk
          JOIN allocations a ON a.id = b.allocation_id AND a.released_at IS NULL
          JOIN reservations r ON r.id = a.reservation_id AND r.status = 'placed'
         WHERE NOT (d.healthy AND d.bookable) AND b.device_id = ANY(a.atoms) AND upper(b.during) > now()
           AND r.spec->'gang' IS NULL
    """,
    # a live whole-node lease books every atom of its node, whatever the atom's health
    "lease not holding every atom of its node": (
        """
        SELECT l.id, d.id
          FROM ("""
        + LEASES
        + """) l
          JOIN allocations a ON a.id = l.id AND a.released_at IS NULL AND upper(a.during) > now()
          JOIN devices d ON d.node_id = l.node_id
         WHERE NOT EXISTS (SELECT 1 FROM device_bookings b
                            WHERE b.allocation_id = l.id AND b.device_pk = d.pk)
    """
    ),
    # a leased node holds nothing else in the lease's window: no other allocation's booking or holding
    "leased node shared in its window": (
        """
        WITH leases AS ("""
        + LEASES
        + """),
             held AS (
                SELECT b.allocation_id, d.node_id, b.during
                  FROM device_bookings b JOIN devices d ON d.pk = b.device_pk
                UNION ALL
                SELECT h.allocation_id, h.node_id, tstzrange(h.starts_at, h.ends_at, '[)')
                  FROM scalar_holdings h
             )
        SELECT DISTINCT l.node_id, l.id, x.allocation_id
          FROM leases l
          JOIN held x ON x.node_id = l.node_id AND x.allocation_id <> l.id AND x.during && l.held
    """
    ),
    # no reservation is placed twice: two allocations of a one-member reservation never hold at once
    "reservation placed twice": (
        """
        SELECT r.id, x.id, y.id
          FROM reservations r
          JOIN allocations x ON x.reservation_id = r.id
          JOIN allocations y ON y.reservation_id = r.id AND x.id < y.id
         WHERE coalesce((r.spec->'gang'->>'members')::int, 1) = 1
           AND """
        + HELD.format(a="x")
        + " && "
        + HELD.format(a="y")
        + """
    """
    ),
}


async def violations(engine: AsyncEngine, skip: Iterable[str] = ()) -> dict[str, list[tuple[Any, ...]]]:
    """Run every check of :data:`CHECKS` but those named in ``skip``; returns the failing ones, each
    with up to 10 offending rows (an empty dict: every invariant holds)."""
    found: dict[str, list[tuple[Any, ...]]] = {}
    left_out = set(skip)
    async with engine.connect() as conn:
        for name, sql in CHECKS.items():
            if name in left_out:
                continue
            rows = [tuple(r) for r in (await conn.exec_driver_sql(sql)).all()]
            if rows:
                found[name] = rows[:10]
    return found


async def counts(engine: AsyncEngine) -> dict[str, int]:
    """Every check's number of offending rows (0 everywhere: the books are exact), for reports."""
    out: dict[str, int] = {}
    async with engine.connect() as conn:
        for name, sql in CHECKS.items():
            out[name] = len((await conn.exec_driver_sql(sql)).all())
    return out

"""The multi-row commit's guarded statements, each built and compiled once
(docs/placement-rules.md, "The guarded commit"; docs/scaling.md): lock the planned nodes per tenant
(:func:`lock_tenant_nodes_statement`), lock the atoms (:func:`lock_atoms_statement`), write the
allocations (:data:`INSERT_ALLOCATION`) and bookings (:data:`INSERT_BOOKINGS`, ``ON CONFLICT DO NOTHING
RETURNING``), lock the ``node_resources`` rows (:func:`lock_scalars_statement`) and hold the scalars per
window (:data:`HOLD_SCALARS`, one hold at a time with :data:`HOLD_SCALAR`). The commit that runs them is
:mod:`app.capacity.commit.multi_row`; the lock order is :mod:`app.db.locks`'s.
"""

from __future__ import annotations

from functools import cache

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.dialects.postgresql import insert as pg_insert

from app.capacity.predicates import schedulable_sql_within
from app.db.prepared import Prepared
from app.db.tables import (
    TS,
    allocations,
    device_bookings,
    devices,
    node_resources,
    nodes,
    pools,
    scalar_holdings,
)
from app.db.unnest import bound_rows
from app.db.windows import hold_if, holding_params, room_for

_H = holding_params(scalar_holdings)
# INSERT INTO scalar_holdings (allocation_id, resource, node_id, pool_id, amount, starts_at, ends_at)
# SELECT :allocation_id, :resource, :node_id, :pool_id, :amount, :starts_at, :ends_at FROM node_resources nr
#  WHERE nr.node_id = :node_id AND nr.resource = :resource
#    AND (<peak of the node's :resource holdings over [:starts_at, :ends_at), app/db/windows.py>) + :amount
#        <= floor(nr.allocatable * nr.ratio)              -- windows.room_for: the sweep only if needed
# RETURNING allocation_id                                  -- no row: ran out
HOLD_SCALAR = hold_if(
    scalar_holdings,
    _H,
    node_resources.c.node_id == _H["node_id"],
    node_resources.c.resource == _H["resource"],
    room_for(
        scalar_holdings,
        [scalar_holdings.c.node_id == _H["node_id"], scalar_holdings.c.resource == _H["resource"]],
        _H["starts_at"],
        _H["ends_at"],
        _H["amount"],
        sa.func.floor(node_resources.c.allocatable * node_resources.c.ratio),
    ),
)


_NODES = sa.bindparam("node_ids", type_=pg.ARRAY(sa.Text))
_ATOM_IDS = sa.bindparam("atom_ids", type_=pg.ARRAY(sa.Text))
_TOLERATED = sa.bindparam("tolerated", type_=pg.ARRAY(sa.Text))  # predicates.tolerated_reasons(tenant)


TOLERATED_SEPARATOR = "\n"  # joins a tenant's tolerated reasons in one text (no reason holds a newline)
_TENANT_NODES = bound_rows(
    "w",
    ("node_id", _NODES, sa.Text),
    ("tenant_id", "tenant_ids", sa.Text),
    ("tolerated", "tolerated", sa.Text),
)


@cache
def lock_tenant_nodes_statement(skip_locked: bool) -> Prepared:
    """The batch's node guard for all its tenants at once, built and compiled once per variant::

    SELECT n.id, w.tenant_id FROM nodes n JOIN pools p ON p.id = n.pool_id
      JOIN unnest(:node_ids, :tenant_ids, :tolerated) AS w(node_id, tenant_id, tolerated) ON w.node_id = n.id
     WHERE n.pool_id = :pool_id
       AND <schedulable tolerating string_to_array(w.tolerated, E'\\n')>  -- schedulable_sql_within
     ORDER BY n.id FOR SHARE OF n [SKIP LOCKED]        -- a (node, tenant) missing: no longer schedulable
    """
    allowed = sa.func.string_to_array(_TENANT_NODES.c.tolerated, TOLERATED_SEPARATOR, type_=pg.ARRAY(sa.Text))
    return Prepared(
        sa.select(nodes.c.id, _TENANT_NODES.c.tenant_id)
        .select_from(
            nodes.join(pools, pools.c.id == nodes.c.pool_id).join(
                _TENANT_NODES, _TENANT_NODES.c.node_id == nodes.c.id
            )
        )
        .where(
            nodes.c.pool_id == sa.bindparam("pool_id", type_=sa.Text),
            schedulable_sql_within(allowed),
        )
        .order_by(nodes.c.id)
        .with_for_update(read=True, of=nodes, skip_locked=skip_locked)
    )


@cache
def lock_atoms_statement(skip_locked: bool) -> Prepared:
    """The batch's atom guard, built and compiled once per variant::

    SELECT id, class, node_id FROM devices
     WHERE id = ANY(:atom_ids) AND deleted_at IS NULL AND healthy AND bookable
     ORDER BY id FOR SHARE [SKIP LOCKED]                  -- an atom missing: unhealthy or unbookable

    A device id names one live device (a deleted node's devices keep theirs as history); the caller
    checks that each row's node is the candidate's.
    """
    return Prepared(
        sa.select(devices.c.id, devices.c["class"], devices.c.node_id)
        .where(
            devices.c.id == sa.any_(_ATOM_IDS),
            devices.c.deleted_at.is_(None),
            devices.c.healthy,
            devices.c.bookable,
        )
        .order_by(devices.c.id)
        .with_for_update(read=True, skip_locked=skip_locked)
    )


INSERT_ALLOCATION = sa.insert(allocations)
_ROWS = {
    name: sa.bindparam(name, type_=pg.ARRAY(t))
    for name, t in (("ids", sa.Text), ("node_ids", sa.Text), ("starts", TS), ("ends", TS))
}
_BOOKING_ROWS = bound_rows(
    "w",
    ("device_id", _ATOM_IDS, sa.Text),
    ("allocation_id", _ROWS["ids"], sa.Text),
    ("starts_at", _ROWS["starts"], TS),
    ("ends_at", _ROWS["ends"], TS),
)
# INSERT INTO device_bookings (device_pk, device_id, pool_id, allocation_id, during)
#   SELECT d.pk, d.id, :pool_id, w.allocation_id, tstzrange(w.starts_at, w.ends_at, '[)')
#     FROM devices d JOIN unnest(:atom_ids, :ids, :starts, :ends) AS w (device_id, allocation_id, starts_at,
#          ends_at) ON w.device_id = d.id AND d.deleted_at IS NULL
#   ON CONFLICT DO NOTHING RETURNING allocation_id      -- fewer rows for an allocation: booked meanwhile
INSERT_BOOKINGS = Prepared(
    pg_insert(device_bookings)
    .from_select(
        ["device_pk", "device_id", "pool_id", "allocation_id", "during"],
        sa.select(
            devices.c.pk,
            devices.c.id,
            sa.bindparam("pool_id", type_=sa.Text),
            _BOOKING_ROWS.c.allocation_id,
            sa.func.tstzrange(_BOOKING_ROWS.c.starts_at, _BOOKING_ROWS.c.ends_at, sa.literal_column("'[)'")),
        ).select_from(
            devices.join(
                _BOOKING_ROWS,
                sa.and_(_BOOKING_ROWS.c.device_id == devices.c.id, devices.c.deleted_at.is_(None)),
            )
        ),
    )
    .on_conflict_do_nothing()
    .returning(device_bookings.c.allocation_id)
)


_SCALAR_KEYS = bound_rows("k", ("node_id", _ROWS["node_ids"], sa.Text), ("resource", "resources", sa.Text))


@cache
def lock_scalars_statement(skip_locked: bool) -> Prepared:
    """Every ``node_resources`` row a batch holds from, in one statement, in (node, resource) order::

    SELECT node_id, resource FROM node_resources
     WHERE (node_id, resource) IN (SELECT * FROM unnest(:node_ids, :resources) AS k(node_id, resource))
     ORDER BY node_id, resource FOR UPDATE [SKIP LOCKED]   -- a row missing: the resource ran out
    """
    return Prepared(
        sa.select(node_resources.c.node_id, node_resources.c.resource)
        .where(sa.tuple_(node_resources.c.node_id, node_resources.c.resource).in_(sa.select(_SCALAR_KEYS)))
        .order_by(node_resources.c.node_id, node_resources.c.resource)
        .with_for_update(skip_locked=skip_locked)
    )


_HOLDS = bound_rows(
    "w",
    ("allocation_id", _ROWS["ids"], sa.Text),
    ("resource", "resources", sa.Text),
    ("node_id", _ROWS["node_ids"], sa.Text),
    ("amount", "amounts", sa.Numeric),
    ("starts_at", _ROWS["starts"], TS),
    ("ends_at", _ROWS["ends"], TS),
    ("total", "totals", sa.Numeric),
)
# The holds of many allocations in one statement, one group per (node, resource) whose holds share one
# window, each row guarded with its group's total (the statement does not see its own rows):
# INSERT INTO scalar_holdings (allocation_id, resource, node_id, pool_id, amount, starts_at, ends_at)
# SELECT w.allocation_id, w.resource, w.node_id, :pool_id, w.amount, w.starts_at, w.ends_at
#   FROM unnest(:ids, :resources, :node_ids, :amounts, :starts, :ends, :totals)
#        AS w(allocation_id, resource, node_id, amount, starts_at, ends_at, total)
#   JOIN node_resources nr ON nr.node_id = w.node_id AND nr.resource = w.resource
#  WHERE (<peak of the node's w.resource holdings over [w.starts_at, w.ends_at)>) + w.total
#        <= floor(nr.allocatable * nr.ratio)          -- windows.room_for: the sweep only if needed
# RETURNING allocation_id, resource                   -- a group missing: it goes one hold at a time
HOLD_SCALARS = Prepared(
    hold_if(
        scalar_holdings,
        {
            "allocation_id": _HOLDS.c.allocation_id,
            "resource": _HOLDS.c.resource,
            "node_id": _HOLDS.c.node_id,
            "pool_id": sa.bindparam("pool_id", type_=sa.Text),
            "amount": _HOLDS.c.amount,
            "starts_at": _HOLDS.c.starts_at,
            "ends_at": _HOLDS.c.ends_at,
        },
        node_resources.c.node_id == _HOLDS.c.node_id,
        node_resources.c.resource == _HOLDS.c.resource,
        room_for(
            scalar_holdings,
            [
                scalar_holdings.c.node_id == _HOLDS.c.node_id,
                scalar_holdings.c.resource == _HOLDS.c.resource,
            ],
            _HOLDS.c.starts_at,
            _HOLDS.c.ends_at,
            _HOLDS.c.total,
            sa.func.floor(node_resources.c.allocatable * node_resources.c.ratio),
            (_HOLDS, node_resources),
        ),
        returning=("allocation_id", "resource"),
    )
)

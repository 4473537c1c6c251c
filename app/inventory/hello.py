"""Node agents: Hello (register or update a node from its own nvidia-smi output) and heartbeats.

Source rule: docs/agent.md, docs/placement-rules.md (nodeLabels: the gateway writes each node's system
labels at every Hello), issue 14.

Hello (:func:`hello`) creates or updates the node matching ``(poolId, name)``:

* devices keep their ids (GPU UUIDs with XML); a new one is inserted; one that left is marked
  ``bookable = false`` (never deleted: bookings keep their history, BookingRepair moves the work), one that
  came back is bookable again; links and the importer's labels follow the matrix and XML;
* the node's system labels are rewritten in the same transaction, with source ``system``: the importer's
  (``gpu.count``, ``gpu.product``, ``gpu.model``, ...) and ``bc.dev/driver.<id>=<version>``,
  ``bc.dev/driver-kind.<id>.<kind>=1``, ``bc.dev/cap.<capability>=1``;
* the liveness columns (interval, last heartbeat, error) and the conditions ``ready`` / ``heartbeat_lost``
  are set, and the NoSchedule reasons refreshed.

A Hello whose inventory is unchanged changes nothing static: the pool row is only locked FOR SHARE, the
inventory version is not bumped, so no pool cache reloads. One that changes the inventory takes the pool
row FOR UPDATE and bumps its version in the same transaction. The first attempt always runs with the
shared lock; when, under the node's lock, the inventory turns out to differ, that attempt (which wrote
nothing) ends and Hello runs again with the exclusive lock (two Hellos of one pool never upgrade a shared
lock, which would deadlock them). Two first Hellos of one node at once: the one that loses the insert
runs again as an update.

Heartbeat (:func:`heartbeat`): a heartbeat that changes nothing (same device health, node ready and not
lost) is ONE ``UPDATE nodes SET last_heartbeat_at = now() ... WHERE <nothing changes> RETURNING``; otherwise
one transaction in the lock order (pools FOR SHARE -> nodes -> devices) updates health and reasons.
Health is volatile state read per request, so a heartbeat never bumps the inventory version. The one
statement's match is the rule of what an operator sees change: a heartbeat it answers is no audited
change (:func:`app.db.audit.note_unchanged`: no audit row); one the transaction path answers writes its
row (docs/operating.md, "Audit log").

Every change calls the hooks of :mod:`app.inventory.agent_hooks` in its own transaction:
``on_atoms_unavailable`` (devices that left or turned unhealthy) and ``on_node_may_fit`` (node created,
devices added or back, health back, ``not ready`` / ``heartbeat lost`` cleared, labels changed).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.answers.inventory import Node
from app.db.audit import note_unchanged
from app.db.locks import lock_node, lock_pool
from app.db.tables import capacity_device_links, devices, node_labels, node_taints, nodes
from app.errors import Conflict, InvalidInput
from app.inventory import service as inventory
from app.inventory.agent_hooks import on_atoms_unavailable, on_node_may_fit
from app.inventory.importer import ImportedNode, build_imported_node
from app.inventory.node_rows import (
    add_rollup_totals,
    check_device_count,
    check_label_count,
    device_bodies,
    insert_devices,
)
from app.inventory.reasons import no_schedule_reasons
from app.inventory.schemas import (
    DeviceBody,
    HeartbeatBody,
    HelloBody,
    LinkBody,
    NodeCreate,
    jsonable_attributes,
)
from app.observability.metrics import HEARTBEATS, HELLOS
from app.placement.system_labels import (
    OPERATOR_SOURCE,
    SYSTEM_SOURCE,
    hello_system_labels,
    is_system_key,
    refuse_system_keys,
)

__all__ = ["DEVICE_LEFT", "HelloOutcome", "HeartbeatOutcome", "heartbeat", "hello"]

DEVICE_LEFT = "device left"  # health_reason of a device a Hello no longer lists


@dataclass(frozen=True)
class HelloOutcome:
    """``view``: the node view (:func:`app.inventory.service.get_node`); ``created``; ``inventory_changed``
    (the pool's inventory version was bumped); ``warnings`` from the importer."""

    view: Node
    created: bool
    inventory_changed: bool
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class HeartbeatOutcome:
    """``changed`` is False when the heartbeat only recorded its time."""

    node_id: str
    changed: bool
    no_schedule_reasons: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Desired:
    """The inventory a Hello asks for (``None`` parts: leave as they are, when nvidia-smi failed)."""

    devices: list[DeviceBody] | None
    links: dict[tuple[str, str], str] | None
    system_labels: dict[str, str]
    labels: dict[str, str]


def _desired(body: HelloBody, imported: ImportedNode | None) -> _Desired:
    system = dict(imported.labels) if imported is not None else {}
    system.update(hello_system_labels(((d.id, d.version, d.kinds) for d in body.drivers), body.capabilities))
    if imported is None:
        return _Desired(None, None, system, dict(body.labels))
    device_list = device_bodies(imported)
    links = {(a, b): kind for a, b, kind in imported.links}
    return _Desired(device_list, links, system, dict(body.labels))


async def hello(engine: AsyncEngine, body: HelloBody) -> HelloOutcome:
    """Register or update the node ``(body.poolId, body.name)`` from its agent's Hello (module docstring).

    Raises InvalidInput (422: ``topo`` / ``nvidiaSmiXml`` that do not parse or list more devices or links
    than a node holds, ``labels.<key>`` for a ``bc.dev/`` key, ``labels`` when the node would hold more
    than 256 labels, system and operator together, on create as on update: docs/api.md, "Limits"),
    NotFound (pool), PoolArchived (409), Conflict (409: a device id registered on another node). On any
    error nothing is written.
    """
    refuse_system_keys(body.labels)
    imported = build_imported_node(body.name, body.topo, body.nvidiaSmiXml) if body.topo is not None else None
    if imported is not None:
        check_device_count(len(imported.devices), len(imported.links))
    desired = _desired(body, imported)
    warnings = imported.warnings if imported is not None else ()
    try:
        async with engine.begin() as conn:
            outcome = await _hello(conn, body, desired, exclusive=False)
    except Conflict as exc:
        if exc.details.get("name") != body.name:
            raise
        outcome = None  # another Hello created this node a moment ago: update it
    if outcome is None:  # the inventory differs (nothing was written): again, holding the pool FOR UPDATE
        async with engine.begin() as conn:
            outcome = await _hello(conn, body, desired, exclusive=True)
    assert outcome is not None
    HELLOS.labels(
        "created" if outcome.created else "changed" if outcome.inventory_changed else "unchanged"
    ).inc()
    return HelloOutcome(outcome.view, outcome.created, outcome.inventory_changed, warnings)


async def _hello(
    conn: AsyncConnection, body: HelloBody, desired: _Desired, *, exclusive: bool
) -> HelloOutcome | None:
    """One attempt; ``None`` when the inventory differs and the pool row is held only FOR SHARE (the
    caller commits this read-only attempt and runs again with ``exclusive``)."""
    node_id = (
        await conn.execute(
            sa.select(nodes.c.id).where(
                nodes.c.pool_id == body.poolId, nodes.c.name == body.name, nodes.c.deleted_at.is_(None)
            )
        )
    ).scalar()
    if node_id is None:
        return await _create(conn, body, desired)
    inventory.refuse_archived(await lock_pool(conn, body.poolId, for_update=exclusive))
    # SELECT * FROM nodes WHERE id = :node FOR UPDATE; SELECT * FROM devices WHERE node_id = :node
    #   ORDER BY id FOR UPDATE                                   -- pools -> nodes -> devices
    node = await lock_node(conn, node_id)
    current = {
        r.id: r
        for r in (
            await conn.execute(
                sa.select(devices)
                .where(devices.c.node_id == node_id)
                .order_by(devices.c.id)
                .with_for_update()
            )
        ).all()
    }
    changes = await _inventory_changes(conn, node_id, current, desired)
    # the node's labels after this Hello (operator labels kept, the Hello's free and system labels) stay
    # within the one limit of every path (docs/api.md, "Limits"): refused before anything is written
    check_label_count(
        len(changes.final_labels), sum(src == SYSTEM_SOURCE for _, src in changes.final_labels.values())
    )
    if changes.any and not exclusive:
        return None
    if changes.any:
        await _apply(conn, body.poolId, node_id, desired, changes)
        await inventory.bump_inventory_version(conn, body.poolId)  # the pool row is ours FOR UPDATE already
    revived = await _set_liveness(conn, node, body.intervalSeconds, body.error)
    if changes.left:
        await on_atoms_unavailable(conn, node_id, changes.left)
    if changes.added or changes.returned or changes.labels or revived:
        await on_node_may_fit(conn, body.poolId, node_id)
    return HelloOutcome(await inventory.get_node(conn, node_id), False, changes.any)


async def _create(conn: AsyncConnection, body: HelloBody, desired: _Desired) -> HelloOutcome:
    inventory.refuse_archived(await inventory.get_pool_row(conn, body.poolId))
    view = await inventory.add_node(
        conn,
        body.poolId,
        NodeCreate(
            name=body.name,
            labels={k: v for k, v in desired.labels.items() if k not in desired.system_labels},
            resources=body.resources,
            devices=desired.devices or [],
            links=[LinkBody(a=a, b=b, link=kind) for (a, b), kind in sorted((desired.links or {}).items())],
        ),
        system_labels=desired.system_labels,
    )
    node = await lock_node(conn, view.id)
    await _set_liveness(conn, node, body.intervalSeconds, body.error)
    await on_node_may_fit(conn, body.poolId, node.id)
    return HelloOutcome(await inventory.get_node(conn, node.id), True, True)


@dataclass
class _Changes:
    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    returned: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)
    links: bool = False
    labels: bool = False
    final_labels: dict[str, tuple[str, str]] = field(default_factory=dict)  # key -> (value, source)

    @property
    def any(self) -> bool:
        return bool(self.added or self.updated or self.returned or self.left or self.links or self.labels)


def _static(d: DeviceBody, ordinal: int) -> tuple[Any, ...]:
    return (d.device_class, jsonable_attributes(d.attributes), d.numaNode, d.parent, ordinal)


async def _inventory_changes(
    conn: AsyncConnection, node_id: str, current: dict[str, Any], desired: _Desired
) -> _Changes:
    changes = _Changes()
    if desired.devices is not None:
        wanted = {d.id for d in desired.devices}
        for i, d in enumerate(desired.devices):
            row = current.get(d.id)
            if row is None:
                changes.added.append(d.id)
                continue
            if (row._mapping["class"], row.attributes, row.numa_node, row.parent_id, row.ordinal) != _static(
                d, i
            ):
                changes.updated.append(d.id)
            if d.bookable and not row.bookable and row.health_reason == DEVICE_LEFT:
                changes.returned.append(d.id)
            elif (
                d.bookable != row.bookable
                and row.health_reason != DEVICE_LEFT
                and d.id not in changes.updated
            ):
                changes.updated.append(d.id)  # a GPU whose MIG devices came or went
        changes.left = sorted(
            i for i, row in current.items() if i not in wanted and row.health_reason != DEVICE_LEFT
        )
    if desired.links is not None:
        have = {
            (r.a, r.b): r.link
            for r in (
                await conn.execute(
                    sa.select(capacity_device_links).where(capacity_device_links.c.node_id == node_id)
                )
            ).all()
        }
        changes.links = have != desired.links
    have = {
        r.key: (r.value, r.source)
        for r in (await conn.execute(sa.select(node_labels).where(node_labels.c.node_id == node_id))).all()
    }
    system_wanted = dict(desired.system_labels)
    if desired.devices is None:  # nvidia-smi failed: keep the importer's labels, rewrite the bc.dev/ ones
        system_wanted.update(
            {k: v for k, (v, src) in have.items() if src == SYSTEM_SOURCE and not is_system_key(k)}
        )
    # operator labels stay unless a system label now takes their key; the Hello's free labels are upserted
    final = {k: (v, src) for k, (v, src) in have.items() if src == OPERATOR_SOURCE and k not in system_wanted}
    final.update({k: (v, OPERATOR_SOURCE) for k, v in desired.labels.items() if k not in system_wanted})
    final.update({k: (v, SYSTEM_SOURCE) for k, v in system_wanted.items()})
    changes.final_labels = final
    changes.labels = final != have
    return changes


async def _apply(
    conn: AsyncConnection,
    pool_id: str,
    node_id: str,
    desired: _Desired,
    changes: _Changes,
) -> None:
    """Write the Hello's inventory (locks already held: pools FOR UPDATE -> nodes -> devices)."""
    if desired.devices is not None:
        order = {d.id: (i, d) for i, d in enumerate(desired.devices)}
        await insert_devices(conn, node_id, [order[a] for a in changes.added])
        for atom in sorted(set(changes.updated) | set(changes.returned)):
            i, d = order[atom]
            values: dict[str, Any] = {
                "class": d.device_class,
                "attributes": jsonable_attributes(d.attributes),
                "numa_node": d.numaNode,
                "parent_id": d.parent,
                "ordinal": i,
                "bookable": d.bookable,
            }
            if atom in changes.returned:
                values["health_reason"] = None
            await conn.execute(
                sa.update(devices).where(devices.c.node_id == node_id, devices.c.id == atom).values(**values)
            )
        if changes.left:
            # UPDATE devices SET bookable = false, health_reason = 'device left'
            #  WHERE node_id = :node AND id = ANY(:left)
            await conn.execute(
                sa.update(devices)
                .where(devices.c.node_id == node_id, devices.c.id.in_(changes.left))
                .values(bookable=False, health_reason=DEVICE_LEFT)
            )
    if changes.links and desired.links is not None:
        await conn.execute(sa.delete(capacity_device_links).where(capacity_device_links.c.node_id == node_id))
        if desired.links:
            await conn.execute(
                sa.insert(capacity_device_links),
                [
                    {"node_id": node_id, "a": a, "b": b, "link": k}
                    for (a, b), k in sorted(desired.links.items())
                ],
            )
    if changes.labels:
        await _rewrite_labels(conn, node_id, changes.final_labels)
    if changes.added:
        totals: dict[str, Decimal] = {}
        for atom in changes.added:
            cls = order[atom][1].device_class
            totals[cls] = totals.get(cls, Decimal(0)) + 1
        await add_rollup_totals(conn, pool_id, totals)


async def _rewrite_labels(conn: AsyncConnection, node_id: str, final: dict[str, tuple[str, str]]) -> None:
    """Replace the node's labels by ``final`` (key -> (value, source); computed by _inventory_changes)."""
    await conn.execute(sa.delete(node_labels).where(node_labels.c.node_id == node_id))
    if final:
        await conn.execute(
            sa.insert(node_labels),
            [
                {"node_id": node_id, "key": k, "value": v, "source": src}
                for k, (v, src) in sorted(final.items())
            ],
        )


async def _node_taints(conn: AsyncConnection, node_id: str) -> list[tuple[str, str, str]]:
    rows = await conn.execute(
        sa.select(node_taints.c.key, node_taints.c.value, node_taints.c.effect).where(
            node_taints.c.node_id == node_id
        )
    )
    return [tuple(r) for r in rows.all()]


async def _set_liveness(conn: AsyncConnection, node: Any, interval: int | None, error: str | None) -> bool:
    """Record a Hello or a changed heartbeat on the locked ``node`` row: ready unless ``error``, heartbeat
    not lost, last heartbeat now, and the NoSchedule reasons refreshed. True when the node came back
    (``not ready`` or ``heartbeat lost`` cleared)."""
    ready = error is None
    reasons = no_schedule_reasons(
        node.cordoned, ready, False, await _node_taints(conn, node.id), draining=node.draining
    )
    values: dict[str, Any] = {
        "ready": ready,
        "heartbeat_lost": False,
        "agent_error": error,
        "last_heartbeat_at": sa.func.now(),
        "no_schedule_reasons": reasons,
    }
    if interval is not None:
        values["agent_interval_seconds"] = interval
    await conn.execute(sa.update(nodes).where(nodes.c.id == node.id).values(**values))
    return (ready and not node.ready) or node.heartbeat_lost


# ------------------------------------------------------------------------------------------ heartbeat


# A heartbeat that changes nothing: one statement, sent outside any transaction (autocommit, one round
# trip) on the pool's asyncpg connection itself (this path runs 1,000 times a second for 10,000 agents, so
# it skips SQLAlchemy's statement layer). It matches only when every reported device exists on the node
# with the same health, the node's agent said Hello, the node is not lost and its readiness is unchanged,
# and the caller may act on the node's pool ($4 NULL = every pool); otherwise nothing is written and the
# transaction path runs.
QUIET_HEARTBEAT = """
UPDATE nodes SET last_heartbeat_at = now(), agent_error = $3::text
 WHERE id = $1 AND agent_interval_seconds IS NOT NULL AND NOT heartbeat_lost AND ready = $2
   AND ($4::text[] IS NULL OR pool_id = ANY($4::text[]))
   AND NOT EXISTS (SELECT 1 FROM unnest($5::text[], $6::boolean[]) AS r(id, healthy)
                   LEFT JOIN devices d ON d.id = r.id AND d.node_id = $1
                    WHERE d.id IS NULL OR d.healthy <> r.healthy)
RETURNING no_schedule_reasons"""


async def heartbeat(
    engine: AsyncEngine,
    node_id: str,
    body: HeartbeatBody,
    authorize_pool: Callable[[str], None],
    pools: Collection[str] | None = None,
) -> HeartbeatOutcome:
    """Record a heartbeat of ``node_id``'s agent (module docstring).

    ``pools`` are the pools the caller may act on (``None``: all; from
    :func:`app.iam.authorize.granted_pools`): the one-statement path matches only a node in one of them.
    On the transaction path ``authorize_pool(pool_id)`` is called with the node's pool before anything is
    written (it raises Forbidden to refuse). Raises NotFound (no such node), InvalidInput (422,
    ``devices.<i>.id`` for a device not on the node), Conflict (409, the node has not sent Hello).
    """
    async with engine.connect() as conn:
        raw = await conn.get_raw_connection()  # no statement sent yet: no transaction is open
        row = await raw.driver_connection.fetchrow(  # type: ignore[union-attr]
            QUIET_HEARTBEAT,
            node_id,
            body.error is None,
            body.error,
            None if pools is None else sorted(pools),
            [d.id for d in body.devices],
            [d.healthy for d in body.devices],
        )
    if row is not None:
        HEARTBEATS.labels("unchanged").inc()
        note_unchanged()  # nothing an operator sees changed: no audit row (docs/operating.md, "Audit log")
        return HeartbeatOutcome(node_id, False, list(row["no_schedule_reasons"]))
    async with engine.begin() as conn:
        outcome = await _changed_heartbeat(conn, node_id, body, authorize_pool)
    HEARTBEATS.labels("changed").inc()
    return outcome


async def _changed_heartbeat(
    conn: AsyncConnection, node_id: str, body: HeartbeatBody, authorize_pool: Callable[[str], None]
) -> HeartbeatOutcome:
    pool_id = await inventory.node_pool_id(conn, node_id)
    authorize_pool(pool_id)
    await lock_pool(conn, pool_id, for_update=False)
    node = await lock_node(conn, node_id)
    if node.agent_interval_seconds is None:
        raise Conflict(f"node {node_id} has no agent: send Hello first", {"nodeId": node_id})
    current = {
        r.id: r
        for r in (
            await conn.execute(
                sa.select(devices.c.id, devices.c.healthy, devices.c.health_reason)
                .where(devices.c.node_id == node_id)
                .order_by(devices.c.id)
                .with_for_update()
            )
        ).all()
    }
    for i, d in enumerate(body.devices):
        if d.id not in current:
            raise InvalidInput(f"device {d.id} is not on node {node_id}", path=f"devices.{i}.id")
    down = sorted(d.id for d in body.devices if not d.healthy and current[d.id].healthy)
    up = sorted(d.id for d in body.devices if d.healthy and not current[d.id].healthy)
    for d in sorted(body.devices, key=lambda x: x.id):
        if d.id in down or d.id in up:
            # a device that left keeps its 'device left' mark until a Hello lists it again
            reason = DEVICE_LEFT if current[d.id].health_reason == DEVICE_LEFT else d.reason or "unhealthy"
            # UPDATE devices SET healthy = :healthy, health_reason = :reason
            #  WHERE node_id = :node AND id = :id
            await conn.execute(
                sa.update(devices)
                .where(devices.c.node_id == node_id, devices.c.id == d.id)
                .values(healthy=d.healthy, health_reason=None if d.healthy else reason)
            )
    revived = await _set_liveness(conn, node, None, body.error)
    # a device that left at Hello was reported to the hook then (it is unbookable already)
    down = [atom for atom in down if current[atom].health_reason != DEVICE_LEFT]
    if down:
        await on_atoms_unavailable(conn, node_id, down)
    if up or revived:
        await on_node_may_fit(conn, pool_id, node_id)
    reasons = (
        await conn.execute(sa.select(nodes.c.no_schedule_reasons).where(nodes.c.id == node_id))
    ).scalar_one()
    return HeartbeatOutcome(node_id, True, list(reasons))

"""The schedulability rule in Python (docs/placement-rules.md, "Eligibility filters").

It exists twice: here, and as the SQL predicates the commit locks with
(:mod:`app.capacity.predicates`); ``tests/placement/test_schedulable_sql.py`` keeps the two in agreement
against real PostgreSQL.

``nodes.no_schedule_reasons`` holds the NoSchedule reasons (``cordoned``, ``draining``, ``not ready``,
``heartbeat lost``, ``tainted <key>=<value>``). The one reason a request tolerates is a dedication to its
own tenant, ``tainted dedicated=<tenant>``. Whole-node leases ignore every other reason but honour
dedications and ``draining`` (a node drained for maintenance takes no new work of any kind,
docs/operating.md "Maintenance: drain and delete") and need ``leasable``. Nothing new is placed in an
archived pool.
"""

from __future__ import annotations

from app.placement.model import NodeSnapshot, PoolSnapshot

DEDICATED = "dedicated"  # the taint key of a dedication


def taint_reason(key: str, value: str) -> str:
    """The NoSchedule reason of a taint: ``tainted <key>=<value>``; ``tainted dedicated=acme`` is
    tolerated by tenant acme only (docs/reasons.md, 1)."""
    return f"tainted {key}={value}"


DEDICATION_PREFIX = taint_reason(DEDICATED, "")
POOL_ARCHIVED = "pool is archived"
DRAINING = "draining"  # the NoSchedule reason of a drained node (app/inventory/reasons.py orders it)
NOT_LEASABLE = "not leasable"


def dedication(tenant_id: str | None) -> str | None:
    """The NoSchedule reason a dedication to ``tenant_id`` writes: ``tainted dedicated=<tenant>``."""
    return None if tenant_id is None else DEDICATION_PREFIX + tenant_id


def ineligibility(node: NodeSnapshot, pool: PoolSnapshot, tenant_id: str | None) -> str | None:
    """Why ``node`` is not schedulable for ``tenant_id``, or ``None`` when it is.

    ``"pool is archived"`` for an archived pool; else the node's NoSchedule reasons without the
    tenant's own dedication, joined by ``", "`` in stored order (``"cordoned, tainted dedicated=beta"``).
    SQL twin: ``schedulable_sql_tolerating(tenant_id)``.
    """
    if pool.archived:
        return POOL_ARCHIVED
    reasons = node.state.no_schedule_reasons
    if not reasons:
        return None
    own = dedication(tenant_id)
    remaining = [r for r in reasons if r != own]
    return ", ".join(remaining) if remaining else None


def lease_ineligibility(node: NodeSnapshot, pool: PoolSnapshot, tenant_id: str | None) -> str | None:
    """Why ``node`` cannot be leased whole by ``tenant_id``, or ``None``: an archived pool, a node that
    is not ``leasable``, a draining node, or a dedication to another tenant (other NoSchedule reasons
    are ignored). SQL twin: ``leasable_sql_for(tenant_id)``."""
    if pool.archived:
        return POOL_ARCHIVED
    if not node.state.leasable:
        return NOT_LEASABLE
    if DRAINING in node.state.no_schedule_reasons:
        return DRAINING
    own = dedication(tenant_id)
    foreign = [r for r in node.state.no_schedule_reasons if r.startswith(DEDICATION_PREFIX) and r != own]
    return ", ".join(foreign) if foreign else None


def may_be_schedulable(node: NodeSnapshot, pool: PoolSnapshot) -> bool:
    """Whether ``node`` is schedulable for some tenant: no reason, or dedications to one tenant alone.
    Drives the wake edge of pending reservations. SQL twin: ``may_be_schedulable_sql()``."""
    if pool.archived:
        return False
    distinct = set(node.state.no_schedule_reasons)
    if not distinct:
        return True
    return len(distinct) == 1 and next(iter(distinct)).startswith(DEDICATION_PREFIX)

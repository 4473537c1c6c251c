"""The schedulability rule as SQL (docs/placement-rules.md, "Eligibility filters"): the twins of
:mod:`app.placement.schedulable`. Who reads them, by module:

- :func:`schedulable_sql_tolerating` (its body :func:`schedulable_sql_within`, over a bound array of
  tolerated reasons): the guarded commit (:mod:`app.capacity.commit.single`, step 1, ``FOR SHARE`` of the
  node) and the shortlist's eligibility column (:mod:`app.capacity.planning.exceptions`);
- :func:`leasable_sql_for` (its body :func:`leasable_sql_within`, over a bound own dedication): the
  guarded commit of a whole-node lease (:mod:`app.capacity.commit.single`);
- :func:`may_be_schedulable_sql`: a node's wake edge (:func:`app.capacity.edges.notify_node`)
and the
  ``unschedulable`` atom state of the census gauges (:mod:`app.capacity.controllers.census`).

``tests/placement/test_schedulable_sql.py`` checks, over generated nodes against real PostgreSQL, that
each predicate selects exactly the nodes its Python twin accepts.

Each function returns a SQLAlchemy Core boolean over ``nodes`` and ``pools``; the statement must have
both in its FROM (``nodes JOIN pools ON pools.id = nodes.pool_id``). ``no_schedule_reasons`` is
``text[] NOT NULL``; the dedication a tenant tolerates is the reason ``tainted dedicated=<tenant>``.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.sql.elements import ColumnElement

from app.db.tables import nodes, pools
from app.placement.schedulable import DEDICATION_PREFIX, DRAINING

_PREFIX_LENGTH = len(DEDICATION_PREFIX)


def _reasons_of(node_table: sa.Table) -> ColumnElement[list[str]]:
    return sa.func.coalesce(node_table.c.no_schedule_reasons, sa.text("'{}'::text[]"))


def _is_dedication(reason: ColumnElement[str]) -> ColumnElement[bool]:
    return sa.func.left(reason, _PREFIX_LENGTH) == DEDICATION_PREFIX


# pools.archived_at IS NULL
#   AND coalesce(nodes.no_schedule_reasons, '{}'::text[]) <@ ARRAY['tainted dedicated=' || :tenant]::text[]
# (tenant None: ... <@ '{}'::text[], i.e. no reason at all)
def schedulable_sql_tolerating(
    tenant_id: str | None, node_table: sa.Table = nodes, pool_table: sa.Table = pools
) -> ColumnElement[bool]:
    """Schedulable for ``tenant_id``: the pool is not archived and every NoSchedule reason of the node
    is the tenant's own dedication (there may be none). Twin of ``ineligibility(...) is None``."""
    allowed = sa.cast(pg.array(tolerated_reasons(tenant_id), type_=sa.Text), pg.ARRAY(sa.Text))
    return schedulable_sql_within(allowed, node_table, pool_table)


def tolerated_reasons(tenant_id: str | None) -> list[str]:
    """The NoSchedule reasons ``tenant_id`` tolerates: its own dedication (none for no tenant)."""
    return [DEDICATION_PREFIX + tenant_id] if tenant_id is not None else []


# pools.archived_at IS NULL AND coalesce(nodes.no_schedule_reasons, '{}'::text[]) <@ <allowed>
def schedulable_sql_within(
    allowed: ColumnElement[list[str]], node_table: sa.Table = nodes, pool_table: sa.Table = pools
) -> ColumnElement[bool]:
    """The body of :func:`schedulable_sql_tolerating` for a ``text[]`` expression ``allowed`` of
    tolerated reasons: a bind parameter (bound to :func:`tolerated_reasons`) lets a statement built once
    serve every tenant."""
    return sa.and_(pool_table.c.archived_at.is_(None), _reasons_of(node_table).contained_by(allowed))


# pools.archived_at IS NULL AND nodes.leasable AND NOT ('draining' = ANY(nodes.no_schedule_reasons))
#   AND NOT EXISTS (SELECT 1 FROM unnest(nodes.no_schedule_reasons) AS r(reason)
#                    WHERE left(r.reason, 18) = 'tainted dedicated='
#                      AND r.reason IS DISTINCT FROM 'tainted dedicated=' || :tenant)
def leasable_sql_for(
    tenant_id: str | None, node_table: sa.Table = nodes, pool_table: sa.Table = pools
) -> ColumnElement[bool]:
    """Leasable whole by ``tenant_id``: the pool is not archived, the node is ``leasable`` and not
    ``draining``, and no dedication to another tenant (other NoSchedule reasons are ignored by
    whole-node leases). Twin of
    ``lease_ineligibility(...) is None``."""
    return leasable_sql_within(sa.literal(own_dedication(tenant_id), sa.Text), node_table, pool_table)


def own_dedication(tenant_id: str | None) -> str | None:
    """The dedication reason of ``tenant_id`` (``tainted dedicated=<tenant>``), None for no tenant."""
    return DEDICATION_PREFIX + tenant_id if tenant_id is not None else None


# ... AND NOT ('draining' = ANY(...))
#     AND NOT EXISTS (... WHERE left(r.reason, 18) = 'tainted dedicated=' AND r.reason IS DISTINCT FROM <own>)
def leasable_sql_within(
    own: ColumnElement[str | None], node_table: sa.Table = nodes, pool_table: sa.Table = pools
) -> ColumnElement[bool]:
    """The body of :func:`leasable_sql_for` for a ``text`` expression ``own``, the tenant's own
    dedication (:func:`own_dedication`; NULL for no tenant: every dedication is then foreign, as
    ``IS DISTINCT FROM NULL`` holds for every reason). A bind parameter lets a statement built once
    serve every tenant."""
    reasons = sa.func.unnest(_reasons_of(node_table)).table_valued("reason").render_derived("r")
    foreign = (
        sa.select(sa.literal(1))
        .select_from(reasons)
        .where(_is_dedication(reasons.c.reason), reasons.c.reason.is_distinct_from(own))
    )
    draining = sa.literal(DRAINING, sa.Text) == sa.any_(_reasons_of(node_table))
    return sa.and_(
        pool_table.c.archived_at.is_(None),
        node_table.c.leasable.is_(True),
        sa.not_(draining),
        ~foreign.exists(),
    )


# pools.archived_at IS NULL
#   AND NOT EXISTS (SELECT 1 FROM unnest(nodes.no_schedule_reasons) AS r(reason)
#                    WHERE left(r.reason, 18) <> 'tainted dedicated='
#                       OR r.reason <> nodes.no_schedule_reasons[1])
def may_be_schedulable_sql(node_table: sa.Table = nodes, pool_table: sa.Table = pools) -> ColumnElement[bool]:
    """Schedulable for some tenant: the pool is not archived and the node has no reason, or only
    dedications to one tenant. Gates a node's wake edge (``edges.notify_node``) and the census's
    ``unschedulable`` state. Twin of ``may_be_schedulable``."""
    all_reasons = _reasons_of(node_table)
    reasons = sa.func.unnest(all_reasons).table_valued("reason").render_derived("r")
    first = node_table.c.no_schedule_reasons[1]
    other = (
        sa.select(sa.literal(1))
        .select_from(reasons)
        .where(sa.or_(~_is_dedication(reasons.c.reason), reasons.c.reason != first))
    )
    return sa.and_(pool_table.c.archived_at.is_(None), ~other.exists())

"""``get reservations|pools|nodes [ID]`` and ``describe reservation|node ID`` (docs/cli.md): the read
commands of a running service. Registered by ``app/cli.py``; the shared options and the exits are
:mod:`app.client.common`'s. A pool or node may be named by its id or its name (``ServiceClient.pool_id``,
``node_id``).
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from app.answers.statuses import ReservationStatus
from app.client.api import ServiceClient
from app.client.common import LimitOpt, Shown, client_command, listed
from app.client.flags import LIST_RESERVATION_FLAGS, UsageError
from app.client.reservation_commands import ReservationArg, names_of

StatusOpt = Annotated[ReservationStatus | None, typer.Option("--status", help="Only this status.")]


@client_command(LIST_RESERVATION_FLAGS)
def get_reservations(
    api: ServiceClient,
    reservation_id: Annotated[
        str | None, typer.Argument(metavar="[ID]", help="One reservation (res_...).")
    ] = None,
    tenant: Annotated[str | None, typer.Option("--tenant", help="Only this tenant's.")] = None,
    status: StatusOpt = None,
    limit: LimitOpt = None,
) -> Shown:
    """List reservations, newest first (or show one)."""
    from app.client import render as out

    rows = [api.reservation(reservation_id)] if reservation_id else api.reservations(tenant, status, limit)
    return listed(
        rows,
        lambda rows, wide: out.reservations_view(rows, names_of(api, rows, current=True), wide),
        one=bool(reservation_id),
    )


@client_command()
def get_pools(
    api: ServiceClient,
    pool_id: Annotated[str | None, typer.Argument(metavar="[ID]", help="One pool (id or name).")] = None,
    limit: LimitOpt = None,
) -> Shown:
    """List the pools this key may see (or show one)."""
    from app.client import render as out

    rows = [api.named_pool(pool_id)] if pool_id else api.pools(limit)
    return listed(rows, out.pools_view, one=bool(pool_id))


@client_command()
def get_nodes(
    api: ServiceClient,
    node_id: Annotated[str | None, typer.Argument(metavar="[ID]", help="One node (id or name).")] = None,
    pool: Annotated[
        str | None, typer.Option("--pool", help="Only this pool's nodes (default: every pool's).")
    ] = None,
    limit: LimitOpt = None,
) -> Shown:
    """List nodes in id order, a pool's or every visible pool's (or show one)."""
    from app.client import render as out

    if node_id and pool:
        raise UsageError("--pool lists a pool's nodes; a node id names the node alone")
    if node_id:
        rows, pool_names = [api.named_node(node_id)], {}
    else:
        pools = [api.named_pool(pool)] if pool else api.pools()
        rows, pool_names = pools_nodes(api, pools, limit), {p["id"]: p["name"] for p in pools}
    return listed(rows, lambda rows, wide: out.nodes_view(rows, wide, pool_names), one=bool(node_id))


def pools_nodes(api: ServiceClient, pools: list[dict[str, Any]], limit: int | None) -> list[dict[str, Any]]:
    """The nodes of ``pools``, pool by pool in id order, each with its ``poolId`` (at most ``limit``)."""
    rows: list[dict[str, Any]] = []
    for p in pools:
        wanted = None if limit is None else limit - len(rows)
        if wanted == 0:
            break
        rows += [{**n, "poolId": n.get("poolId", p["id"])} for n in api.nodes(p["id"], wanted)]
    return rows


@client_command()
def describe_reservation(api: ServiceClient, reservation_id: ReservationArg) -> Shown:
    """A reservation's request, allocations (by node name) and conditions."""
    from app.client import render as out

    answer = api.reservation(reservation_id)
    return Shown(answer, lambda wide: out.describe_reservation_view(answer, names_of(api, [answer]), wide))


@client_command()
def describe_node(
    api: ServiceClient,
    node_id: Annotated[str, typer.Argument(metavar="ID", help="Node id (node_...) or name.")],
) -> Shown:
    """A node's status, labels, taints, resources, devices and links."""
    from app.client import render as out

    node = api.named_node(node_id)
    return Shown(node, lambda wide: out.describe_node_view(node, api.pool_name(node["poolId"]), wide))

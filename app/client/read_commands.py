"""``get reservations|pools|nodes [ID]`` and ``describe reservation|node ID`` (docs/cli.md): the read
commands of a running service. Registered by ``app/cli.py``; the shared options and the exits are
:mod:`app.client.common`'s. A pool or node may be named by its id or its name (``ServiceClient.pool_id``,
``node_id``).
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from app.answers.statuses import ReservationStatus
from app.client import EXIT_USAGE
from app.client.api import DEFAULT_SERVER
from app.client.common import KeyOpt, LimitOpt, Output, OutputOpt, ServerOpt, emit, fail, service
from app.client.flags import LIST_RESERVATION_FLAGS
from app.client.reservation_commands import names_of

StatusOpt = Annotated[ReservationStatus | None, typer.Option("--status", help="Only this status.")]


def get_reservations(
    reservation_id: Annotated[
        str | None, typer.Argument(metavar="[ID]", help="One reservation (res_...).")
    ] = None,
    tenant: Annotated[str | None, typer.Option("--tenant", help="Only this tenant's.")] = None,
    status: StatusOpt = None,
    limit: LimitOpt = None,
    output: OutputOpt = Output.table,
    server: ServerOpt = DEFAULT_SERVER,
    key: KeyOpt = None,
) -> None:
    """List reservations, newest first (or show one)."""
    from app.client import render as out

    with service(server, key, LIST_RESERVATION_FLAGS) as api:
        if reservation_id:
            data: Any = api.reservation(reservation_id)
            rows = [data]
        else:
            rows = api.reservations(tenant, status, limit)
            data = {"items": rows}
        names = names_of(api, rows, output)
        emit(data, output, lambda wide: out.reservations_view(rows, names, wide))


def get_pools(
    pool_id: Annotated[str | None, typer.Argument(metavar="[ID]", help="One pool (id or name).")] = None,
    limit: LimitOpt = None,
    output: OutputOpt = Output.table,
    server: ServerOpt = DEFAULT_SERVER,
    key: KeyOpt = None,
) -> None:
    """List the pools this key may see (or show one)."""
    from app.client import render as out

    with service(server, key) as api:
        rows = [api.pool(api.pool_id(pool_id))] if pool_id else api.pools(limit)
        data = rows[0] if pool_id else {"items": rows}
        emit(data, output, lambda wide: out.pools_view(rows, wide))


def get_nodes(
    node_id: Annotated[str | None, typer.Argument(metavar="[ID]", help="One node (id or name).")] = None,
    pool: Annotated[
        str | None, typer.Option("--pool", help="Only this pool's nodes (default: every pool's).")
    ] = None,
    limit: LimitOpt = None,
    output: OutputOpt = Output.table,
    server: ServerOpt = DEFAULT_SERVER,
    key: KeyOpt = None,
) -> None:
    """List nodes in id order, a pool's or every visible pool's (or show one)."""
    from app.client import render as out

    if node_id and pool:
        raise fail("--pool lists a pool's nodes; a node id names the node alone", EXIT_USAGE)
    with service(server, key) as api:
        pool_names: dict[str, str] = {}
        if node_id:
            rows = [api.node(api.node_id(node_id))]
            data: Any = rows[0]
        else:
            pools = [api.pool(api.pool_id(pool))] if pool else api.pools()
            pool_names = {p["id"]: p["name"] for p in pools}
            rows = []
            for p in pools:
                wanted = None if limit is None else limit - len(rows)
                if wanted == 0:
                    break
                rows += [{**n, "poolId": n.get("poolId", p["id"])} for n in api.nodes(p["id"], wanted)]
            data = {"items": rows}
        emit(data, output, lambda wide: out.nodes_view(rows, wide, pool_names))


def describe_reservation(
    reservation_id: Annotated[str, typer.Argument(metavar="ID", help="Reservation id (res_...).")],
    output: OutputOpt = Output.table,
    server: ServerOpt = DEFAULT_SERVER,
    key: KeyOpt = None,
) -> None:
    """A reservation's request, allocations (by node name) and conditions."""
    from app.client import render as out

    with service(server, key) as api:
        answer = api.reservation(reservation_id)
        names = names_of(api, [answer], output)
        emit(answer, output, lambda wide: out.describe_reservation_view(answer, names, wide))


def describe_node(
    node_id: Annotated[str, typer.Argument(metavar="ID", help="Node id (node_...) or name.")],
    output: OutputOpt = Output.table,
    server: ServerOpt = DEFAULT_SERVER,
    key: KeyOpt = None,
) -> None:
    """A node's status, labels, taints, resources, devices and links."""
    from app.client import render as out

    with service(server, key) as api:
        node = api.node(api.node_id(node_id))
        pool_name = None if output in (Output.json, Output.yaml) else api.pool_name(node["poolId"])
        emit(node, output, lambda wide: out.describe_node_view(node, pool_name, wide))

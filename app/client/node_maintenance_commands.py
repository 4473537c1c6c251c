"""``better-compute node ...``: node maintenance verbs of a running service (docs/cli.md;
docs/operating.md, "Maintenance: drain and delete"): ``drain NODE [--reschedule]``, ``undrain NODE``,
``delete NODE``. Each takes ``--server``, ``--key`` and ``-o table|wide|json|yaml`` and exits 0 when done,
1 on an API error (``CONFLICT: ...`` for a delete of a node that still holds work; ``NOT_FOUND``) or an
unreachable service.

:func:`add_maintenance_commands` adds them to the ``node`` group (:mod:`app.client.node_commands`) around
the CLI's ``service`` (the client and its exits) and ``console()``, so ``app/cli.py`` adds them in one
line."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Annotated, Any

import typer
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from app.client import render as out
from app.client.api import DEFAULT_SERVER, ServiceClient
from app.client.render import Output

ServerOpt = Annotated[
    str, typer.Option("--server", envvar="BC_SERVER", help="Service URL.", show_default=True)
]
KeyOpt = Annotated[
    str | None, typer.Option("--key", envvar="BC_API_KEY", help="API key.", show_default=False)
]
OutputOpt = Annotated[Output, typer.Option("-o", "--output", help="Output format.")]
NodeArg = Annotated[str, typer.Argument(metavar="NODE", help="Node id (node_...).")]
Service = Callable[[str, str | None], AbstractContextManager[ServiceClient]]


def drain_view(node: Mapping[str, Any], wide: bool) -> RenderableType:
    """The node's name, id, status and drain; then the reservations a reschedule moved, if any."""
    table = Table(box=None, show_header=True, pad_edge=False)
    for column in ("name", "id", "status", "drain", *(["pool"] if wide else [])):
        table.add_column(column.upper())
    row = [node["name"], node["id"], out.node_status(node), node.get("drain") or out.EMPTY_CELL]
    table.add_row(*row, *([node.get("poolId", out.EMPTY_CELL)] if wide else []))
    moved = node.get("rescheduled") or []
    if not moved:
        return table
    rows = Table(box=None, show_header=True, pad_edge=False, title="rescheduled", title_justify="left")
    for column in ("reservation", "result", "to node"):
        rows.add_column(column.upper())
    for m in moved:
        rows.add_row(m["reservationId"], m["result"], m.get("toNodeId") or out.EMPTY_CELL)
    return Group(table, Text(""), rows)


def add_maintenance_commands(group: typer.Typer, service: Service, console: Callable[[], Console]) -> None:
    """Add ``drain``, ``undrain`` and ``delete`` to the ``node`` command ``group``."""

    @group.command("drain")
    def drain(
        node_id: NodeArg,
        reschedule: Annotated[
            bool,
            typer.Option(
                "--reschedule", help="Move its future reservations (not started yet) to other nodes."
            ),
        ] = False,
        output: OutputOpt = Output.table,
        server: ServerOpt = DEFAULT_SERVER,
        key: KeyOpt = None,
    ) -> None:
        """No new work lands on the node; its current work keeps its window (drain: draining, then
        drained once nothing current or future is placed there)."""
        with service(server, key) as api:
            answer = api.drain_node(node_id, reschedule)
        out.emit(console(), answer, output, lambda wide: drain_view(answer, wide))

    @group.command("undrain")
    def undrain(
        node_id: NodeArg,
        output: OutputOpt = Output.table,
        server: ServerOpt = DEFAULT_SERVER,
        key: KeyOpt = None,
    ) -> None:
        """Lift a drain: the node takes new work again."""
        with service(server, key) as api:
            answer = api.undrain_node(node_id)
        out.emit(console(), answer, output, lambda wide: drain_view(answer, wide))

    @group.command("delete")
    def delete(
        node_id: NodeArg,
        output: OutputOpt = Output.table,
        server: ServerOpt = DEFAULT_SERVER,
        key: KeyOpt = None,
    ) -> None:
        """Delete a node that holds no current or future work (drain it first); its history stays."""
        with service(server, key) as api:
            api.delete_node(node_id)
        answer = {"id": node_id, "deleted": True}
        out.emit(console(), answer, output, lambda wide: Text(f"node {node_id} deleted"))

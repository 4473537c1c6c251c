"""The ``better-compute`` command (typer).

Local commands: ``serve``, ``migrate``, ``openapi``, ``placement explain|fleet|compare`` (docs/explain.md).
Client commands of a running service (docs/cli.md): ``reserve``, ``preview``, ``release``,
``get reservations|pools|nodes [ID]``, ``describe reservation|node ID``; each takes ``--server``
(``BC_SERVER``), ``--key`` (``BC_API_KEY``) and ``-o table|wide|json|yaml``, and exits 0 (done, placed),
3 (pending, would not fit), 1 (an API error, printed ``CODE: message``, or an unreachable service) or
2 (usage). The HTTP client and the output live in :mod:`app.client`; the commands here stay thin.
"""

from __future__ import annotations

import inspect
import io
import os
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import typer
from rich.console import Console

from app.agent.cli import agent as agent_command
from app.answers.statuses import ReservationStatus
from app.client import EXIT_API_ERROR, EXIT_NOT_PLACED, EXIT_USAGE
from app.client import render as out
from app.client.api import DEFAULT_SERVER, ServiceClient, ServiceError, Unreachable
from app.client.flags import LIST_RESERVATION_FLAGS, REQUEST_FLAGS, RequestFlags, UsageError, with_flag
from app.client.node_commands import node_group
from app.client.render import Output
from app.fleet.cli import placement_app

app = typer.Typer(
    help="better-compute: decide where GPU work lands.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,  # a traceback must never print the API key
)
get_app = typer.Typer(help="List or show reservations, pools and nodes.", no_args_is_help=True)
describe_app = typer.Typer(help="Show one reservation or node in detail.", no_args_is_help=True)

# no hard wraps when the output is not a terminal (kubectl does not wrap either: rows stay greppable)
console = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 10_000)


def serve(
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to bind.")] = 8000,
    demo: Annotated[bool, typer.Option("--demo", help="Load the demo pool and print an admin key.")] = False,
    workers: Annotated[int, typer.Option(help="uvicorn worker processes.")] = 1,
) -> None:
    """Run the HTTP service (on the embedded PostgreSQL when DATABASE_URL is unset).

    A bad setting or an unreachable database: one line on stderr and exit 2 (docs/operating.md,
    "Settings")."""
    import uvicorn

    from app.db.engine import default_data_dir, migrate
    from app.settings import get_settings

    settings, url = _checked_settings()
    migrate(url)
    # the app (and any worker process) uses this same database; re-read settings so the lifespan does
    # not start a second handle on the embedded server (it would outlive the process)
    os.environ["DATABASE_URL"] = url
    get_settings.cache_clear()
    if demo:
        import asyncio

        from app.inventory.demo_pool import install_demo

        summary = asyncio.run(install_demo(url, settings.bootstrap_admin_key))
        os.environ["BC_DEMO_AGENTS"] = "1"  # the service heartbeats the demo's nodes in process
        quota = ", ".join(f"{name} {amount}" for name, amount in sorted(summary["quota"].items()))
        console.print(
            f"[bold]demo pool[/bold] {summary['poolId']} ({summary['nodes']} nodes, {summary['gpus']} GPUs)\n"
            f"tenant [bold]demo[/bold] quota: {quota} (cpu in cores, memory in MiB)"
        )
        if summary.get("adminKey"):
            console.print(f"[bold]admin key[/bold] (shown once): {summary['adminKey']}")
        else:
            console.print("admin key: BC_BOOTSTRAP_ADMIN_KEY")
        shown = summary.get("adminKey") or "$BC_BOOTSTRAP_ADMIN_KEY"
        console.print(f"try: curl -s -H 'Authorization: Bearer {shown}' http://{host}:{port}/v1/pools")
        console.print("(each start with --demo prints a new admin key; earlier ones stay valid)")
    where = (
        "DATABASE_URL"
        if settings.database_url
        else f"embedded PostgreSQL in {settings.data_dir or default_data_dir()}"
    )
    console.print(f"better-compute serving on http://{host}:{port} (database: {where}); Ctrl-C stops it")
    console.print(f"dashboard: http://{host}:{port}/ui  API docs: http://{host}:{port}/docs")
    # uvicorn shuts down gracefully on SIGTERM, then re-raises it to the handler that was in place:
    # make that an ordinary exit, so exit handlers run and stop the embedded PostgreSQL
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    uvicorn.run(
        "app.main:create_app_without_migrations",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_level="warning",
        # longer than the idle timeout of common load balancers and HTTP clients, so a client never
        # reuses a keep-alive connection the server has just closed (BC_KEEP_ALIVE_SECONDS, default 75)
        timeout_keep_alive=settings.keep_alive_seconds,
        # beyond this many open connections and tasks uvicorn answers 503 at once instead of queueing
        # without bound (BC_LIMIT_CONCURRENCY, default 1000); header/body read timeouts belong to the
        # reverse proxy in front (docs/operating.md)
        limit_concurrency=settings.limit_concurrency,
    )


def migrate() -> None:
    """Migrate the database (DATABASE_URL, or the embedded PostgreSQL) to the latest schema."""
    from app.db.engine import migrate as run_migrate

    _, url = _checked_settings()
    run_migrate(url)
    console.print("migrated to head")


def _checked_settings() -> tuple[Any, str]:
    """The settings, every one checked (plugins imported, weights matched with scorers), and the
    database's URL once it answers; else one line on stderr naming the setting and exit 2."""
    from app.db.engine import probe_database, resolve_database_url, where
    from app.main import capacity_config
    from app.settings import SettingsError, get_settings

    try:
        settings = get_settings()
        capacity_config(settings)
    except SettingsError as exc:
        raise _fail(str(exc), EXIT_USAGE) from None
    url = resolve_database_url(settings.database_url, settings.data_dir)
    problem = probe_database(url)
    if problem is not None:
        source = "DATABASE_URL" if settings.database_url else "the embedded PostgreSQL"
        raise _fail(f"{source}: cannot connect to {where(url)}: {problem}", EXIT_USAGE)
    return settings, url


# -- client commands ---------------------------------------------------------------------------------

ServerOpt = Annotated[
    str, typer.Option("--server", envvar="BC_SERVER", help="Service URL.", show_default=True)
]
KeyOpt = Annotated[
    str | None, typer.Option("--key", envvar="BC_API_KEY", help="API key.", show_default=False)
]
OutputOpt = Annotated[Output, typer.Option("-o", "--output", help="Output format.")]
LimitOpt = Annotated[
    int | None, typer.Option("--limit", min=1, help="Show at most this many (default: all).")
]


def _fail(message: str, code: int) -> typer.Exit:
    """Print one plain line on stderr (no markup: messages carry brackets) and make the exit."""
    typer.echo(message, err=True)
    return typer.Exit(code)


@contextmanager
def service(server: str, key: str | None, flags: dict[str, str] | None = None) -> Iterator[ServiceClient]:
    """A client of ``server`` for one command, turning failures into exits: an unreachable service is
    one line naming the URL (exit 1), an error answer ``CODE: message`` with the field path replaced by
    its flag from ``flags`` (exit 1), a :class:`UsageError` its message (exit 2)."""
    if not key:
        raise _fail("an API key is needed: --key or BC_API_KEY", EXIT_USAGE)
    if not server.startswith(("http://", "https://")):
        raise _fail(f"--server {server!r}: give an http:// or https:// URL", EXIT_USAGE)
    try:
        with ServiceClient(server, key) as client:
            yield client
    except Unreachable as error:
        raise _fail(error.message, EXIT_API_ERROR) from None
    except ServiceError as error:
        message = error.message
        if flags is not None:
            message = with_flag(message, str(error.details.get("path", "")), flags)
        raise _fail(f"{error.code}: {message}", EXIT_API_ERROR) from None
    except UsageError as error:
        raise _fail(error.message, EXIT_USAGE) from None


TenantOpt = Annotated[str, typer.Option("--tenant", help="Tenant id.")]
PoolOpt = Annotated[str, typer.Option("--pool", help="Pool id.")]
GpusOpt = Annotated[int, typer.Option("--gpus", help="Number of atoms of --class.")]
ForOpt = Annotated[str, typer.Option("--for", help="Duration: 90m, 2h, 1d, or seconds.")]
SelectorOpt = Annotated[str | None, typer.Option("--selector", help="Selector shorthand.")]
NvlinkOpt = Annotated[bool, typer.Option("--nvlink", help="Only NVLink-complete sets (nvlink-all).")]
CpuOpt = Annotated[float | None, typer.Option("--cpu", help="CPU cores.")]
MemOpt = Annotated[float | None, typer.Option("--memory", help="Memory (MiB).")]
IdemOpt = Annotated[str | None, typer.Option("--idempotency-key", help="Retry key (default: random).")]
ClassOpt = Annotated[str, typer.Option("--class", help="Device class.")]
SpotOpt = Annotated[bool, typer.Option("--spot", help="Spot work: regular work may preempt it.")]
EarliestOpt = Annotated[
    bool, typer.Option("--earliest", help="Start at the first window that fits (start: earliest).")
]
IfPlanOpt = Annotated[
    str | None,
    typer.Option(
        "--if-plan",
        help="Commit exactly this plan token of a preview of the same flags, or fail (PLAN_STALE).",
    ),
]


def _request_command(
    send: Callable[[ServiceClient, dict[str, Any], Output], bool], *, takes_plan: bool = False
) -> Callable[..., None]:
    """A command that sends the request the flags describe: ``send(api, body, output)`` calls the
    service, prints the answer and says whether it is done (else exit 3). Preview and reserve take the
    same flags, so they share this one definition; ``--if-plan`` is reserve's only (``takes_plan``):
    preview prints plan tokens, it takes none (docs/cli.md)."""

    def command(
        tenant: TenantOpt,
        pool: PoolOpt,
        gpus: GpusOpt = 0,
        for_: ForOpt = "1d",
        selector: SelectorOpt = None,
        nvlink: NvlinkOpt = False,
        cpu: CpuOpt = None,
        memory: MemOpt = None,
        idempotency_key: IdemOpt = None,
        device_class: ClassOpt = "gpu",
        spot: SpotOpt = False,
        earliest: EarliestOpt = False,
        if_plan: IfPlanOpt = None,
        output: OutputOpt = Output.table,
        server: ServerOpt = DEFAULT_SERVER,
        key: KeyOpt = None,
    ) -> None:
        flags = RequestFlags(
            tenant,
            pool,
            gpus,
            for_,
            selector,
            nvlink,
            cpu,
            memory,
            idempotency_key,
            device_class,
            spot,
            earliest,
            if_plan,
        )
        with service(server, key, REQUEST_FLAGS) as api:
            done = send(api, flags.request_body(), output)
        if not done:
            raise typer.Exit(EXIT_NOT_PLACED)

    if not takes_plan:  # typer reads the parameters from the signature: leave --if-plan out
        signature = inspect.signature(command, eval_str=True)
        kept = [p for p in signature.parameters.values() if p.name != "if_plan"]
        command.__signature__ = signature.replace(parameters=kept)  # type: ignore[attr-defined]
    return command


def _warn(answer: dict[str, Any]) -> None:
    """The answer's ``warnings`` (selector keys nothing in the pool carries), one line each on stderr."""
    for warning in answer.get("warnings") or ():
        typer.echo(f"warning: {warning}", err=True)


def _preview(api: ServiceClient, body: dict[str, Any], output: Output) -> bool:
    """Preview; done when it would fit. A request the pool could never hold (``satisfiable: false``)
    exits 1 like reserve's UNSATISFIABLE error, not 3: waiting will not help (docs/cli.md)."""
    answer = api.preview(body)
    out.emit(console, answer, output, lambda wide: out.preview_view(answer, wide))
    if answer.get("planToken") and output in (Output.table, Output.wide):  # json/yaml carry it already
        # one line of its own, never wrapped: `reserve ... --if-plan TOKEN` commits exactly this plan
        typer.echo(f"plan token: {answer['planToken']}")
    _warn(answer)
    if answer.get("satisfiable") is False:
        why = answer.get("unsatisfiableReason") or answer.get("reason", "")
        raise _fail(f"UNSATISFIABLE: {why}", EXIT_API_ERROR)
    return bool(answer.get("fits"))


def _reserve(api: ServiceClient, body: dict[str, Any], output: Output) -> bool:
    """Reserve; done when placed (pending and queued are not)."""
    answer = api.reserve(body)
    names = _names(api, [answer], output)
    out.emit(console, answer, output, lambda wide: out.reservation_view(answer, names, wide))
    _warn(answer)
    return answer.get("status") == "placed"


def _names(api: ServiceClient, reservations: list[dict[str, Any]], output: Output) -> dict[str, str]:
    """Node names for the reservations' allocations, looked up only for human output."""
    if output in (Output.json, Output.yaml):
        return {}
    return api.node_names(out.reservation_nodes(reservations))


def release(
    reservation_id: Annotated[str, typer.Argument(metavar="ID", help="Reservation id (res_...).")],
    output: OutputOpt = Output.table,
    server: ServerOpt = DEFAULT_SERVER,
    key: KeyOpt = None,
) -> None:
    """Release a reservation (its holdings end now)."""
    with service(server, key) as api:
        answer = api.release(reservation_id)
        out.emit(console, answer, output, lambda wide: out.reservation_view(answer, {}, wide))


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
    with service(server, key, LIST_RESERVATION_FLAGS) as api:
        if reservation_id:
            data: Any = api.reservation(reservation_id)
            rows = [data]
        else:
            rows = api.reservations(tenant, status, limit)
            data = {"items": rows}
        names = _names(api, rows, output)
        out.emit(console, data, output, lambda wide: out.reservations_view(rows, names, wide))


def get_pools(
    pool_id: Annotated[str | None, typer.Argument(metavar="[ID]", help="One pool (pool_...).")] = None,
    limit: LimitOpt = None,
    output: OutputOpt = Output.table,
    server: ServerOpt = DEFAULT_SERVER,
    key: KeyOpt = None,
) -> None:
    """List the pools this key may see (or show one)."""
    with service(server, key) as api:
        rows = [api.pool(pool_id)] if pool_id else api.pools(limit)
        data = rows[0] if pool_id else {"items": rows}
        out.emit(console, data, output, lambda wide: out.pools_view(rows, wide))


def get_nodes(
    node_id: Annotated[str | None, typer.Argument(metavar="[ID]", help="One node (node_...).")] = None,
    pool: Annotated[
        str | None, typer.Option("--pool", help="Only this pool's nodes (default: every pool's).")
    ] = None,
    limit: LimitOpt = None,
    output: OutputOpt = Output.table,
    server: ServerOpt = DEFAULT_SERVER,
    key: KeyOpt = None,
) -> None:
    """List nodes in id order, a pool's or every visible pool's (or show one)."""
    if node_id and pool:
        raise _fail("--pool lists a pool's nodes; a node id names the node alone", EXIT_USAGE)
    with service(server, key) as api:
        pool_names: dict[str, str] = {}
        if node_id:
            rows = [api.node(node_id)]
            data: Any = rows[0]
        else:
            pools = [api.pool(pool)] if pool else api.pools()
            pool_names = {p["id"]: p["name"] for p in pools}
            rows = []
            for p in pools:
                wanted = None if limit is None else limit - len(rows)
                if wanted == 0:
                    break
                rows += [{**n, "poolId": n.get("poolId", p["id"])} for n in api.nodes(p["id"], wanted)]
            data = {"items": rows}
        out.emit(console, data, output, lambda wide: out.nodes_view(rows, wide, pool_names))


def describe_reservation(
    reservation_id: Annotated[str, typer.Argument(metavar="ID", help="Reservation id (res_...).")],
    output: OutputOpt = Output.table,
    server: ServerOpt = DEFAULT_SERVER,
    key: KeyOpt = None,
) -> None:
    """A reservation's request, allocations (by node name) and conditions."""
    with service(server, key) as api:
        answer = api.reservation(reservation_id)
        names = _names(api, [answer], output)
        out.emit(console, answer, output, lambda wide: out.describe_reservation_view(answer, names, wide))


def describe_node(
    node_id: Annotated[str, typer.Argument(metavar="ID", help="Node id (node_...).")],
    output: OutputOpt = Output.table,
    server: ServerOpt = DEFAULT_SERVER,
    key: KeyOpt = None,
) -> None:
    """A node's status, labels, taints, resources, devices and links."""
    with service(server, key) as api:
        node = api.node(node_id)
        pool_name = None if output in (Output.json, Output.yaml) else api.pool_name(node["poolId"])
        out.emit(console, node, output, lambda wide: out.describe_node_view(node, pool_name, wide))


def openapi_command(
    output: Annotated[str, typer.Option("-o", help="Where to write it.")] = "openapi/openapi.json",
) -> None:
    """Regenerate the checked-in OpenAPI document."""
    from app.openapi import write_openapi

    write_openapi(output)
    console.print(f"wrote {output}")


# -- the command list (help shows them in this order; new commands, e.g. `agent`, join it) ------------

COMMANDS: list[tuple[str, Callable[..., None], str | None]] = [
    ("serve", serve, None),
    ("migrate", migrate, None),
    (
        "reserve",
        _request_command(_reserve, takes_plan=True),
        "Reserve GPUs (and cpu/memory) now, or at the first window that fits (--earliest), for a "
        "duration (exit 3: pending).",
    ),
    (
        "preview",
        _request_command(_preview),
        "Would this fit, where, and if not, why not (exit 3: it would not).",
    ),
    ("release", release, None),
    ("openapi", openapi_command, None),
    ("agent", agent_command, "Run the node agent on a GPU host (Hello, heartbeats)."),
]
GET_COMMANDS: list[tuple[str, Callable[..., None], str | None]] = [
    ("reservations", get_reservations, None),
    ("pools", get_pools, None),
    ("nodes", get_nodes, None),
]
DESCRIBE_COMMANDS: list[tuple[str, Callable[..., None], str | None]] = [
    ("reservation", describe_reservation, None),
    ("node", describe_node, None),
]
GROUPS: list[tuple[str, typer.Typer]] = [
    ("get", get_app),
    ("describe", describe_app),
    ("placement", placement_app),
    ("node", node_group(service, console)),  # drain, undrain, delete (app/client/node_commands.py)
]
# kubectl takes either number: `get reservation ID`, `describe nodes ID`
ALIASES: list[tuple[typer.Typer, str, Callable[..., None]]] = [
    (get_app, "reservation", get_reservations),
    (get_app, "pool", get_pools),
    (get_app, "node", get_nodes),
    (describe_app, "reservations", describe_reservation),
    (describe_app, "nodes", describe_node),
]

for group, commands in ((app, COMMANDS), (get_app, GET_COMMANDS), (describe_app, DESCRIBE_COMMANDS)):
    for name, function, help_text in commands:
        group.command(name, help=help_text)(function)
for name, sub_app in GROUPS:
    app.add_typer(sub_app, name=name)
for group, name, function in ALIASES:
    group.command(name, hidden=True)(function)


def main() -> None:
    """Console-script entry point (output is UTF-8 whatever the locale: ``×`` stays ``×``)."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(encoding="utf-8")
    app(prog_name="better-compute")


if __name__ == "__main__":
    sys.exit(main())

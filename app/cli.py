"""The ``better-compute`` command (typer).

Local commands: ``serve``, ``migrate``, ``openapi``, ``placement explain|fleet|compare`` (docs/explain.md).
Client commands of a running service (docs/cli.md): ``reserve``, ``preview``, ``release``, ``extend``,
``get reservations|pools|nodes [ID]``, ``describe reservation|node ID``, ``usage``, ``pool create|archive``,
``node import|label|taint|untaint|cordon|uncordon|drain|undrain|delete``, ``quota get|set``,
``key create|list|revoke``, ``audit``; each takes ``--server``
(``BC_SERVER``), ``--key`` (``BC_API_KEY``) and ``-o table|wide|json|yaml``, and exits 0 (done, placed),
3 (pending, would not fit), 1 (an API error, printed ``CODE: message``, or an unreachable service) or
2 (usage). The commands live in :mod:`app.client` (``*_commands`` modules); this module registers them.

Start-up (docs/cli.md, "Start-up"): importing this module imports no server module (``app.main``, the
services, SQLAlchemy, FastAPI); ``serve``, ``migrate`` and ``openapi`` import them inside their functions.
"""

from __future__ import annotations

import io
import os
import signal
import sys
from collections.abc import Callable
from typing import Annotated, Any

import typer

from app.agent.cli import agent as agent_command
from app.client import EXIT_USAGE
from app.client.audit_commands import audit
from app.client.common import KeyOpt, LimitOpt, OutputOpt, ServerOpt, console, emit, fail, service
from app.client.extend_commands import extend
from app.client.key_commands import key_app
from app.client.node_commands import node_app
from app.client.pool_commands import pool_app
from app.client.quota_commands import quota_app
from app.client.read_commands import (
    describe_node,
    describe_reservation,
    get_nodes,
    get_pools,
    get_reservations,
)
from app.client.reservation_commands import preview, release, request_command, reserve
from app.client.usage_commands import usage
from app.fleet.cli import placement_app

# the client commands' shared pieces (app/client/common.py) stay importable from here
__all__ = ["KeyOpt", "LimitOpt", "OutputOpt", "ServerOpt", "app", "emit", "main", "service"]

app = typer.Typer(
    help="better-compute: decide where GPU work lands.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,  # a traceback must never print the API key
    # click's plain help and usage errors, for every group under this one: typer's rich help imports
    # rich's markdown, syntax and traceback modules, a fifth of a second that `--help` must not pay
    # (docs/cli.md, "Start-up")
    rich_markup_mode=None,
)
get_app = typer.Typer(help="List or show reservations, pools and nodes.", no_args_is_help=True)
describe_app = typer.Typer(help="Show one reservation or node in detail.", no_args_is_help=True)


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
        console().print(
            f"[bold]demo pool[/bold] {summary['poolId']} ({summary['nodes']} nodes, {summary['gpus']} GPUs)\n"
            f"tenant [bold]demo[/bold] quota: {quota} (cpu in cores, memory in MiB)"
        )
        if summary.get("adminKey"):
            console().print(f"[bold]admin key[/bold] (shown once): {summary['adminKey']}")
        else:
            console().print("admin key: BC_BOOTSTRAP_ADMIN_KEY")
        shown = summary.get("adminKey") or "$BC_BOOTSTRAP_ADMIN_KEY"
        console().print(f"try: curl -s -H 'Authorization: Bearer {shown}' http://{host}:{port}/v1/pools")
        console().print("(each start with --demo prints a new admin key; earlier ones stay valid)")
    where = (
        "DATABASE_URL"
        if settings.database_url
        else f"embedded PostgreSQL in {settings.data_dir or default_data_dir()}"
    )
    console().print(f"better-compute serving on http://{host}:{port} (database: {where}); Ctrl-C stops it")
    console().print(f"dashboard: http://{host}:{port}/ui  API docs: http://{host}:{port}/docs")
    if workers > 1:  # one scrape of /metrics sums every worker (docs/metrics.md, "Workers")
        from app.observability.multiprocess import prepare_folder

        prepare_folder()
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
    console().print("migrated to head")


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
        raise fail(str(exc), EXIT_USAGE) from None
    url = resolve_database_url(settings.database_url, settings.data_dir)
    problem = probe_database(url)
    if problem is not None:
        source = "DATABASE_URL" if settings.database_url else "the embedded PostgreSQL"
        raise fail(f"{source}: cannot connect to {where(url)}: {problem}", EXIT_USAGE)
    return settings, url


def openapi_command(
    output: Annotated[str, typer.Option("-o", help="Where to write it.")] = "openapi/openapi.json",
) -> None:
    """Regenerate the checked-in OpenAPI document."""
    from app.openapi import write_openapi

    write_openapi(output)
    console().print(f"wrote {output}")


# -- the command list (help shows them in this order; new commands, e.g. `agent`, join it) ------------

COMMANDS: list[tuple[str, Callable[..., None], str | None]] = [
    ("serve", serve, None),
    ("migrate", migrate, None),
    (
        "reserve",
        request_command(reserve, reserve=True),
        "Reserve GPUs (and cpu/memory) now, or at the first window that fits (--earliest), for a "
        "duration (exit 3: pending).",
    ),
    (
        "preview",
        request_command(preview),
        "Would this fit, where, and if not, why not (exit 3: it would not).",
    ),
    ("release", release, None),
    ("usage", usage, None),
    ("extend", extend, None),
    ("openapi", openapi_command, None),
    ("agent", agent_command, "Run the node agent on a GPU host (Hello, heartbeats)."),
    ("audit", audit, None),
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
    ("pool", pool_app),
    ("node", node_app),
    ("quota", quota_app),
    ("key", key_app),
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

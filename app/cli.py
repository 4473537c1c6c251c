"""The ``better-compute`` command (typer): serve, migrate, reserve / preview / release (HTTP clients of
a running service), api-key creation, and ``placement explain|fleet|compare`` (local, seed 004)."""

from __future__ import annotations

import json
import os
import secrets
import signal
import sys
from collections.abc import Callable
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.table import Table

from app.agent.cli import agent as agent_command
from app.fleet.cli import placement_app

app = typer.Typer(help="better-compute: decide where GPU work lands.", no_args_is_help=True)
app.add_typer(placement_app, name="placement")
app.command("agent", help="Run the node agent on a GPU host (Hello, heartbeats).")(agent_command)
console = Console(soft_wrap=True)  # no hard wraps at 80 columns when the output is not a terminal
err = Console(stderr=True, soft_wrap=True)

URL_OPTION = typer.Option("--url", envvar="BC_URL", help="Service base URL.")
KEY_OPTION = typer.Option("--key", envvar="BC_API_KEY", help="API key (or BC_API_KEY).")


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to bind.")] = 8000,
    demo: Annotated[bool, typer.Option("--demo", help="Load the demo pool and print an admin key.")] = False,
    workers: Annotated[int, typer.Option(help="uvicorn worker processes.")] = 1,
) -> None:
    """Run the HTTP service (on the embedded PostgreSQL when DATABASE_URL is unset)."""
    import uvicorn

    from app.db.engine import default_data_dir, migrate, resolve_database_url
    from app.settings import get_settings

    settings = get_settings()
    url = resolve_database_url(settings.database_url, settings.data_dir)
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
        console.print(f"try: curl -s -H 'Authorization: Bearer <key>' http://{host}:{port}/v1/pools")
        console.print("(each start with --demo prints a new admin key; earlier ones stay valid)")
    where = (
        "DATABASE_URL"
        if settings.database_url
        else f"embedded PostgreSQL in {settings.data_dir or default_data_dir()}"
    )
    console.print(f"better-compute serving on http://{host}:{port} (database: {where}); Ctrl-C stops it")
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
        # reuses a keep-alive connection the server has just closed
        timeout_keep_alive=75,
    )


@app.command()
def migrate() -> None:
    """Migrate the database (DATABASE_URL, or the embedded PostgreSQL) to the latest schema."""
    from app.db.engine import migrate as run_migrate
    from app.db.engine import resolve_database_url
    from app.settings import get_settings

    settings = get_settings()
    run_migrate(resolve_database_url(settings.database_url, settings.data_dir))
    console.print("migrated to head")


def _client(url: str, key: str | None) -> httpx.Client:
    if not key:
        err.print("an API key is needed: --key or BC_API_KEY")
        raise typer.Exit(2)
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60)


def _answer(response: httpx.Response) -> Any:
    try:
        body = response.json()
    except ValueError:
        body = {"error": {"code": "HTTP", "message": response.text}}
    if response.status_code >= 400:
        e = body.get("error", {}) if isinstance(body, dict) else {}
        err.print(f"[red]{response.status_code} {e.get('code')}[/red]: {e.get('message')}")
        raise typer.Exit(1)
    return body


TenantOpt = Annotated[str, typer.Option("--tenant", help="Tenant id.")]
PoolOpt = Annotated[str, typer.Option("--pool", help="Pool id.")]
GpusOpt = Annotated[int, typer.Option("--gpus", help="Number of atoms of --class.")]
ForOpt = Annotated[str, typer.Option("--for", help="Duration: 90m, 2h, 1d, or seconds.")]
SelectorOpt = Annotated[str | None, typer.Option("--selector", help="Selector shorthand.")]
NvlinkOpt = Annotated[bool, typer.Option("--nvlink", help="topology: nvlink-all.")]
CpuOpt = Annotated[float | None, typer.Option("--cpu", help="CPU cores.")]
MemOpt = Annotated[float | None, typer.Option("--memory", help="Memory (MiB).")]
IdemOpt = Annotated[str | None, typer.Option("--idempotency-key", help="Retry key (default: random).")]
ClassOpt = Annotated[str, typer.Option("--class", help="Device class.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the JSON answer.")]


NO_FIT_EXIT = 3  # preview: the request would not fit (scripts can tell "no" from an error)


def _print_preview(answer: dict[str, Any]) -> None:
    if not answer["fits"]:
        console.print(f"[yellow]does not fit[/yellow]: {answer.get('reason')}")
        return
    table = Table("node", "score", "atoms")
    for cand in answer["candidates"]:
        table.add_row(cand.get("nodeName", cand["nodeId"]), f"{cand['score']:.3f}", ", ".join(cand["atoms"]))
    console.print(table)


def _print_reservation(answer: dict[str, Any]) -> None:
    console.print(f"{answer['id']} [bold]{answer['status']}[/bold]")
    for a in answer["allocations"]:
        console.print(f"  {a['nodeId']}: {', '.join(a['atoms'])} {a['resources']} until {a['end']}")
    for cond in answer["conditions"]:
        console.print(f"  [yellow]{cond['reason']}[/yellow]: {cond['message']}")


def _request_command(path: str, show: Callable[[dict[str, Any]], None]) -> Callable[..., None]:
    """A command that sends one reservation-shaped body to ``path`` (preview and reserve take the
    same options, so they share this one definition)."""

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
        as_json: JsonOpt = False,
        url: Annotated[str, URL_OPTION] = "http://127.0.0.1:8000",
        key: Annotated[str | None, KEY_OPTION] = None,
    ) -> None:
        device: dict[str, Any] = {"class": device_class, "count": gpus}
        if selector:
            device["selector"] = selector
        if nvlink:
            device["topology"] = "nvlink-all"
        body = {
            "tenantId": tenant,
            "poolId": pool,
            "devices": [device] if gpus else [],
            "resources": {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None},
            "duration": for_,
            "idempotencyKey": idempotency_key or f"cli-{secrets.token_hex(8)}",
        }
        with _client(url, key) as c:
            answer = _answer(c.post(path, json=body))
        if as_json:
            print(json.dumps(answer, indent=2))
        else:
            show(answer)
        if answer.get("fits") is False:
            raise typer.Exit(NO_FIT_EXIT)

    return command


app.command("preview", help="Would this fit, where, and if not, why not (exit code 3: it would not).")(
    _request_command("/v1/capacity/preview", _print_preview)
)
app.command("reserve", help="Reserve GPUs (and cpu/memory) now for a duration.")(
    _request_command("/v1/reservations", _print_reservation)
)


@app.command()
def release(
    reservation_id: Annotated[str, typer.Argument(help="Reservation id (res_...).")],
    url: Annotated[str, URL_OPTION] = "http://127.0.0.1:8000",
    key: Annotated[str | None, KEY_OPTION] = None,
) -> None:
    """Release a reservation."""
    with _client(url, key) as c:
        answer = _answer(c.post(f"/v1/reservations/{reservation_id}/release"))
    console.print(f"{answer['id']} [bold]{answer['status']}[/bold]")


@app.command("openapi")
def openapi_command(
    output: Annotated[str, typer.Option("-o", help="Where to write it.")] = "openapi/openapi.json",
) -> None:
    """Regenerate the checked-in OpenAPI document."""
    from app.openapi import write_openapi

    write_openapi(output)
    console.print(f"wrote {output}")


def main() -> None:
    """Console-script entry point."""
    app(prog_name="better-compute")


if __name__ == "__main__":
    sys.exit(main())

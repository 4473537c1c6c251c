"""``better-compute agent --server URL --pool POOL [--name NAME] [--interval 10s] [--once]
[--capability C]...`` runs on a GPU host with ``BC_API_KEY`` (a key holding ``compute:nodes:hello``
on ``pool:<POOL>``).
"""

from __future__ import annotations

import logging
import re
import signal
import socket
import sys
import threading
from typing import Annotated

import typer

_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_CAPABILITY = re.compile(r"[a-z][a-z0-9._-]*")


def default_name() -> str:
    """This host's name, as a node name (letters, digits, ``._-``)."""
    name = _NAME_UNSAFE.sub("-", socket.gethostname()).strip("-._") or "gpu-host"
    return name[:128]


def agent(
    server: Annotated[str, typer.Option("--server", help="The service's base URL.")],
    pool: Annotated[str, typer.Option("--pool", help="Pool id (pool_...) this host joins.")],
    name: Annotated[str | None, typer.Option("--name", help="Node name (default: the host name).")] = None,
    interval: Annotated[str, typer.Option("--interval", help="Heartbeat interval: 10s, 1m, ...")] = "10s",
    once: Annotated[bool, typer.Option("--once", help="Send one Hello or heartbeat and exit.")] = False,
    capability: Annotated[
        list[str] | None,
        typer.Option("--capability", help="A capability this host enforces (devices.limits, ...); repeat."),
    ] = None,
    key: Annotated[
        str | None, typer.Option("--key", envvar="BC_API_KEY", help="API key (or BC_API_KEY).")
    ] = None,
) -> None:
    """Run the node agent on this GPU host: Hello with its nvidia-smi inventory, then heartbeats."""
    # imported here: `better-compute --help` and the client commands need none of it (docs/cli.md)
    from app.agent.run import Agent, AgentConfig
    from app.placement.request import parse_duration

    if not key:
        typer.echo("an API key is needed: BC_API_KEY (compute:nodes:hello on the pool)", err=True)
        raise typer.Exit(2)
    try:
        seconds = parse_duration(interval)
    except ValueError as exc:
        typer.echo(f"--interval: {exc}", err=True)
        raise typer.Exit(2) from None
    capabilities = tuple(capability or ())
    for c in capabilities:
        if not _CAPABILITY.fullmatch(c) or len(c) > 64:
            typer.echo(
                f"--capability {c!r}: lower-case letters, digits, . _ - (e.g. devices.limits)", err=True
            )
            raise typer.Exit(2)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not one line per heartbeat
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    config = AgentConfig(
        server=server,
        pool=pool,
        name=name or default_name(),
        key=key,
        interval=min(seconds, 3600),
        capabilities=capabilities,
        once=once,
    )
    raise typer.Exit(Agent(config, stop).run())

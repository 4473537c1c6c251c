"""``better-compute pool create NAME`` and ``pool archive POOL`` (docs/cli.md, "Operator commands"):
``POST /v1/pools`` and ``POST /v1/pools/{id}/archive``, printed as ``get pools`` prints a pool.
Registered by ``app/cli.py`` as the ``pool`` group; a key needs ``compute:inventory:write``.
"""

from __future__ import annotations

from typing import Annotated

import typer

from app.client.api import DEFAULT_SERVER
from app.client.common import KeyOpt, Output, OutputOpt, ServerOpt, emit, service

pool_app = typer.Typer(help="Create or archive pools.", no_args_is_help=True)

POOL_FLAGS = {"name": "NAME"}


@pool_app.command("create")
def create_pool(
    name: Annotated[str, typer.Argument(metavar="NAME", help="The pool's name (letters, digits, ._-).")],
    output: OutputOpt = Output.table,
    server: ServerOpt = DEFAULT_SERVER,
    key: KeyOpt = None,
) -> None:
    """Make a pool (exit 1: CONFLICT when the name is taken)."""
    from app.client import render as out

    with service(server, key, POOL_FLAGS) as api:
        pool = api.create_pool(name)
        emit(pool, output, lambda wide: out.pools_view([pool], wide))


@pool_app.command("archive")
def archive_pool(
    pool: Annotated[str, typer.Argument(metavar="POOL", help="Pool id (pool_...) or name.")],
    output: OutputOpt = Output.table,
    server: ServerOpt = DEFAULT_SERVER,
    key: KeyOpt = None,
) -> None:
    """Archive a pool: it takes no new nodes and no new work (docs/lifecycle.md); twice is no error."""
    from app.client import render as out

    with service(server, key) as api:
        archived = api.archive_pool(api.pool_id(pool))
        emit(archived, output, lambda wide: out.pools_view([archived], wide))

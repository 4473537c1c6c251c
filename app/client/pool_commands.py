"""``better-compute pool create NAME`` and ``pool archive POOL`` (docs/cli.md, "Operator commands"):
``POST /v1/pools`` and ``POST /v1/pools/{id}/archive``, printed as ``get pools`` prints a pool.
Registered by ``app/cli.py`` as the ``pool`` group; a key needs ``compute:inventory:write``.
"""

from __future__ import annotations

from typing import Annotated

import typer

from app.client.api import ServiceClient
from app.client.common import Shown, client_command, listed

pool_app = typer.Typer(help="Create or archive pools.", no_args_is_help=True)

POOL_FLAGS = {"name": "NAME"}


@pool_app.command("create")
@client_command(POOL_FLAGS)
def create_pool(
    api: ServiceClient,
    name: Annotated[str, typer.Argument(metavar="NAME", help="The pool's name (letters, digits, ._-).")],
) -> Shown:
    """Make a pool (exit 1: CONFLICT when the name is taken)."""
    from app.client import render as out

    return listed([api.create_pool(name)], out.pools_view, one=True)


@pool_app.command("archive")
@client_command()
def archive_pool(
    api: ServiceClient,
    pool: Annotated[str, typer.Argument(metavar="POOL", help="Pool id (pool_...) or name.")],
) -> Shown:
    """Archive a pool: it takes no new nodes and no new work (docs/lifecycle.md); twice is no error."""
    from app.client import render as out

    return listed([api.archive_pool(api.pool_id(pool))], out.pools_view, one=True)

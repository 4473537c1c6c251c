"""Databases of their own for migration tests: made, migrated to a revision, dropped afterwards."""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sqlalchemy.engine import make_url

from app.db.engine import alembic_config
from tests.conftest import _admin_exec, _server_url


def migrate_to(url: str, direction: str, revision: str) -> None:
    """``alembic upgrade|downgrade <revision>`` on the database at ``url``."""
    from alembic import command

    getattr(command, direction)(alembic_config(url), revision)


def dsn(url: str) -> str:
    """``url`` as asyncpg takes it."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@asynccontextmanager
async def database_at(revision: str) -> AsyncIterator[str]:
    """A new database on the test server, migrated to ``revision``: its URL (dropped afterwards)."""
    server = _server_url()
    name = f"bc_mig_{os.getpid()}_{secrets.token_hex(4)}"
    await asyncio.to_thread(_admin_exec, server, f'CREATE DATABASE "{name}"')
    url = make_url(server).set(database=name).render_as_string(hide_password=False)
    try:
        await asyncio.to_thread(migrate_to, url, "upgrade", revision)
        yield url
    finally:
        await asyncio.to_thread(_admin_exec, server, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

"""Fixtures for fleet tests: the in-process SSH server (see ``fleet_sshd.py``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from fleet_sshd import FleetSSHServer, start_server


@pytest.fixture
async def ssh_server(tmp_path: Path) -> AsyncIterator[FleetSSHServer]:
    """A loopback SSH server answering scripted commands; closed after the test."""
    server = await start_server(tmp_path)
    try:
        yield server
    finally:
        server.close()

"""A PostgreSQL instance of a test's own (initdb + pg_ctl in a temporary folder, on a free port), for
tests that must stop and restart PostgreSQL. Never the machine's server on 5432.

The binaries come from ``/usr/lib/postgresql/<version>/bin`` or, failing that, the ones pgserver ships.
PostgreSQL refuses to run as root, so as root the instance runs as the ``postgres`` system user.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.servers import free_port


def postgres_bin_dir() -> Path | None:
    """Where initdb and pg_ctl are: the newest /usr/lib/postgresql/<version>/bin, else pgserver's."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    if found:
        return Path(found[-1]).parent
    try:
        from pgserver._commands import POSTGRES_BIN_PATH  # type: ignore[attr-defined]
    except ImportError:
        return None
    return Path(POSTGRES_BIN_PATH) if (Path(POSTGRES_BIN_PATH) / "pg_ctl").exists() else None


@dataclass
class PgInstance:
    """One private PostgreSQL: ``url`` to its ``postgres`` database; ``stop()`` / ``start()``."""

    bin_dir: Path
    data: Path
    port: int
    user: str | None  # the system user the server runs as (None: the current user)

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        command = [str(self.bin_dir / args[0]), *args[1:]]
        if self.user:
            command = ["runuser", "-u", self.user, "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=60)

    def start(self) -> None:
        """Start the server (waits until it accepts connections)."""
        options = f"-p {self.port} -h 127.0.0.1 -k {self.data}"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.data / "log"), "-o", options, "-w", "start")

    def stop(self) -> None:
        """Stop the server now (``-m fast``: open connections are terminated)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def destroy(self) -> None:
        try:
            self.stop()
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(self.data, ignore_errors=True)


def create_instance() -> PgInstance | None:
    """Initialise and start a private instance, or None when no PostgreSQL binaries are available."""
    found = postgres_bin_dir()
    if found is None:
        return None
    user = "postgres" if os.geteuid() == 0 else None
    data = Path(tempfile.mkdtemp(prefix="bc-own-pg-"))
    if user:
        shutil.chown(data, user)
    instance = PgInstance(found, data, free_port(), user)
    instance._run("initdb", "-D", str(data), "-U", "postgres", "--auth=trust", "--encoding=UTF8")
    for attempt in range(3):
        try:
            instance.start()
            return instance
        except subprocess.CalledProcessError:  # the port was taken meanwhile
            instance.port = free_port()
            time.sleep(0.2 * attempt)
    raise AssertionError((data / "log").read_text(errors="replace")[-3000:])

"""SSH at the edge of fleet collection (docs/fleet.md): the only fleet module that opens a network connection.

Hosts come from a TOML file of ``[hosts.NAME]`` tables::

    [hosts.workstation]
    address = "10.0.0.5"          # required
    user = "vq"                   # required
    port = 22                     # default 22
    key = "~/.ssh/id_ed25519"     # client key file; default: the SSH agent / default keys
    known_hosts = "~/.ssh/known_hosts"   # default: the user's known_hosts (host keys are checked)
    scheduler = "slurm"           # "slurm" | "pbs" for a scheduler host; omitted for a daemon host

A command is run read-only and bounded: argv joined with shell quoting, stdout capped at
``max_output_bytes`` (the call fails when a host prints more), the whole call (connect + run) limited to
``timeout_seconds`` (default 60), and one replay after a transport failure (connection refused, reset
or lost before the command finished). A timeout or an oversize answer is not replayed. On a timeout the
remote process is sent SIGTERM and the channel closed, so nothing keeps running under our session.
"""

from __future__ import annotations

import asyncio
import shlex
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import asyncssh

from app.errors import InvalidInput

DEFAULT_TIMEOUT_SECONDS = 60.0
DEFAULT_MAX_OUTPUT_BYTES = 4 * 1024 * 1024
"""Largest stdout accepted from one command (4 MiB): a big ``pbsnodes -a`` is well under it."""
MAX_STDERR_BYTES = 64 * 1024


@dataclass(frozen=True)
class HostConfig:
    """One ``[hosts.NAME]`` entry: where and how to reach a daemon host or scheduler login node."""

    name: str
    address: str
    user: str
    port: int = 22
    key: Path | None = None
    known_hosts: Path | None = None
    scheduler: Literal["slurm", "pbs"] | None = None


_HOST_FIELDS = {"address", "user", "port", "key", "known_hosts", "scheduler"}


def parse_hosts(data: dict[str, Any], *, base_dir: Path | None = None) -> dict[str, HostConfig]:
    """Hosts from a parsed TOML document ``{"hosts": {NAME: {...}}}``. Relative ``key`` and
    ``known_hosts`` paths resolve against ``base_dir`` (the config file's folder); ``~`` expands.

    Raises :class:`InvalidInput` with ``path`` such as ``hosts.workstation.port``.
    """
    hosts_table = data.get("hosts", {})
    if not isinstance(hosts_table, dict):
        raise InvalidInput("hosts: must be a table of [hosts.NAME]", path="hosts")
    unknown_top = set(data) - {"hosts"}
    if unknown_top:
        key = sorted(unknown_top)[0]
        raise InvalidInput(f"{key}: unknown table", path=key)
    hosts: dict[str, HostConfig] = {}
    for name, entry in hosts_table.items():
        where = f"hosts.{name}"
        if not isinstance(entry, dict):
            raise InvalidInput(f"{where}: must be a table", path=where)
        for key in sorted(set(entry) - _HOST_FIELDS):
            raise InvalidInput(f"{where}.{key}: unknown field", path=f"{where}.{key}")
        for key in ("address", "user"):
            if not isinstance(entry.get(key), str) or not entry[key]:
                raise InvalidInput(f"{where}.{key}: is required (a string)", path=f"{where}.{key}")
        port = entry.get("port", 22)
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise InvalidInput(f"{where}.port: must be an integer 1-65535", path=f"{where}.port")
        scheduler = entry.get("scheduler")
        if scheduler not in (None, "slurm", "pbs"):
            raise InvalidInput(f"{where}.scheduler: must be 'slurm' or 'pbs'", path=f"{where}.scheduler")
        paths: dict[str, Path | None] = {}
        for key in ("key", "known_hosts"):
            value = entry.get(key)
            if value is None:
                paths[key] = None
                continue
            if not isinstance(value, str) or not value:
                raise InvalidInput(f"{where}.{key}: must be a path string", path=f"{where}.{key}")
            path = Path(value).expanduser()
            if not path.is_absolute() and base_dir is not None:
                path = base_dir / path
            paths[key] = path
        hosts[name] = HostConfig(
            name=name,
            address=entry["address"],
            user=entry["user"],
            port=port,
            key=paths["key"],
            known_hosts=paths["known_hosts"],
            scheduler=scheduler,
        )
    return hosts


def load_hosts(path: Path) -> dict[str, HostConfig]:
    """Read a hosts TOML file (see the module docstring). Raises :class:`InvalidInput` when the file
    is missing or malformed."""
    try:
        data = tomllib.loads(path.read_text())
    except OSError as error:
        raise InvalidInput(f"hosts file {path}: {error.strerror or error}", path="hosts") from None
    except tomllib.TOMLDecodeError as error:
        raise InvalidInput(f"hosts file {path}: {error}", path="hosts") from None
    return parse_hosts(data, base_dir=path.parent)


class CommandFailed(Exception):
    """A command gave no usable answer: ``reason`` says why (for the build report / stderr)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class CommandResult:
    """What a command printed: ``stdout`` (text, at most the bound), ``stderr`` (truncated to 64 KiB),
    ``exit_status`` (None when the remote side gave none), ``attempts`` (1 or 2), ``seconds`` elapsed."""

    stdout: str
    stderr: str
    exit_status: int | None
    attempts: int
    seconds: float

    def checked(self) -> str:
        """stdout when the command exited 0; else :class:`CommandFailed` with the status and stderr."""
        if self.exit_status != 0:
            detail = self.stderr.strip().splitlines()
            tail = f": {detail[-1]}" if detail else ""
            raise CommandFailed(f"exit status {self.exit_status}{tail}")
        return self.stdout


class _TransportFailure(Exception):
    pass


_REFUSALS = (
    asyncssh.PermissionDenied,
    asyncssh.HostKeyNotVerifiable,
    asyncssh.KeyExchangeFailed,
    asyncssh.ProtocolNotSupported,
    asyncssh.KeyImportError,
)


async def _read_bounded(stream: asyncssh.SSHReader[bytes], limit: int, what: str) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = await stream.read(65536)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > limit:
            raise CommandFailed(f"{what} exceeded {limit} bytes")
        chunks.append(chunk)


async def _read_stderr(stream: asyncssh.SSHReader[bytes]) -> bytes:
    kept = bytearray()
    while True:
        chunk = await stream.read(65536)
        if not chunk:
            return bytes(kept)
        if len(kept) < MAX_STDERR_BYTES:
            kept.extend(chunk[: MAX_STDERR_BYTES - len(kept)])


async def _attempt(host: HostConfig, command: str, max_output_bytes: int) -> tuple[bytes, bytes, int | None]:
    options: dict[str, Any] = {"username": host.user, "port": host.port}
    if host.key is not None:
        options["client_keys"] = [str(host.key)]
    if host.known_hosts is not None:
        options["known_hosts"] = str(host.known_hosts)
    try:
        conn = await asyncssh.connect(host.address, **options)
    except _REFUSALS as error:  # host key or authentication refused: replaying cannot help
        raise CommandFailed(f"ssh to {host.address}:{host.port}: {error}") from error
    except (OSError, asyncssh.DisconnectError, asyncssh.ConnectionLost) as error:
        raise _TransportFailure(f"connect to {host.address}:{host.port}: {error}") from error
    except (asyncssh.Error, ValueError) as error:  # e.g. an unreadable key file
        raise CommandFailed(f"ssh to {host.address}:{host.port}: {error}") from error
    async with conn:
        try:
            process = await conn.create_process(command, encoding=None)
        except (OSError, asyncssh.DisconnectError, asyncssh.ConnectionLost) as error:
            raise _TransportFailure(f"open session: {error}") from error
        except asyncssh.ChannelOpenError as error:
            raise CommandFailed(f"open session: {error}") from error
        try:
            stdout, stderr = await asyncio.gather(
                _read_bounded(process.stdout, max_output_bytes, "output"), _read_stderr(process.stderr)
            )
            await process.wait_closed()
        except (asyncssh.DisconnectError, asyncssh.ConnectionLost, BrokenPipeError) as error:
            raise _TransportFailure(f"connection lost: {error}") from error
        except BaseException:
            # Timeout (cancellation) or oversize output: stop the remote command, then drop the channel.
            try:
                process.terminate()
            except (OSError, asyncssh.Error):
                pass
            process.close()
            raise
        return stdout, stderr, process.exit_status


async def run_command(
    host: HostConfig,
    argv: list[str],
    *,
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
) -> CommandResult:
    """Run ``argv`` on ``host`` over SSH, read-only and bounded (see the module docstring).

    ``timeout_seconds`` bounds the whole call including one replay after a transport failure;
    ``max_output_bytes`` bounds stdout. Returns the result whatever the exit status (see
    :meth:`CommandResult.checked`); raises :class:`CommandFailed` when there is no answer: timeout,
    oversize output, authentication or host-key refusal, or a second transport failure.
    """
    command = shlex.join(argv)
    started = time.monotonic()
    attempts = 0
    last_failure = ""

    async def attempts_loop() -> tuple[bytes, bytes, int | None]:
        nonlocal attempts, last_failure
        for _ in range(2):
            attempts += 1
            try:
                return await _attempt(host, command, max_output_bytes)
            except _TransportFailure as failure:
                last_failure = str(failure)
        raise CommandFailed(f"{last_failure} (after one replay)")

    try:
        stdout, stderr, status = await asyncio.wait_for(attempts_loop(), timeout_seconds)
    except TimeoutError:
        raise CommandFailed(f"no answer within {timeout_seconds:g} s") from None
    return CommandResult(
        stdout=stdout.decode("utf-8", errors="replace"),
        stderr=stderr.decode("utf-8", errors="replace"),
        exit_status=status,
        attempts=attempts,
        seconds=time.monotonic() - started,
    )

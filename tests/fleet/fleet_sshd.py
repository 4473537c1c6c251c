"""An in-process SSH server on 127.0.0.1 for fleet collection tests (no mocks: real asyncssh on both ends).

Each configured host is the same server reached with a different user name; the server answers a
``(user, command)`` pair with a scripted behaviour: print text and exit, hang, flood stdout, or drop the
connection once before answering (a transport failure the client replays). It counts connections, so
a test can show that a refused build contacted no host.
"""

from __future__ import annotations

import asyncio
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import asyncssh

from app.fleet.ssh import HostConfig


@dataclass
class Answer:
    """What the server does for one command: ``stdout``/``stderr``/``status``; ``hang`` never answers;
    ``flood`` prints that many bytes; ``drop_first`` aborts the first connection that asks."""

    stdout: str = ""
    stderr: str = ""
    status: int = 0
    hang: bool = False
    flood: int = 0
    drop_first: bool = False


@dataclass
class FleetSSHServer:
    """The running server: ``port``, client key and known_hosts files, and what it saw."""

    port: int
    client_key_path: Path
    known_hosts_path: Path
    answers: dict[tuple[str, str], Answer] = field(default_factory=dict)
    connections: list[str] = field(default_factory=list)
    commands: list[tuple[str, str]] = field(default_factory=list)
    dropped: set[tuple[str, str]] = field(default_factory=set)
    server: asyncssh.SSHAcceptor | None = None

    def host(self, name: str, scheduler: str | None = None) -> HostConfig:
        """A host config that reaches this server as user ``name``."""
        return HostConfig(
            name=name,
            address="127.0.0.1",
            user=name,
            port=self.port,
            key=self.client_key_path,
            known_hosts=self.known_hosts_path,
            scheduler=scheduler,  # type: ignore[arg-type]
        )

    def toml(self, hosts: dict[str, str | None]) -> str:
        """A hosts TOML file for ``{name: scheduler}``."""
        lines = []
        for name, scheduler in hosts.items():
            lines += [
                f'[hosts."{name}"]',
                'address = "127.0.0.1"',
                f'user = "{name}"',
                f"port = {self.port}",
                f'key = "{self.client_key_path}"',
                f'known_hosts = "{self.known_hosts_path}"',
            ]
            if scheduler:
                lines.append(f'scheduler = "{scheduler}"')
            lines.append("")
        return "\n".join(lines)

    def answer(self, user: str, argv: list[str], answer: Answer) -> None:
        """Script the answer to ``argv`` (as the client quotes it) for ``user``."""
        self.answers[(user, shlex.join(argv))] = answer

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


class _Server(asyncssh.SSHServer):
    def __init__(self, state: FleetSSHServer) -> None:
        self.state = state

    def begin_auth(self, username: str) -> bool:
        self.state.connections.append(username)
        return True


async def start_server(tmp: Path) -> FleetSSHServer:
    """Start the server on an ephemeral loopback port with a fresh host key and client key."""
    host_key = asyncssh.generate_private_key("ssh-ed25519")
    client_key = asyncssh.generate_private_key("ssh-ed25519")
    client_key_path = tmp / "client_key"
    client_key.write_private_key(str(client_key_path))
    client_key_path.chmod(0o600)
    authorized = asyncssh.import_authorized_keys(client_key.export_public_key().decode())
    state = FleetSSHServer(port=0, client_key_path=client_key_path, known_hosts_path=tmp / "known_hosts")

    async def handle(process: asyncssh.SSHServerProcess[str]) -> None:
        user = process.get_extra_info("username")
        command = process.command or ""
        state.commands.append((user, command))
        answer = state.answers.get((user, command))
        if answer is None:
            process.stderr.write(f"{command.split(' ')[0]}: command not found\n")
            process.exit(127)
            return
        if answer.drop_first and (user, command) not in state.dropped:
            state.dropped.add((user, command))
            process.get_extra_info("connection").abort()
            return
        if answer.hang:
            await asyncio.sleep(3600)
            return
        if answer.flood:
            block = "x" * 65536 + "\n"
            written = 0
            try:
                while written < answer.flood:
                    process.stdout.write(block)
                    await process.stdout.drain()
                    written += len(block)
            except (BrokenPipeError, asyncssh.Error, ConnectionError):
                return
            process.exit(0)
            return
        process.stdout.write(answer.stdout)
        process.stderr.write(answer.stderr)
        process.exit(answer.status)

    acceptor = await asyncssh.create_server(
        lambda: _Server(state),
        "127.0.0.1",
        0,
        server_host_keys=[host_key],
        authorized_client_keys=authorized,
        process_factory=handle,
    )
    state.server = acceptor
    state.port = acceptor.sockets[0].getsockname()[1]
    state.known_hosts_path.write_text(
        f"[127.0.0.1]:{state.port} {host_key.export_public_key().decode().strip()}\n"
    )
    return state

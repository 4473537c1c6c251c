"""SSH edge: hosts config, bounded commands, timeout and one replay, against a real loopback server."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from fleet_sshd import Answer, FleetSSHServer

from app.errors import InvalidInput
from app.fleet.ssh import CommandFailed, HostConfig, load_hosts, parse_hosts, run_command

SINFO = ["sinfo", "--noheader", "--partition", "compute", "--format", "%c|%m|%G|%l|%s"]


async def test_runs_a_command_and_reads_its_output(ssh_server: FleetSSHServer) -> None:
    ssh_server.answer("lane", SINFO, Answer(stdout="64|512000|(null)|2-00:00:00|1-16\n"))
    result = await run_command(ssh_server.host("lane", "slurm"), SINFO, timeout_seconds=10)
    assert result.checked() == "64|512000|(null)|2-00:00:00|1-16\n"
    assert (result.exit_status, result.attempts) == (0, 1)
    assert ssh_server.commands == [("lane", "sinfo --noheader --partition compute --format '%c|%m|%G|%l|%s'")]


async def test_nonzero_exit_is_an_answer_that_checked_refuses(ssh_server: FleetSSHServer) -> None:
    ssh_server.answer("lane", SINFO, Answer(stderr="sinfo: error: invalid partition\n", status=1))
    result = await run_command(ssh_server.host("lane"), SINFO, timeout_seconds=10)
    assert result.exit_status == 1
    with pytest.raises(CommandFailed, match="exit status 1: sinfo: error: invalid partition"):
        result.checked()


async def test_a_hanging_host_times_out(ssh_server: FleetSSHServer) -> None:
    """The host never answers: the command fails with the timeout it was given. (The outer wait only
    keeps a broken timeout from hanging the suite; it is not a measure of speed.)"""
    ssh_server.answer("slow", ["vq", "broker", "capacity", "--json"], Answer(hang=True))
    with pytest.raises(CommandFailed, match=r"no answer within 0.5 s"):
        await asyncio.wait_for(
            run_command(ssh_server.host("slow"), ["vq", "broker", "capacity", "--json"], timeout_seconds=0.5),
            timeout=120,
        )


async def test_output_beyond_the_bound_is_refused(ssh_server: FleetSSHServer) -> None:
    ssh_server.answer("loud", ["pbsnodes", "-a"], Answer(flood=2_000_000))
    with pytest.raises(CommandFailed, match="output exceeded 100000 bytes"):
        await run_command(
            ssh_server.host("loud"), ["pbsnodes", "-a"], timeout_seconds=10, max_output_bytes=100_000
        )


async def test_one_transport_failure_is_replayed(ssh_server: FleetSSHServer) -> None:
    ssh_server.answer("flaky", ["pbsnodes", "-a"], Answer(stdout="node1\n     np = 2\n", drop_first=True))
    result = await run_command(ssh_server.host("flaky"), ["pbsnodes", "-a"], timeout_seconds=10)
    assert result.attempts == 2
    assert result.checked() == "node1\n     np = 2\n"
    assert ssh_server.connections == ["flaky", "flaky"]


async def test_a_second_transport_failure_is_not_replayed(tmp_path: Path) -> None:
    # Nothing listens on this port: both attempts are refused, then the call fails.
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    host = HostConfig(name="gone", address="127.0.0.1", user="gone", port=port)
    with pytest.raises(CommandFailed, match="after one replay"):
        await run_command(host, ["true"], timeout_seconds=10)


async def test_an_unknown_host_key_is_refused_without_replay(
    ssh_server: FleetSSHServer, tmp_path: Path
) -> None:
    other = tmp_path / "other_known_hosts"
    other.write_text("")
    host = ssh_server.host("lane")
    host = HostConfig(**{**host.__dict__, "known_hosts": other})
    with pytest.raises(CommandFailed, match="ssh to 127.0.0.1"):
        await run_command(host, ["true"], timeout_seconds=10)
    assert ssh_server.connections == []  # key exchange failed before authentication


def test_hosts_file(tmp_path: Path) -> None:
    path = tmp_path / "hosts.toml"
    path.write_text(
        '[hosts.workstation]\naddress = "10.0.0.5"\nuser = "vq"\nkey = "keys/id"\n\n'
        '[hosts.cluster-a]\naddress = "login.example"\nuser = "vq"\nport = 2222\nscheduler = "slurm"\n'
    )
    hosts = load_hosts(path)
    assert hosts["workstation"] == HostConfig("workstation", "10.0.0.5", "vq", 22, tmp_path / "keys/id")
    assert hosts["cluster-a"].port == 2222 and hosts["cluster-a"].scheduler == "slurm"


@pytest.mark.parametrize(
    ("data", "path"),
    [
        ({"hosts": {"a": {"user": "u"}}}, "hosts.a.address"),
        ({"hosts": {"a": {"address": "h"}}}, "hosts.a.user"),
        ({"hosts": {"a": {"address": "h", "user": "u", "port": 0}}}, "hosts.a.port"),
        ({"hosts": {"a": {"address": "h", "user": "u", "port": "22"}}}, "hosts.a.port"),
        ({"hosts": {"a": {"address": "h", "user": "u", "scheduler": "lsf"}}}, "hosts.a.scheduler"),
        ({"hosts": {"a": {"address": "h", "user": "u", "passwd": "x"}}}, "hosts.a.passwd"),
        ({"hosts": {"a": "h"}}, "hosts.a"),
        ({"servers": {}}, "servers"),
    ],
)
def test_bad_hosts_config(data: dict, path: str) -> None:
    with pytest.raises(InvalidInput) as error:
        parse_hosts(data)
    assert error.value.path == path


def test_missing_or_malformed_hosts_file(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput):
        load_hosts(tmp_path / "none.toml")
    (tmp_path / "bad.toml").write_text("[hosts.a\n")
    with pytest.raises(InvalidInput):
        load_hosts(tmp_path / "bad.toml")

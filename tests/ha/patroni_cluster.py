"""A PostgreSQL high-availability cluster of a test's own: one etcd and two Patroni-managed PostgreSQL
instances on free 127.0.0.1 ports in a temporary folder, with synchronous replication
(docs/scaling.md, "High availability with Patroni"). Never the machine's server on 5432, nor a system
etcd or Patroni.

:func:`start_cluster` returns None when ``patroni``, ``etcd`` or the PostgreSQL binaries are missing
(Debian: ``apt-get install patroni etcd-server postgresql``; ``.ci/run`` installs them), else a cluster
whose leader accepts writes and whose other member streams as its synchronous standby.
:meth:`PatroniCluster.destroy` stops everything and removes the folder.

PostgreSQL refuses to run as root, so as root Patroni (which starts PostgreSQL) runs as the ``postgres``
system user, like ``tests/pg_instance.py``. The DCS settings make a crash of the primary a failover
rather than a restart in place (``primary_start_timeout: 0``), and a lost member is noticed within
seconds (``loop_wait: 1``, ``ttl: 20``, the smallest Patroni accepts).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.pg_instance import postgres_bin_dir
from tests.servers import free_port

SCOPE = "bc-test"
# Patroni's custom bootstrap: called with the bin folder, then --scope=... --datadir=...
INITDB = """for arg; do case "$arg" in --datadir=*) data="${arg#--datadir=}";; esac; done
exec "$1/initdb" --nosync --auth=trust --encoding=UTF8 --username=postgres -D "$data"
"""
STARTUP_SECONDS = 90.0  # etcd, the leader's initdb and the standby's base backup, on a loaded machine


def missing() -> str | None:
    """Why no cluster can be started here (None: everything is installed)."""
    lacking = [name for name in ("patroni", "etcd") if shutil.which(name) is None]
    if postgres_bin_dir() is None:
        lacking.append("PostgreSQL binaries (initdb, pg_ctl)")
    if not lacking:
        return None
    return f"{', '.join(lacking)} not installed (Debian: apt-get install patroni etcd-server; .ci/run does)"


@dataclass
class Member:
    """One Patroni-managed PostgreSQL: its name, ports, data folder and the Patroni process."""

    name: str
    port: int
    rest_port: int
    home: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def data(self) -> Path:
        """The member's PostgreSQL data folder."""
        return self.home / "data"

    def rest(self, path: str) -> Any:
        """GET Patroni's REST API ``path``: its JSON answer, or None when it does not answer 2xx."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.rest_port}{path}", timeout=2) as answer:
                return json.loads(answer.read() or b"null")
        except (OSError, ValueError):
            return None

    def postmaster_pid(self) -> int | None:
        """The running postmaster's pid (first line of ``postmaster.pid``), None when it is not running."""
        try:
            pid = int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])
            stat = Path(f"/proc/{pid}/stat").read_text()
        except (OSError, ValueError):
            return None
        # a killed postmaster stays a zombie until init reaps it: not running
        return None if stat.rpartition(")")[2].split()[0] == "Z" else pid

    def log(self) -> str:
        """Patroni's output and PostgreSQL's log so far (for failure messages)."""
        parts = []
        for path in [self.home / "patroni.log", *sorted((self.data / "log").glob("*"))]:
            with contextlib.suppress(OSError):
                parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-6000:]}")
        return "\n".join(parts)


@dataclass
class PatroniCluster:
    """etcd plus two Patroni members in ``home``; ``url`` names both with ``target_session_attrs``."""

    home: Path
    user: str | None  # the system user Patroni and PostgreSQL run as (None: the current user)
    etcd_port: int
    members: list[Member] = field(default_factory=list)
    etcd: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``postgresql://postgres@h1:p1,h2:p2/postgres?target_session_attrs=read-write``."""
        hosts = ",".join(f"127.0.0.1:{m.port}" for m in self.members)
        return f"postgresql://postgres@{hosts}/postgres?target_session_attrs=read-write"

    def roles(self) -> dict[str, str]:
        """Member name -> role (``leader``, ``sync_standby``, ``replica``) from Patroni's ``/cluster``,
        asked of any member that answers; empty when none does."""
        for member in self.members:
            found = member.rest("/cluster")
            if found:
                live = ("running", "streaming")
                return {m["name"]: m["role"] for m in found.get("members", []) if m.get("state") in live}
        return {}

    def leader(self) -> Member | None:
        """The member Patroni's ``/cluster`` names leader, when one runs."""
        roles = self.roles()
        return next((m for m in self.members if roles.get(m.name) == "leader"), None)

    def wait_ready(self, sync_standby: bool = True, timeout: float = STARTUP_SECONDS) -> Member:
        """Wait until a leader accepts writes and (``sync_standby``) another member streams to it as
        its synchronous standby (``pg_stat_replication``, and Patroni's ``/cluster``); the leader."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            roles = self.roles()
            leader = next((m for m in self.members if roles.get(m.name) == "leader"), None)
            if leader is not None and leader.rest("/primary") is not None:
                # Patroni fails a crashed primary over only to a member it has recorded as the sync
                # standby (in etcd), which comes a moment after PostgreSQL reports it streaming in sync
                if not sync_standby or ("sync_standby" in roles.values() and self._sync_streaming(leader)):
                    return leader
            for member in self.members:
                if member.process is not None and member.process.poll() is not None:
                    raise AssertionError(f"patroni {member.name} exited:\n{member.log()}")
            time.sleep(0.3)
        raise AssertionError("no leader with a streaming sync standby in time:\n" + self.logs())

    def _sync_streaming(self, leader: Member) -> bool:
        query = "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming' AND sync_state = 'sync'"
        try:
            out = self.psql(leader, query)
        except subprocess.SubprocessError:
            return False
        return out.strip() == "1"

    def psql(self, member: Member, sql: str) -> str:
        """Run ``sql`` on ``member`` with psql; its unaligned output."""
        command = [str(postgres_bin_dir() / "psql"), "-X", "-At", "-h", "127.0.0.1", "-p", str(member.port)]
        command += ["-U", "postgres", "-d", "postgres", "-c", sql]
        done = subprocess.run(command, capture_output=True, text=True, timeout=10, check=True)
        return done.stdout

    def kill_postmaster(self, member: Member) -> int:
        """``kill -9`` the postmaster of ``member``; returns its pid."""
        pid = member.postmaster_pid()
        assert pid is not None, f"{member.name} runs no postmaster"
        os.kill(pid, signal.SIGKILL)
        return pid

    def logs(self) -> str:
        """Every member's log (for failure messages)."""
        return "\n".join(f"===== {m.name}\n{m.log()}" for m in self.members)

    def destroy(self) -> None:
        """Kill both Patroni and etcd, shut their PostgreSQL down at once (the data is thrown away, so
        nothing needs a clean shutdown), remove the folder."""
        for member in self.members:
            _kill(member.process)
        _kill(self.etcd)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            running = [pid for pid in (m.postmaster_pid() for m in self.members) if pid is not None]
            if not running:
                break
            for pid in running:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGQUIT)  # immediate shutdown: the backends follow
            time.sleep(0.2)
        shutil.rmtree(self.home, ignore_errors=True)


def _kill(process: subprocess.Popen[bytes] | None) -> None:
    """SIGKILL ``process``'s process group (its children too: a pg_basebackup, a pg_rewind)."""
    if process is None or process.poll() is not None:
        return
    with contextlib.suppress(OSError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=10)


def _patroni_config(cluster: PatroniCluster, member: Member) -> dict[str, Any]:
    socket_dir = str(member.home)
    return {
        "scope": SCOPE,
        "namespace": f"/{cluster.home.name}/",  # one folder per cluster: two runs never share keys
        "name": member.name,
        "log": {"level": "INFO"},
        "restapi": {
            "listen": f"127.0.0.1:{member.rest_port}",
            "connect_address": f"127.0.0.1:{member.rest_port}",
        },
        "etcd3": {"hosts": [f"127.0.0.1:{cluster.etcd_port}"]},
        "bootstrap": {
            "dcs": {
                "ttl": 20,
                "loop_wait": 1,
                "retry_timeout": 5,
                "synchronous_mode": True,
                "primary_start_timeout": 0,  # a crashed primary fails over to the sync standby at once
                "maximum_lag_on_failover": 16 * 1024 * 1024,
                "postgresql": {
                    "use_pg_rewind": True,
                    "parameters": {
                        "wal_level": "replica",
                        "hot_standby": "on",
                        "wal_log_hints": "on",
                        "max_wal_senders": 5,
                        "max_replication_slots": 5,
                        "max_connections": 200,
                    },
                },
            },
            # initdb without fsync (Patroni's own initdb refuses --nosync): seconds on a loaded machine
            "method": "fast_initdb",
            "fast_initdb": {"command": f"sh {cluster.home / 'initdb.sh'} {postgres_bin_dir()}"},
        },
        "postgresql": {
            "listen": f"127.0.0.1:{member.port}",
            "connect_address": f"127.0.0.1:{member.port}",
            "data_dir": str(member.data),
            "bin_dir": str(postgres_bin_dir()),
            "pgpass": str(member.home / "pgpass"),
            "basebackup": ["no-sync", {"checkpoint": "fast"}],
            "authentication": {
                "superuser": {"username": "postgres", "password": "postgres"},
                "replication": {"username": "postgres", "password": "postgres"},
                "rewind": {"username": "postgres", "password": "postgres"},
            },
            "pg_hba": [
                "local all all trust",
                "host all all 127.0.0.1/32 trust",
                "host replication all 127.0.0.1/32 trust",
            ],
            "parameters": {"unix_socket_directories": socket_dir, "fsync": "off"},
        },
        "tags": {"nofailover": False, "noloadbalance": False, "clonefrom": False},
    }


def _spawn(command: list[str], log: Path, user: str | None) -> subprocess.Popen[bytes]:
    """Start ``command`` in a session of its own (as ``user``), output to ``log``."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "HOME": str(log.parent)}
    with log.open("wb") as out:
        return subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=log.parent,
            user=user,
            start_new_session=True,
        )


def start_cluster(members: int = 2, sync_standby: bool = True) -> PatroniCluster | None:
    """etcd and ``members`` Patroni members, started and ready: a leader that accepts writes and (with
    ``sync_standby``; else call :meth:`PatroniCluster.wait_ready` later, while the standby is cloned) a
    streaming sync standby. None when the binaries are missing (:func:`missing`)."""
    if missing() is not None:
        return None
    user = "postgres" if os.geteuid() == 0 else None
    home = Path(tempfile.mkdtemp(prefix="bc-patroni-"))
    if user:
        shutil.chown(home, user)
    cluster = PatroniCluster(home, user, free_port())
    try:
        peer_port = free_port()
        (home / "etcd").mkdir()
        etcd = ["etcd", "--name", "etcd0", "--data-dir", str(home / "etcd" / "data")]
        etcd += ["--listen-client-urls", f"http://127.0.0.1:{cluster.etcd_port}"]
        etcd += ["--advertise-client-urls", f"http://127.0.0.1:{cluster.etcd_port}"]
        etcd += ["--listen-peer-urls", f"http://127.0.0.1:{peer_port}"]
        etcd += ["--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}"]
        etcd += ["--initial-cluster", f"etcd0=http://127.0.0.1:{peer_port}", "--log-level", "warn"]
        cluster.etcd = _spawn(etcd, home / "etcd" / "etcd.log", None)
        (home / "initdb.sh").write_text(INITDB)
        _wait_etcd(cluster)
        for i in range(members):
            member = Member(f"pg{i}", free_port(), free_port(), home / f"pg{i}")
            member.home.mkdir(mode=0o700)
            config = member.home / "patroni.yml"
            config.write_text(json.dumps(_patroni_config(cluster, member), indent=1))  # JSON is YAML
            if user:
                shutil.chown(member.home, user)
                shutil.chown(config, user)
            cluster.members.append(member)
        for member in cluster.members:
            member.process = _spawn(
                ["patroni", str(member.home / "patroni.yml")], member.home / "patroni.log", user
            )
        cluster.wait_ready(sync_standby)
        return cluster
    except BaseException:
        cluster.destroy()
        raise


def _wait_etcd(cluster: PatroniCluster) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{cluster.etcd_port}/health", timeout=2) as r:
                if json.loads(r.read()).get("health") == "true":
                    return
        except (OSError, ValueError):
            pass
        assert cluster.etcd is not None
        if cluster.etcd.poll() is not None:
            break
        time.sleep(0.2)
    raise AssertionError(
        "etcd did not start:\n" + (cluster.home / "etcd" / "etcd.log").read_text(errors="replace")
    )

"""The real agent process against a real service process; only the GPU is stood in for (a stand-in
``nvidia-smi`` on PATH printing the H200 host fixture, see ``tests/agent_host.py``)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.agent_host import FIRST_UUID, SECOND_UUID, agent_env, h200_host, write_host, write_stand_in
from tests.conftest import ADMIN_KEY
from tests.servers import REPO, Server, running_server, spawn_server, stop_server, wait_healthy

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
FAST = {"BC_NODE_HEARTBEAT_GRACE": "3", "BC_NODE_LIVENESS_SWEEP_SECONDS": "0.3"}


def wait_for(what: str, check: Callable[[], Any], timeout: float = 20, log: Path | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}\n{log.read_text()[-5000:] if log else ''}")


class AgentProcess:
    def __init__(self, process: subprocess.Popen[bytes], log: Path) -> None:
        self.process, self.log = process, log

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=20)


@contextmanager
def agent(
    server_url: str, pool: str, key: str, tmp: Path, *extra: str, name: str = "h200-a"
) -> Iterator[AgentProcess]:
    log = tmp / f"agent-{time.monotonic_ns()}.log"
    handle = log.open("wb")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "app.cli",
            "agent",
            "--server",
            server_url,
            "--pool",
            pool,
            "--name",
            name,
            "--interval",
            "1s",
            *extra,
        ],
        cwd=REPO,
        env=agent_env(tmp / "bin", tmp / "host", key),
        stdout=handle,
        stderr=subprocess.STDOUT,
    )
    handle.close()
    try:
        yield AgentProcess(process, log)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)


def setup(url: str, tmp: Path, gpus: int = 2) -> tuple[str, str]:
    """A pool, an agent key for it, the stand-in nvidia-smi and the host's outputs."""
    write_stand_in(tmp / "bin")
    write_host(tmp / "host", gpus)
    pool = httpx.post(url + "/v1/pools", json={"name": "agents"}, headers=ADMIN).json()["id"]
    key = httpx.post(
        url + "/v1/api-keys",
        json={
            "principal": "gpu-host",
            "grants": [{"action": "compute:nodes:hello", "resource": f"pool:{pool}"}],
        },
        headers=ADMIN,
    ).json()["key"]
    return pool, key


def node_named(url: str, pool: str, name: str = "h200-a") -> dict[str, Any] | None:
    items = httpx.get(f"{url}/v1/pools/{pool}/nodes", headers=ADMIN).json()["items"]
    for item in items:
        if item["name"] == name:
            return httpx.get(f"{url}/v1/nodes/{item['id']}", headers=ADMIN).json()
    return None


def metric(url: str, name: str, labels: str = "") -> float:
    wanted = f"{name}{{{labels}}}" if labels else name
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(wanted + " "):
            return float(line.split()[1])
    return 0.0


def test_agent_round_trip(database_url: str, clean_db: AsyncEngine, tmp_path: Path) -> None:
    with running_server(database_url, tmp_path / "server", extra_env=FAST) as server:
        url = server.url
        pool, key = setup(url, tmp_path)
        with agent(url, pool, key, tmp_path, "--capability", "binding.kubernetes") as first:
            node = wait_for("the node", lambda: node_named(url, pool), log=first.log)
            assert [d["id"] for d in node["devices"]] == [FIRST_UUID, SECOND_UUID]
            assert node["links"] == [{"a": FIRST_UUID, "b": SECOND_UUID, "link": "NV18"}]
            attrs = node["devices"][0]["attributes"]
            assert (attrs["gpuModel"], attrs["gpuProduct"], attrs["vramGiB"], attrs["numaNode"]) == (
                "H200",
                "H200",
                140,
                0,
            )
            assert node["labels"]["bc.dev/driver.nvidia"] == "580.159.04"
            assert node["labels"]["bc.dev/driver-kind.nvidia.gpu"] == "1"
            assert node["labels"]["bc.dev/cap.binding.kubernetes"] == "1"
            assert {node["labelSources"][k] for k in node["labels"]} == {"system"}
            assert node["agent"]["intervalSeconds"] == 1 and node["resources"]["cpu"]["allocatable"] >= 1

            kube = {
                "tenantId": "acme",
                "poolId": pool,
                "devices": [{"class": "gpu", "count": 2}],
                "duration": "1h",
                "binding": "kubernetes",
                "idempotencyKey": "k8s-1",
            }
            placed = httpx.post(url + "/v1/reservations", json=kube, headers=ADMIN).json()
            assert placed["status"] == "placed", placed

            # a device disappears: the agent sends Hello again and the device becomes unbookable
            lost_before = metric(url, "bc_agent_edges_total", 'edge="atoms_unavailable"')
            write_host(tmp_path / "host", 1)
            gone = wait_for(
                "the second GPU unbookable",
                lambda: (n := node_named(url, pool)) and not n["devices"][1]["bookable"] and n,
                log=first.log,
            )
            assert gone["devices"][1]["id"] == SECOND_UUID and gone["devices"][0]["bookable"]
            assert gone["labels"]["gpu.count"] == "1"
            assert (
                metric(url, "bc_agent_edges_total", 'edge="atoms_unavailable"') >= lost_before + 1
            )  # repair hook
            # BookingRepair: one GPU left on the only node, the 2-GPU reservation goes back to pending
            held = wait_for(
                "the reservation repaired",
                lambda: (
                    (r := httpx.get(f"{url}/v1/reservations/{placed['id']}", headers=ADMIN).json())
                    and r["status"] == "pending"
                    and r
                ),
                log=first.log,
            )
            [repaired] = [c for c in held["conditions"] if c["type"] == "Repaired"]
            assert repaired["oldAtoms"] == [FIRST_UUID, SECOND_UUID] and repaired["newNodeId"] is None
            assert held["conditions"][-1]["message"].startswith("repair: no node fits (1 node): ")

            # the remaining GPU reports a row-remapping failure in the XML: unhealthy
            _, xml = h200_host(1)
            write_host(
                tmp_path / "host", 1, xml=xml.replace("<remapped_row_failure>No", "<remapped_row_failure>Yes")
            )
            sick = wait_for(
                "the GPU unhealthy",
                lambda: (n := node_named(url, pool)) and not n["devices"][0]["healthy"] and n,
            )
            assert sick["devices"][0]["healthReason"] == "row remapping failure"
            assert sick["devices"][1]["healthReason"] == "device left"
            assert not sick["devices"][1]["healthy"]  # the agent reports the missing device unhealthy

            # the host heals (both GPUs back and healthy) and the repaired reservation is released, so
            # that below only the lost heartbeat keeps work off the node
            release = httpx.post(f"{url}/v1/reservations/{placed['id']}/release", headers=ADMIN)
            assert release.status_code == 200, release.text
            write_host(tmp_path / "host", 2)
            wait_for(
                "the host healed",
                lambda: (
                    (n := node_named(url, pool))
                    and all(d["healthy"] and d["bookable"] for d in n["devices"])
                    and not n["noScheduleReasons"]
                ),
                timeout=60,
                log=first.log,
            )
            assert first.stop() == 0  # SIGTERM: a clean exit

        # the sweep marks the node lost once the grace (3 s) has passed without a heartbeat; when is the
        # liveness rule's own test (tests/inventory/test_liveness.py, with a clock passed in), here only
        # that it happens in the running service (wait_for gives up after 20 s)
        lost = wait_for(
            "heartbeat lost", lambda: (n := node_named(url, pool)) and n["noScheduleReasons"] and n
        )
        assert lost["noScheduleReasons"] == ["heartbeat lost"]

        # work asked for while the node is lost waits: the node's GPUs are free, only NoSchedule refuses
        waiting = httpx.post(
            url + "/v1/reservations", json={**kube, "idempotencyKey": "k8s-2"}, headers=ADMIN
        ).json()
        assert waiting["status"] == "pending", waiting
        assert "heartbeat lost" in str(waiting["conditions"]), waiting["conditions"]

        may_fit = metric(url, "bc_agent_edges_total", 'edge="node_may_fit"')
        with agent(url, pool, key, tmp_path, "--capability", "binding.kubernetes") as second:
            back = wait_for(
                "the node back",
                lambda: (
                    (n := node_named(url, pool))
                    and not n["noScheduleReasons"]
                    and n["devices"][1]["bookable"]
                    and all(d["healthy"] for d in n["devices"])  # the first heartbeat after Hello
                    and n
                ),
                log=second.log,
            )
            assert back["devices"][1]["healthReason"] is None
            assert metric(url, "bc_agent_edges_total", 'edge="node_may_fit"') >= may_fit + 1  # the wake hook
            # the restarted agent's heartbeat cleared `heartbeat lost`: a wake edge places the waiting work
            woken = wait_for(
                "the pending reservation placed by the wake",
                lambda: (
                    (r := httpx.get(f"{url}/v1/reservations/{waiting['id']}", headers=ADMIN).json())
                    and r["status"] == "placed"
                    and r
                ),
                timeout=60,
                log=second.log,
            )
            assert {a["nodeId"] for a in woken["allocations"]} == {back["id"]}
            assert [c["reason"] for c in woken["conditions"] if c["type"] == "Scheduled"] == ["Woken"]
            assert second.stop() == 0


@pytest.mark.parametrize("once", [False])
def test_agent_survives_nvidia_smi_failure_and_a_service_restart(
    database_url: str, clean_db: AsyncEngine, tmp_path: Path, once: bool
) -> None:
    server: Server | None = spawn_server(database_url, tmp_path / "server-1.log", FAST)
    assert wait_healthy(server, time.monotonic() + 60), server.output()
    try:
        url = server.url
        pool, key = setup(url, tmp_path, gpus=1)
        (tmp_path / "host" / "fail").write_text("")
        with agent(url, pool, key, tmp_path) as running:
            failed = wait_for("a not-ready node", lambda: node_named(url, pool), log=running.log)
            assert failed["noScheduleReasons"] == ["not ready"] and failed["devices"] == []
            assert "exited 9" in failed["agent"]["error"]
            wait_for("a retry", lambda: running.output().count("nvidia-smi failed") >= 2, log=running.log)

            (tmp_path / "host" / "fail").unlink()
            ready = wait_for(
                "a ready node",
                lambda: (n := node_named(url, pool)) and n["devices"] and not n["noScheduleReasons"] and n,
                log=running.log,
            )
            assert [d["id"] for d in ready["devices"]] == [FIRST_UUID]

            port = server.port
            stop_server(server)
            wait_for(
                "the agent to notice", lambda: "service unavailable" in running.output(), log=running.log
            )
            assert running.process.poll() is None  # still running, retrying
            server = spawn_server(database_url, tmp_path / "server-2.log", FAST, port=port)
            assert wait_healthy(server, time.monotonic() + 60), server.output()
            before = node_named(url, pool)["agent"]["lastHeartbeatAt"]  # type: ignore[index]
            wait_for(
                "a heartbeat to the restarted service",
                lambda: node_named(url, pool)["agent"]["lastHeartbeatAt"] != before,  # type: ignore[index]
                log=running.log,
            )
            assert node_named(url, pool)["noScheduleReasons"] == []  # type: ignore[index]
            assert running.stop() == 0
    finally:
        if server is not None:
            stop_server(server)


def test_agent_once_and_bad_options(database_url: str, clean_db: AsyncEngine, tmp_path: Path) -> None:
    with running_server(database_url, tmp_path / "server") as server:
        pool, key = setup(server.url, tmp_path, gpus=1)
        env = agent_env(tmp_path / "bin", tmp_path / "host", key)
        base = [
            sys.executable,
            "-m",
            "app.cli",
            "agent",
            "--server",
            server.url,
            "--pool",
            pool,
            "--name",
            "once",
        ]
        done = subprocess.run(
            [*base, "--once"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        assert node_named(server.url, pool, "once")["devices"][0]["id"] == FIRST_UUID  # type: ignore[index]
        # a VM's damaged matrix: the agent registers the node and logs the importer's warnings
        damaged = (
            REPO / "tests" / "data" / "damaged" / "13-2x-a100-nv12-5nic-merged-affinity.txt"
        ).read_text()
        (tmp_path / "host" / "topo.txt").write_text(damaged)
        (tmp_path / "host" / "q.xml").write_text(h200_host(2)[1].replace("GPU-00000000-", "GPU-00000009-"))
        vm = [*base[:-1], "vm", "--once"]
        done = subprocess.run(vm, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert "nvidia-smi topo: line 2: row GPU0, column NIC4: 'SY0-31,64-95'" in done.stderr
        assert len(node_named(server.url, pool, "vm")["devices"]) == 2  # type: ignore[index]
        # a GPU with MIG enabled: the driver serves kind mig too, and the agent reads the MIG listing
        topo, xml = h200_host(1)
        mig_xml = xml.replace("<current_mig>Disabled", "<current_mig>Enabled").replace(
            "GPU-00000000-", "GPU-00000008-"
        )
        write_host(tmp_path / "host", 1, xml=mig_xml)
        done = subprocess.run(
            [*base[:-1], "mig", "--once"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        assert "mig -lgip lists 7 GPU instance profile row(s)" in done.stderr
        mig = node_named(server.url, pool, "mig")
        assert mig["labels"]["bc.dev/driver-kind.nvidia.mig"] == "1"  # type: ignore[index]
        bad = subprocess.run(
            [*base, "--once", "--interval", "soon"], cwd=REPO, env=env, capture_output=True, text=True
        )
        assert bad.returncode == 2 and "--interval" in bad.stderr
        env_nokey = {k: v for k, v in env.items() if k != "BC_API_KEY"}
        nokey = subprocess.run([*base, "--once"], cwd=REPO, env=env_nokey, capture_output=True, text=True)
        assert nokey.returncode == 2 and "BC_API_KEY" in nokey.stderr
        wrong = subprocess.run(
            [*base[:-4], "--pool", "pool_other", "--name", "x", "--once"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
        )
        assert wrong.returncode == 1 and "403" in wrong.stderr

"""The node agent's loop: Hello, then a heartbeat every interval, until SIGTERM.

Source rule: docs/agent.md, issue 14. Each round reads the host (:mod:`app.agent.host`):

* Hello (``POST /v1/nodes/hello``) at start, whenever the set of GPU/MIG ids changed since the last
  Hello (a device disappeared or came back: the service marks a device that left unbookable), after the
  service forgot the node (404), and after a failed start once nvidia-smi works again. It carries the
  ``topo -m`` text and ``-q -x`` XML, the NVIDIA driver (``bc.dev/driver.nvidia=<version>``, kinds ``gpu``
  and ``mig`` when a GPU has MIG enabled), the configured capabilities, the host's cpu and memory;
* otherwise a heartbeat (``POST /v1/nodes/{nodeId}/heartbeat``) with every known device's health: a
  device missing from the XML is unhealthy (``device disappeared``), and so is one whose XML reports a
  retired-page or row-remapping failure, an XID error or a pending recovery action.

A failing ``nvidia-smi`` is reported (Hello or heartbeat with ``error``: the node is ``not ready``), not
fatal; the agent tries again with backoff (1 s doubling up to the interval). An unreachable service (or a
5xx answer) is retried with the same backoff. SIGTERM (or SIGINT) ends the loop; the exit code is then 0.
With ``once`` one round is made and the exit code says whether it was delivered (0) or not (1).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

import httpx

from app.agent.host import DISAPPEARED, HostReadError, HostReading, host_resources, read_host

log = logging.getLogger("better_compute.agent")

MIN_BACKOFF = 1.0


@dataclass(frozen=True)
class AgentConfig:
    """``server`` base URL, ``pool`` id, node ``name``, ``interval`` seconds, capabilities, API key."""

    server: str
    pool: str
    name: str
    key: str
    interval: int = 10
    capabilities: tuple[str, ...] = ()
    labels: dict[str, str] = field(default_factory=dict)
    nvidia_smi: str = "nvidia-smi"
    once: bool = False


class ServiceUnavailable(Exception):
    """The service could not be reached or answered 5xx (retried)."""


class Refused(Exception):
    """The service refused the request with a 4xx other than 404 (bad key, bad input)."""


@dataclass
class _State:
    node_id: str | None = None
    hello_ids: frozenset[str] | None = None  # device ids present at the last Hello with inventory
    known: list[str] = field(default_factory=list)  # the node's device ids, as the last Hello answered


class Agent:
    """One agent: ``run()`` loops until ``stop`` is set (or one round with ``config.once``)."""

    def __init__(
        self, config: AgentConfig, stop: threading.Event, client: httpx.Client | None = None
    ) -> None:
        self.config = config
        self.stop = stop
        self.client = client or httpx.Client(
            base_url=config.server.rstrip("/"),
            headers={"Authorization": f"Bearer {config.key}"},
            timeout=30,
        )
        self.state = _State()

    # ---------------------------------------------------------------------------------------- HTTP

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """POST; the answer's JSON, ``None`` for 404; raises ServiceUnavailable / Refused."""
        try:
            response = self.client.post(path, json=body)
        except httpx.HTTPError as exc:
            raise ServiceUnavailable(f"{self.config.server}: {type(exc).__name__}: {exc}") from None
        if response.status_code == 404:
            return None
        if response.status_code >= 500:
            raise ServiceUnavailable(f"{path}: {response.status_code} {response.text[:200]}")
        if response.status_code >= 400:
            raise Refused(f"{path}: {response.status_code} {response.text[:500]}")
        return response.json()

    def hello(self, reading: HostReading | None, error: str | None) -> None:
        """Send Hello (with the host's inventory when ``reading`` has its topology)."""
        body: dict[str, Any] = {
            "poolId": self.config.pool,
            "name": self.config.name,
            "capabilities": list(self.config.capabilities),
            "labels": dict(self.config.labels),
            "intervalSeconds": self.config.interval,
            "resources": host_resources(),
        }
        if reading is not None and reading.topo is not None:
            body["topo"] = reading.topo
            body["nvidiaSmiXml"] = reading.xml
            kinds = ["gpu"] + (["mig"] if any(g.mig_enabled for g in reading.log.gpus) else [])
            if reading.log.driver_version:
                body["drivers"] = [{"id": "nvidia", "version": reading.log.driver_version, "kinds": kinds}]
        if error is not None:
            body["error"] = error
        answer = self._post("/v1/nodes/hello", body)
        if answer is None:
            raise Refused(f"pool {self.config.pool} not found")
        for warning in answer.get("warnings", []):
            log.warning("nvidia-smi topo: %s", warning)
        if reading is not None and reading.mig_listing:
            profiles = sum(1 for line in reading.mig_listing.splitlines() if " MIG " in line)
            log.info("MIG enabled: nvidia-smi mig -lgip lists %d GPU instance profile row(s)", profiles)
        self.state.node_id = answer["nodeId"]
        self.state.known = [d["id"] for d in answer["devices"]]
        self.state.hello_ids = (
            reading.device_ids if reading is not None and reading.topo is not None else None
        )
        log.info(
            "hello: node %s (%s), %d device(s), reasons %s",
            answer["nodeId"],
            "created" if answer["created"] else "changed" if answer["inventoryChanged"] else "unchanged",
            len(answer["devices"]),
            answer["noScheduleReasons"] or "none",
        )

    def heartbeat(self, reading: HostReading | None, error: str | None) -> bool:
        """Send a heartbeat; False when the service no longer knows the node (send Hello again)."""
        devices = []
        if reading is not None:
            for device_id in self.state.known:
                problems = reading.problems.get(device_id)
                if problems is None:
                    devices.append({"id": device_id, "healthy": False, "reason": DISAPPEARED})
                elif problems:
                    devices.append({"id": device_id, "healthy": False, "reason": "; ".join(problems)[:256]})
                else:
                    devices.append({"id": device_id, "healthy": True})
        body: dict[str, Any] = {"devices": devices}
        if error is not None:
            body["error"] = error
        answer = self._post(f"/v1/nodes/{self.state.node_id}/heartbeat", body)
        if answer is None:
            log.warning(
                "heartbeat: the service does not know node %s; sending Hello again", self.state.node_id
            )
            self.state = _State()
            return False
        if answer["changed"]:
            unhealthy = [f"{d['id']} ({d['reason']})" for d in devices if not d["healthy"]]
            log.info("heartbeat: changed; unhealthy: %s", ", ".join(unhealthy) or "none")
        return True

    # ---------------------------------------------------------------------------------------- loop

    def round(self) -> bool:
        """One round: read the host, send Hello or a heartbeat. True when nvidia-smi worked.
        Raises ServiceUnavailable / Refused."""
        need_hello = self.state.node_id is None or self.state.hello_ids is None
        reading: HostReading | None
        error: str | None = None
        try:
            reading = read_host(self.config.nvidia_smi, with_topo=need_hello)
            if not need_hello and reading.device_ids != self.state.hello_ids:
                log.warning("devices changed (%d now); sending Hello", len(reading.device_ids))
                reading = read_host(self.config.nvidia_smi, with_topo=True)
                need_hello = True
        except HostReadError as exc:
            reading, error = None, str(exc)
            log.error("nvidia-smi failed (reported, retrying with backoff): %s", error)
        if need_hello and (reading is not None or self.state.node_id is None):
            self.hello(reading, error)
        elif not self.heartbeat(reading, error):
            return self.round()
        return error is None

    def run(self) -> int:
        """Loop until SIGTERM (``stop``); 0 on a clean stop. With ``once``: one round, 0 when delivered."""
        backoff = MIN_BACKOFF
        while not self.stop.is_set():
            try:
                healthy = self.round()
            except ServiceUnavailable as exc:
                if self.config.once:
                    log.error("service unavailable: %s", exc)
                    return 1
                log.warning("service unavailable (retrying in %.0f s): %s", backoff, exc)
                self.stop.wait(backoff)
                backoff = min(backoff * 2, self.config.interval)
                continue
            except Refused as exc:
                log.error("refused: %s", exc)
                if self.config.once:
                    return 1
                self.stop.wait(self.config.interval)
                continue
            if self.config.once:
                return 0
            if healthy:
                backoff = MIN_BACKOFF
                self.stop.wait(self.config.interval)
            else:
                self.stop.wait(backoff)
                backoff = min(backoff * 2, self.config.interval)
        log.info("stopping")
        return 0

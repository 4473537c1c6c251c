"""What the agent reads on its GPU host: ``nvidia-smi`` outputs, the CPU count and memory size.

The only I/O of the agent besides HTTP: running ``nvidia-smi topo -m``, ``nvidia-smi -q -x`` and, where a
GPU has MIG enabled, ``nvidia-smi mig -lgip``; reading ``/proc/meminfo``. Parsing is the project's own
importer (:mod:`app.inventory.nvsmi_xml`); the service parses the topology again from the same text.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from app.errors import InvalidInput
from app.inventory.nvsmi_xml import NvidiaSmiLog, parse_nvidia_smi_log

NVIDIA_SMI_TIMEOUT = 60.0  # seconds; a hung driver call is a failure, not a hung agent
DISAPPEARED = "device disappeared"


class HostReadError(Exception):
    """``nvidia-smi`` failed (missing, non-zero exit, timeout, unreadable output); the message says how."""


@dataclass(frozen=True)
class HostReading:
    """One look at the host: the ``topo -m`` text (``None`` when only the XML was read, for a heartbeat),
    the ``-q -x`` XML and its parse, and the MIG profile listing when a GPU has MIG enabled."""

    xml: str
    log: NvidiaSmiLog
    topo: str | None = None
    mig_listing: str | None = None
    problems: dict[str, tuple[str, ...]] = field(default_factory=dict)  # device id -> health problems

    @property
    def device_ids(self) -> frozenset[str]:
        """GPU UUIDs and MIG device ids present now."""
        return frozenset(self.problems)


def run_nvidia_smi(args: list[str], binary: str = "nvidia-smi") -> str:
    """``nvidia-smi <args>``'s standard output; raises :class:`HostReadError` for any failure."""
    try:
        done = subprocess.run(
            [binary, *args], capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT, check=False
        )
    except FileNotFoundError:
        raise HostReadError(f"{binary} not found on PATH") from None
    except subprocess.TimeoutExpired:
        raise HostReadError(f"{binary} {' '.join(args)} timed out after {NVIDIA_SMI_TIMEOUT:.0f} s") from None
    except OSError as exc:
        raise HostReadError(f"{binary} {' '.join(args)}: {exc}") from None
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()
        raise HostReadError(
            f"{binary} {' '.join(args)} exited {done.returncode}: {detail[0] if detail else 'no output'}"[
                :2000
            ]
        )
    return done.stdout


def read_host(binary: str = "nvidia-smi", *, with_topo: bool) -> HostReading:
    """Read the host (``topo -m`` too when ``with_topo``); raises :class:`HostReadError`."""
    xml = run_nvidia_smi(["-q", "-x"], binary)
    try:
        log = parse_nvidia_smi_log(xml)
    except InvalidInput as exc:
        raise HostReadError(exc.message) from None
    problems: dict[str, tuple[str, ...]] = {}
    for gpu in log.gpus:
        problems[gpu.uuid] = gpu.health_problems
        for mig in gpu.mig_devices:
            problems[mig.id] = gpu.health_problems
    topo = run_nvidia_smi(["topo", "-m"], binary) if with_topo else None
    mig_listing = None
    if with_topo and any(g.mig_enabled for g in log.gpus):
        mig_listing = run_nvidia_smi(["mig", "-lgip"], binary)
    return HostReading(xml=xml, log=log, topo=topo, mig_listing=mig_listing, problems=problems)


def host_resources(meminfo: Path = Path("/proc/meminfo")) -> dict[str, dict[str, int]]:
    """``{"cpu": {"allocatable": cores}, "memory": {"allocatable": MiB}}`` of this host (what is known)."""
    out: dict[str, dict[str, int]] = {}
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if cpus:
        out["cpu"] = {"allocatable": cpus}
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                out["memory"] = {"allocatable": int(line.split()[1]) // 1024}  # kB -> MiB
                break
    except (OSError, ValueError, IndexError):
        pass
    return out

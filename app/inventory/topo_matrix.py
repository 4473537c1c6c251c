"""The parsed ``nvidia-smi topo -m`` matrix (:class:`TopoMatrix`) and the Linux CPU/NUMA lists its
affinity columns hold. Pure values; the parser that builds them is :mod:`app.inventory.topo`."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from app.errors import quote_input

__all__ = [
    "CPU_AFFINITY",
    "GPU_NUMA_ID",
    "NUMA_AFFINITY",
    "TRAILING_LABELS",
    "TopoMatrix",
    "cpu_list_count",
    "parse_cpu_list",
]

CPU_AFFINITY = "CPU Affinity"
NUMA_AFFINITY = "NUMA Affinity"
GPU_NUMA_ID = "GPU NUMA ID"
TRAILING_LABELS: tuple[str, ...] = (CPU_AFFINITY, NUMA_AFFINITY, GPU_NUMA_ID)

_CPU_LIST_RE = re.compile(r"\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*")
_NV_RE = re.compile(r"NV(\d+)")


@dataclass(frozen=True)
class TopoMatrix:
    """One ``nvidia-smi topo -m`` matrix.

    Fields:
      * ``gpus``: GPU column names in printed order (``GPU0``, ``GPU1``, ...).
      * ``nics``: NIC column names in printed order, as printed (``NIC0`` or ``mlx5_2``; not re-sorted).
      * ``nic_legend``: ``NIC<n>`` -> device name from the ``NIC Legend:`` block (empty without one).
      * ``gpu_links``: ``(a, b)`` -> link text for GPU pairs, ``a`` printed before ``b``; read from row ``a``.
      * ``gpu_nic_links``: ``(gpu, nic)`` -> link text, read from the GPU's row.
      * ``nic_nic_links``: ``(a, b)`` -> link text for NIC pairs, ``a`` printed before ``b``.
      * ``cpu_affinity``: GPU -> the CPU list as printed (``"0-19,40-59"``; ``""`` when the cell is empty;
        ``None`` when the column is absent or ``N/A``).
      * ``numa_affinity``: GPU -> NUMA node ids (``[3]``, or ``[0, 1]`` for ``0-1``), ``None`` when the column
        is absent or ``N/A``.
      * ``gpu_numa_id``: GPU -> the GPU's own NUMA id (``None`` for ``N/A``); the whole field is ``None`` when
        the driver prints no ``GPU NUMA ID`` column.
      * ``legend``: kind -> description from the ``Legend:`` block (``{"X": "Self", "SOC": ...}``), empty
        when absent.
      * ``layout``: ``"tab"`` when the matrix rows are TAB-separated, ``"space"`` for a terminal copy.
      * ``asymmetric_pairs``: device pairs whose two cells differ (the row of the first-printed device wins).
      * ``warnings``: malformed cells outside the GPU x GPU block that were left out (``"line <n>: ..."``).
    """

    gpus: tuple[str, ...]
    nics: tuple[str, ...] = ()
    nic_legend: dict[str, str] = field(default_factory=dict)
    gpu_links: dict[tuple[str, str], str] = field(default_factory=dict)
    gpu_nic_links: dict[tuple[str, str], str] = field(default_factory=dict)
    nic_nic_links: dict[tuple[str, str], str] = field(default_factory=dict)
    cpu_affinity: dict[str, str | None] = field(default_factory=dict)
    numa_affinity: dict[str, list[int] | None] = field(default_factory=dict)
    gpu_numa_id: dict[str, int | None] | None = None
    legend: dict[str, str] = field(default_factory=dict)
    layout: Literal["tab", "space"] = "tab"
    asymmetric_pairs: tuple[tuple[str, str], ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def gpu_count(self) -> int:
        """Number of GPU rows."""
        return len(self.gpus)

    @property
    def nvlink_counts(self) -> dict[tuple[str, str], int]:
        """``(a, b)`` -> number of bonded NVLinks for GPU pairs linked by ``NV<n>`` (other pairs omitted)."""
        out: dict[tuple[str, str], int] = {}
        for pair, link in self.gpu_links.items():
            m = _NV_RE.fullmatch(link)
            if m:
                out[pair] = int(m.group(1))
        return out

    @property
    def cpu_affinity_count(self) -> dict[str, int | None]:
        """GPU -> number of CPUs in its CPU Affinity list (0 for an empty cell, ``None`` when unknown)."""
        return {g: (None if v is None else cpu_list_count(v)) for g, v in self.cpu_affinity.items()}

    def gpu_link(self, a: str, b: str) -> str | None:
        """The link text between GPUs ``a`` and ``b`` in either order (``"X"`` when equal), or ``None``."""
        if a == b:
            return "X" if a in self.gpus else None
        return self.gpu_links.get((a, b)) or self.gpu_links.get((b, a))

    def numa_node(self, gpu: str) -> int | None:
        """The GPU's NUMA node for placement: its ``NUMA Affinity`` when that names exactly one node, else its
        ``GPU NUMA ID`` when printed, else ``None``."""
        aff = self.numa_affinity.get(gpu)
        if aff is not None and len(aff) == 1:
            return aff[0]
        if self.gpu_numa_id is not None:
            return self.gpu_numa_id.get(gpu)
        return None


def parse_cpu_list(text: str) -> list[int]:
    """Expand a Linux CPU/NUMA list (``"0-19,40-59"``, ``"3"``, ``""``) into sorted, distinct ids.

    Raises ``ValueError`` for anything else (including ``N/A``; callers decide what that means).
    """
    text = text.strip()
    if not text:
        return []
    if not _CPU_LIST_RE.fullmatch(text):
        raise ValueError(f"not a CPU list: {quote_input(text)}")
    ids: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        first, last = int(lo), int(hi or lo)
        if last < first:
            raise ValueError(f"descending range {quote_input(part)}")
        ids.update(range(first, last + 1))
    return sorted(ids)


def cpu_list_count(text: str) -> int:
    """Number of CPUs in a Linux CPU list such as ``"0-19,40-59"`` (40); ``""`` is 0.

    Raises ``ValueError`` when ``text`` is not a CPU list.
    """
    return len(parse_cpu_list(text))

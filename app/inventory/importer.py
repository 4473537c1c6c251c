"""Build a node's atoms, links and system labels from ``nvidia-smi topo -m`` (+ optional ``-q -x``) text.

Pure: text in, :class:`ImportedNode` out. The inventory service stores the result (devices, device links,
labels with source ``system``); see ``docs/inventory-import.md``.

Source rule (docs/api.md, "HTTP API" and issue 2): an imported node without XML names its atoms
``<node name>-GPU<i>``; with XML they take the GPU UUIDs, matched to the matrix rows by NVML index order
(the XML's GPUs sorted by PCI bus id, which is how ``topo -m`` numbers ``GPU<i>``). Links are stored only
between GPU atoms, in the text nvidia-smi printed, except the 2015-16 ``SOC`` which is stored as its
successor ``SYS``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from app.errors import InvalidInput, quote_input
from app.inventory.nvsmi_xml import XML_PATH, GpuInfo, parse_nvidia_smi_log
from app.inventory.topo import parse_topo_matrix
from app.inventory.topo_matrix import TopoMatrix

__all__ = [
    "LINK_RANK",
    "ImportedDevice",
    "ImportedNode",
    "build_imported_node",
    "gpu_model",
    "gpu_product",
    "link_rank",
    "normalize_link",
]

# Best first, as docs/architecture.md's topology scorer and the seed rank them (NV > PIX > PXB > PHB > NODE
# > SYS).
LINK_RANK: tuple[str, ...] = ("NV", "PIX", "PXB", "PHB", "NODE", "SYS")
_NV_RE = re.compile(r"NV\d+")
_ATOM_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]*")
_SELECTOR_UNSAFE = re.compile(r"[\s,()=!<>]+")


@dataclass(frozen=True)
class ImportedDevice:
    """One atom of an imported node.

    ``id`` is the GPU UUID (``GPU-...``), a MIG device id (``MIG-...``) or ``<node name>-GPU<i>`` without
    XML; ``device_class`` is ``gpu`` for whole GPUs and ``mig`` for MIG devices; ``attributes`` are the
    selector-visible facts (see ``docs/inventory-import.md``); ``numa_node`` is the NUMA node closest to the
    GPU; ``parent`` names the GPU of a MIG device; ``bookable`` is False for a GPU whose MIG devices are
    listed (its capacity is handed out as those devices).
    """

    id: str
    device_class: str = "gpu"
    attributes: dict[str, Any] = field(default_factory=dict)
    numa_node: int | None = None
    parent: str | None = None
    bookable: bool = True


@dataclass(frozen=True)
class ImportedNode:
    """An imported node: ``devices`` (GPUs in ``GPU<i>`` order, each followed by its MIG devices),
    ``links`` (``(a, b, link)`` with ``a < b`` between GPU atoms, sorted), ``labels`` (system labels:
    ``gpu.count`` always; ``gpu.product``, ``mig.capable``, ``cuda.driver.major`` when the XML says),
    the parsed ``topo`` matrix and XML ``gpus`` for callers that want more, and ``warnings``: malformed cells
    outside the GPU x GPU block that were left out (:attr:`TopoMatrix.warnings`)."""

    name: str
    devices: list[ImportedDevice]
    links: list[tuple[str, str, str]]
    labels: dict[str, str]
    topo: TopoMatrix
    gpus: list[GpuInfo] = field(default_factory=list)
    driver_version: str | None = None
    warnings: tuple[str, ...] = ()


def normalize_link(link: str) -> str:
    """The link text to store: as printed, except the legacy ``SOC`` (socket-level link), which is ``SYS``."""
    return "SYS" if link == "SOC" else link


def link_rank(link: str) -> int:
    """Rank of a link text, 0 best: ``NV#`` 0, ``PIX`` 1, ``PXB`` 2, ``PHB`` 3, ``NODE`` 4, ``SYS``/``SOC`` 5,
    anything else 6 (unknown links rank below SYS)."""
    link = normalize_link(link)
    if _NV_RE.fullmatch(link):
        return 0
    return LINK_RANK.index(link) if link in LINK_RANK else len(LINK_RANK)


def gpu_product(product_name: str) -> str:
    """The ``gpuProduct`` attribute: the product name without a leading ``NVIDIA `` and with runs of spaces
    (and the selector's reserved characters ``,()=!<>``) replaced by ``-``.

    ``"NVIDIA H200"`` -> ``"H200"``, ``"NVIDIA A100-SXM4-80GB"`` -> ``"A100-SXM4-80GB"``,
    ``"NVIDIA GeForce RTX 4090"`` -> ``"GeForce-RTX-4090"``, ``"Tesla V100-SXM2-32GB"`` unchanged but for
    the space.
    """
    name = " ".join(product_name.split())
    if name.startswith("NVIDIA "):
        name = name[len("NVIDIA ") :]
    return _SELECTOR_UNSAFE.sub("-", name).strip("-")


_VENDOR_WORDS = frozenset({"NVIDIA", "TESLA", "GEFORCE", "QUADRO"})
_SERIES_WORDS = frozenset({"RTX", "GTX", "TITAN"})


def gpu_model(product_name: str) -> str:
    """The ``gpuModel`` attribute: the GPU's model without vendor, form factor or memory size.

    The first word (split on spaces and ``-``) that holds a digit, after the vendor words ``NVIDIA``,
    ``Tesla``, ``GeForce``, ``Quadro``; a bare number keeps the series word before it. ``""`` when no word
    holds a digit. ``"NVIDIA H100 80GB HBM3"`` -> ``"H100"``, ``"NVIDIA H200"`` -> ``"H200"``,
    ``"NVIDIA A100-SXM4-80GB"`` -> ``"A100"``, ``"Tesla V100-SXM2-32GB"`` -> ``"V100"``,
    ``"NVIDIA GeForce RTX 4090"`` -> ``"RTX-4090"``, ``"NVIDIA RTX A6000"`` -> ``"A6000"``.
    """
    words = [w for w in re.split(r"[\s\-]+", product_name) if w and w.upper() not in _VENDOR_WORDS]
    for i, word in enumerate(words):
        if any(c.isdigit() for c in word):
            if word.isdigit() and i > 0 and words[i - 1].upper() in _SERIES_WORDS:
                word = f"{words[i - 1]}-{word}"
            return _SELECTOR_UNSAFE.sub("-", word).strip("-")
    return ""


def _driver_major(version: str | None) -> str | None:
    m = re.match(r"(\d+)", version or "")
    return m.group(1) if m else None


def build_imported_node(name: str, topo_text: str, xml_text: str | None = None) -> ImportedNode:
    """Turn ``nvidia-smi topo -m`` text (and optionally ``nvidia-smi -q -x`` XML) into an ImportedNode.

    Without XML: atoms ``<name>-GPU<i>`` with ``attributes = {"numaNode": n}`` when the matrix knows it.
    With XML: atoms named by GPU UUID with ``gpuProduct``, ``gpuModel`` (``"H100"``, :func:`gpu_model`),
    ``vramGiB`` (int GiB), ``computeCapability`` (``"9.0"``), ``architecture``, ``migCapable`` (bool),
    ``numaNode`` (int, XML first, else the matrix's NUMA Affinity, else its GPU NUMA ID); a GPU with MIG
    enabled also gets ``migEnabled`` and its MIG devices become ``mig`` atoms with ``parent`` = the GPU UUID.
    Labels: ``gpu.count``; with XML also ``gpu.product`` and ``gpu.model`` (when all GPUs share one),
    ``mig.capable`` (``true`` when every GPU is) and ``cuda.driver.major`` (``580`` from ``580.159.04``).
    Malformed topo cells outside the GPU x GPU block are left out and listed in ``warnings``.

    Raises :class:`app.errors.InvalidInput`: ``path="name"`` for an empty name (or, without XML, one that
    cannot start an atom id: letters, digits, ``._:-``, at most 128 characters with the suffix);
    ``path="topo"`` for a bad matrix (see :func:`parse_topo_matrix`); ``path="nvidiaSmiXml"`` for bad XML
    or when its GPU count differs from the matrix's.
    """
    if not isinstance(name, str) or not name.strip():
        raise InvalidInput("node name must be a non-empty string", path="name")
    name = name.strip()
    matrix = parse_topo_matrix(topo_text)
    labels: dict[str, str] = {"gpu.count": str(matrix.gpu_count)}
    log = None
    gpus: list[GpuInfo] = []
    if xml_text is not None:
        log = parse_nvidia_smi_log(xml_text)
        gpus = list(log.gpus)
        if len(gpus) != matrix.gpu_count:
            raise InvalidInput(
                f"nvidia-smi -q -x lists {len(gpus)} GPUs but the topo matrix has {matrix.gpu_count}",
                path=XML_PATH,
            )
        labels.update(_xml_labels(gpus, log.driver_version))
    devices: list[ImportedDevice] = []
    atom_of: dict[str, str] = {}
    for i, gpu_name in enumerate(matrix.gpus):
        topo_numa = matrix.numa_node(gpu_name)
        gpu_devices = _xml_devices(gpus[i], topo_numa) if gpus else [_topo_device(name, gpu_name, topo_numa)]
        devices += gpu_devices
        atom_of[gpu_name] = gpu_devices[0].id
    ids = [d.id for d in devices]
    if len(set(ids)) != len(ids):
        raise InvalidInput("device ids are not unique", path=XML_PATH if gpus else "name")
    return ImportedNode(
        name=name,
        devices=devices,
        links=_links(matrix, atom_of),
        labels=labels,
        topo=matrix,
        gpus=gpus,
        driver_version=log.driver_version if log is not None else None,
        warnings=matrix.warnings,
    )


def _xml_labels(gpus: list[GpuInfo], driver_version: str | None) -> dict[str, str]:
    """The labels the XML establishes: ``gpu.product`` and ``gpu.model`` when every GPU shares one,
    ``mig.capable`` and ``cuda.driver.major``."""
    labels: dict[str, str] = {}
    products = {gpu_product(g.product_name) for g in gpus}
    if len(products) == 1 and "" not in products:
        labels["gpu.product"] = products.pop()
    models = {gpu_model(g.product_name) for g in gpus}
    if len(models) == 1 and "" not in models:
        labels["gpu.model"] = models.pop()
    labels["mig.capable"] = "true" if all(g.mig_capable for g in gpus) else "false"
    major = _driver_major(driver_version)
    if major is not None:
        labels["cuda.driver.major"] = major
    return labels


def _topo_device(name: str, gpu_name: str, topo_numa: int | None) -> ImportedDevice:
    """A GPU known from the matrix alone: atom ``<name>-GPU<i>`` with its NUMA node when known."""
    atom = f"{name}-{gpu_name}"
    if not _ATOM_ID_RE.fullmatch(atom) or len(atom) > 128:
        raise InvalidInput(
            f"node name {quote_input(name)} cannot name atoms (<name>-GPU<i>): use letters, digits, . _ : -",
            path="name",
        )
    attrs: dict[str, Any] = {} if topo_numa is None else {"numaNode": topo_numa}
    return ImportedDevice(id=atom, attributes=attrs, numa_node=topo_numa)


def _xml_devices(info: GpuInfo, topo_numa: int | None) -> list[ImportedDevice]:
    """A GPU the XML describes (first, named by its UUID; not bookable when it has MIG devices), then
    its MIG devices as ``mig`` atoms whose parent is the GPU. NUMA: the XML's, else the matrix's."""
    numa = info.numa_node if info.numa_node is not None else topo_numa
    attrs: dict[str, Any] = {
        "gpuProduct": gpu_product(info.product_name),
        "gpuModel": gpu_model(info.product_name),
        "vramGiB": info.vram_gib,
        "computeCapability": info.compute_capability,
        "architecture": info.architecture,
        "migCapable": info.mig_capable,
        "numaNode": numa,
    }
    if info.mig_enabled:
        attrs["migEnabled"] = True
    attrs = {k: v for k, v in attrs.items() if v is not None and v != ""}
    devices = [ImportedDevice(id=info.uuid, attributes=attrs, numa_node=numa, bookable=not info.mig_devices)]
    for mig in info.mig_devices:
        mig_attrs: dict[str, Any] = {
            "gpuProduct": attrs.get("gpuProduct"),
            "gpuModel": attrs.get("gpuModel"),
            "vramGiB": mig.vram_gib,
            "computeCapability": info.compute_capability,
            "architecture": info.architecture,
            "numaNode": numa,
            "migGpuInstanceId": mig.gpu_instance_id,
            "migComputeInstanceId": mig.compute_instance_id,
            "multiprocessorCount": mig.multiprocessor_count,
        }
        devices.append(
            ImportedDevice(
                id=mig.id,
                device_class="mig",
                attributes={k: v for k, v in mig_attrs.items() if v is not None},
                numa_node=numa,
                parent=info.uuid,
            )
        )
    return devices


def _links(matrix: TopoMatrix, atom_of: dict[str, str]) -> list[tuple[str, str, str]]:
    """The GPU-GPU links as sorted ``(atom, atom, normalized kind)``; a kind the topology scorer cannot
    rank (e.g. ``NV9X``) is refused (``path="topo"``)."""
    links: list[tuple[str, str, str]] = []
    for (a, b), link in matrix.gpu_links.items():
        if link_rank(link) == len(LINK_RANK):
            raise InvalidInput(
                f"nvidia-smi topo: {a}-{b} link {link!r} is not one of NV#, PIX, PXB, PHB, NODE, SYS, SOC",
                path="topo",
                details={"pair": [a, b]},
            )
        x, y = sorted((atom_of[a], atom_of[b]))
        links.append((x, y, normalize_link(link)))
    return sorted(links)

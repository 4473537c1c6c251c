"""Read GPU facts from ``nvidia-smi -q -x`` (the ``nvidia_smi_log`` XML document).

Source rule: the element names of ``nvidia-smi -q -x`` as drivers print them (``nvsmi_device_v*.dtd``; the
real H200 host in ``tests/data/h200-host/`` is the reference sample): ``<gpu id=PCI>`` with
``product_name``, ``product_architecture``, ``uuid``, ``minor_number``, ``pci/pci_bus_id``,
``fb_memory_usage/total`` (``"143771 MiB"``), ``mig_mode/current_mig`` and ``pending_mig``
(``Enabled``/``Disabled``/``N/A``) and ``mig_devices/mig_device`` (``index``, ``gpu_instance_id``,
``compute_instance_id``, ``fb_memory_usage/total``, ``device_attributes/shared/multiprocessor_count``,
``uuid`` on drivers that print it). The document-level ``driver_version`` and ``cuda_version`` are copied
onto every GPU.

Compute capability: nvidia-smi's XML usually carries none (the 580 driver's does not), so unless a
``compute_cap``/``cuda_compute_capability``/``compute_capability`` element is present it is derived from
the architecture with :data:`ARCHITECTURE_COMPUTE_CAPABILITY` (the CUDA programming guide's table):

==============  ==========================================================================
Architecture    Compute capability
==============  ==========================================================================
Kepler          3.7 for K80, else 3.5
Maxwell         5.2
Pascal          6.0 for P100, else 6.1
Volta           7.0
Turing          7.5
Ampere          8.0 for the GA100 parts (A100, A800, A30), else 8.6 (GA10x: A10, A40, RTX 30xx, ...)
Ada Lovelace    8.9
Hopper          9.0 (H100, H200, H800, GH200)
Blackwell       10.0 (B100, B200, GB200); 10.3 (B300, GB300); 12.0 for RTX parts; 12.1 for GB10
==============  ==========================================================================

Security: ``xml.etree`` does not fetch external entities or DTDs (the ``<!DOCTYPE ... SYSTEM "...dtd">``
line real output carries is harmless), but it does expand internal entities, so a document that declares
any ``<!ENTITY`` is refused. Errors raise :class:`app.errors.InvalidInput` with ``path="nvidiaSmiXml"``.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import Literal

from app.errors import InvalidInput, quote_input

__all__ = [
    "ARCHITECTURE_COMPUTE_CAPABILITY",
    "GpuInfo",
    "MigDeviceInfo",
    "NvidiaSmiLog",
    "derive_compute_capability",
    "gpu_health_problems",
    "mib_to_gib",
    "parse_nvidia_smi_log",
    "parse_nvidia_smi_xml",
]

XML_PATH = "nvidiaSmiXml"

# Default compute capability per architecture name as nvidia-smi prints it; per-product exceptions are in
# derive_compute_capability().
ARCHITECTURE_COMPUTE_CAPABILITY: dict[str, str] = {
    "Kepler": "3.5",
    "Maxwell": "5.2",
    "Pascal": "6.1",
    "Volta": "7.0",
    "Turing": "7.5",
    "Ampere": "8.6",
    "Ada Lovelace": "8.9",
    "Hopper": "9.0",
    "Blackwell": "10.0",
}

_NA = {"", "N/A", "NA", "NONE", "[N/A]", "NOT AVAILABLE", "[NOT SUPPORTED]", "NOT SUPPORTED"}
_MIB_RE = re.compile(r"(\d+(?:\.\d+)?)\s*(MiB|GiB|KiB|B)?", re.IGNORECASE)
_CC_RE = re.compile(r"\d{1,2}\.\d")


@dataclass(frozen=True)
class MigDeviceInfo:
    """One MIG device (GPU instance + compute instance) of a GPU.

    ``id`` is the MIG UUID when the driver prints one, else the legacy form ``MIG-<gpu uuid>/<gi>/<ci>``
    (which CUDA_VISIBLE_DEVICES also accepts). Memory in MiB as printed; ``vram_gib`` rounded to the
    nearest GiB (half up).
    """

    id: str
    index: int | None
    gpu_instance_id: int | None
    compute_instance_id: int | None
    memory_total_mib: int | None
    vram_gib: int | None
    multiprocessor_count: int | None


@dataclass(frozen=True)
class GpuInfo:
    """What one ``<gpu>`` element says.

    * ``uuid`` (``GPU-...``), ``product_name`` as printed (``"NVIDIA H200"``), ``architecture``
      (``"Hopper"``, ``None`` when absent).
    * ``memory_total_mib`` from ``fb_memory_usage/total``; ``vram_gib`` = MiB / 1024 rounded half up (143771
      MiB -> 140).
    * ``compute_capability`` (``"9.0"``) and where it came from: ``"xml"`` or ``"architecture"``
      (see the module table), ``None`` when neither knows.
    * ``mig_capable``: ``current_mig`` or ``pending_mig`` is present and not ``N/A``; ``mig_mode`` is the
      printed ``current_mig`` (``"Enabled"``/``"Disabled"``/``None``); ``mig_enabled`` is it being Enabled.
    * ``numa_node`` when the XML names one (``numa_id``/``numa_node``/``gpu_numa_id``), else ``None`` (the
      importer then takes it from the topology matrix).
    * ``pci_bus_id`` (``"00000000:00:06.0"``), ``minor_number`` (``/dev/nvidia<N>``), ``mig_devices``.
    * ``driver_version`` and ``cuda_version`` of the whole document.
    * ``health_problems``: why the GPU should not take work, from :func:`gpu_health_problems` (empty when
      healthy).
    """

    uuid: str
    product_name: str
    architecture: str | None
    memory_total_mib: int | None
    vram_gib: int | None
    compute_capability: str | None
    compute_capability_source: Literal["xml", "architecture"] | None
    mig_capable: bool
    mig_mode: str | None
    mig_enabled: bool
    numa_node: int | None
    pci_bus_id: str | None
    minor_number: int | None
    mig_devices: tuple[MigDeviceInfo, ...] = ()
    driver_version: str | None = None
    cuda_version: str | None = None
    health_problems: tuple[str, ...] = ()


@dataclass(frozen=True)
class NvidiaSmiLog:
    """The whole document: ``driver_version`` (``"580.159.04"``), ``cuda_version`` (``"13.0"``) and the GPUs
    in NVML index order (the order ``nvidia-smi topo -m`` numbers them)."""

    driver_version: str | None
    cuda_version: str | None
    gpus: tuple[GpuInfo, ...]


def _error(message: str) -> InvalidInput:
    return InvalidInput(f"nvidia-smi -q -x: {message}", path=XML_PATH)


def _text(el: ET.Element | None, path: str) -> str | None:
    """Stripped text at ``path`` under ``el``; ``None`` when missing or an N/A-like placeholder."""
    if el is None:
        return None
    found = el.find(path)
    if found is None or found.text is None:
        return None
    value = " ".join(found.text.split())
    return None if value.upper() in _NA else value


def _int(el: ET.Element | None, path: str, what: str) -> int | None:
    value = _text(el, path)
    if value is None:
        return None
    try:
        return int(value, 0) if value.lower().startswith("0x") else int(value)
    except ValueError:
        raise _error(f"{what} {quote_input(value)} is not an integer") from None


def _mib(el: ET.Element | None, path: str, what: str) -> int | None:
    """A memory size such as ``"143771 MiB"`` in whole MiB."""
    value = _text(el, path)
    if value is None:
        return None
    m = _MIB_RE.fullmatch(value)
    if not m:
        raise _error(f"{what} {quote_input(value)} is not a memory size")
    amount = Decimal(m.group(1))
    unit = (m.group(2) or "MiB").lower()
    scale = {"mib": Decimal(1), "gib": Decimal(1024), "kib": Decimal(1) / 1024, "b": Decimal(1) / 1024**2}[
        unit
    ]
    return int((amount * scale).to_integral_value(ROUND_HALF_UP))


def mib_to_gib(mib: int) -> int:
    """MiB to whole GiB, rounded to the nearest (half up): 143771 -> 140, 81559 -> 80, 40960 -> 40."""
    return int((Decimal(mib) / 1024).to_integral_value(ROUND_HALF_UP))


def derive_compute_capability(architecture: str | None, product_name: str = "") -> str | None:
    """The CUDA compute capability (``"9.0"``) of an architecture name as nvidia-smi prints it, refined by the
    product name where one architecture spans several (see the module table). ``None`` when unknown."""
    if not architecture:
        return None
    arch = " ".join(architecture.split())
    name = product_name.upper()
    if arch == "Kepler" and re.search(r"\bK80\b", name):
        return "3.7"
    if arch == "Pascal" and re.search(r"\bP100\b", name):
        return "6.0"
    if arch == "Ampere" and re.search(r"\bA(100|800|30)\b", name):
        return "8.0"
    if arch == "Blackwell":
        if re.search(r"\bGB10\b", name):
            return "12.1"
        if "RTX" in name:
            return "12.0"
        if re.search(r"\bG?B300\b", name):
            return "10.3"
    for known, cc in ARCHITECTURE_COMPUTE_CAPABILITY.items():
        if known.lower() == arch.lower():
            return cc
    return None


def _yes(el: ET.Element, path: str) -> bool:
    return (_text(el, path) or "").lower() == "yes"


def gpu_health_problems(el: ET.Element) -> tuple[str, ...]:
    """Why a ``<gpu>`` element says the GPU should not take work (empty when none), in this order:

    * ``retired-page failure``: ``retired_pages/pending_retirement`` (or ``pending_blacklist``, its name on
      older drivers) is ``Yes``: a page awaits retirement, the GPU needs a reset;
    * ``row remapping failure``: ``remapped_rows/remapped_row_failure`` is ``Yes`` (the GPU could not remap
      a row; NVIDIA says to take it out of service);
    * ``XID error <text>``: any element whose tag contains ``xid`` holds something other than an N/A, ``0``
      or ``None`` placeholder (drivers that report XIDs in the XML);
    * ``recovery action <action>``: ``gpu_recovery_action`` is set and not ``None`` (``GPU Reset``,
      ``Node Reboot``, ``Drain P2P``, ...).
    """
    problems: list[str] = []
    if _yes(el, "retired_pages/pending_retirement") or _yes(el, "retired_pages/pending_blacklist"):
        problems.append("retired-page failure")
    if _yes(el, "remapped_rows/remapped_row_failure"):
        problems.append("row remapping failure")
    for node in el.iter():
        if "xid" in node.tag.lower() and len(node) == 0:
            value = " ".join((node.text or "").split())
            if value.upper() not in _NA and value != "0":
                problems.append(f"XID error {value}")
                break
    action = _text(el, "gpu_recovery_action")
    if action is not None:
        problems.append(f"recovery action {action}")
    return tuple(problems)


def _mig_device(el: ET.Element, gpu_uuid: str) -> MigDeviceInfo:
    gi = _int(el, "gpu_instance_id", "mig_device gpu_instance_id")
    ci = _int(el, "compute_instance_id", "mig_device compute_instance_id")
    uuid = _text(el, "uuid")
    if uuid is None:
        if gi is None or ci is None:
            raise _error(f"a MIG device of {gpu_uuid} has neither a uuid nor GPU/compute instance ids")
        uuid = f"MIG-{gpu_uuid}/{gi}/{ci}"
    mem = _mib(el, "fb_memory_usage/total", "mig_device fb_memory_usage/total")
    return MigDeviceInfo(
        id=uuid,
        index=_int(el, "index", "mig_device index"),
        gpu_instance_id=gi,
        compute_instance_id=ci,
        memory_total_mib=mem,
        vram_gib=None if mem is None else mib_to_gib(mem),
        multiprocessor_count=_int(
            el, "device_attributes/shared/multiprocessor_count", "multiprocessor_count"
        ),
    )


def _gpu(el: ET.Element, position: int, driver: str | None, cuda: str | None) -> GpuInfo:
    uuid = _text(el, "uuid")
    if uuid is None:
        raise _error(f"<gpu> number {position} has no <uuid>")
    product = _text(el, "product_name") or ""
    arch = _text(el, "product_architecture")
    mem = _mib(el, "fb_memory_usage/total", "fb_memory_usage/total")
    cc: str | None = None
    cc_source: Literal["xml", "architecture"] | None = None
    for tag in ("compute_cap", "cuda_compute_capability", "compute_capability"):
        value = _text(el, tag)
        if value is not None and _CC_RE.fullmatch(value):
            cc, cc_source = value, "xml"
            break
    if cc is None:
        cc = derive_compute_capability(arch, product)
        cc_source = "architecture" if cc is not None else None
    mig_current = _text(el, "mig_mode/current_mig")
    mig_pending = _text(el, "mig_mode/pending_mig")
    numa: int | None = None
    for tag in ("numa_id", "numa_node", "gpu_numa_id"):
        numa = _int(el, tag, tag)
        if numa is not None:
            break
    migs = tuple(_mig_device(m, uuid) for m in el.findall("mig_devices/mig_device"))
    return GpuInfo(
        uuid=uuid,
        product_name=product,
        architecture=arch,
        memory_total_mib=mem,
        vram_gib=None if mem is None else mib_to_gib(mem),
        compute_capability=cc,
        compute_capability_source=cc_source,
        mig_capable=mig_current is not None or mig_pending is not None,
        mig_mode=mig_current,
        mig_enabled=(mig_current or "").lower() == "enabled",
        numa_node=numa,
        pci_bus_id=_text(el, "pci/pci_bus_id") or el.get("id"),
        minor_number=_int(el, "minor_number", "minor_number"),
        mig_devices=migs,
        driver_version=driver,
        cuda_version=cuda,
        health_problems=gpu_health_problems(el),
    )


def _pci_key(bus_id: str) -> tuple[int, ...]:
    """``"00000000:3B:00.0"`` -> (domain, bus, device, function) for sorting."""
    m = re.fullmatch(r"([0-9A-Fa-f]+):([0-9A-Fa-f]+):([0-9A-Fa-f]+)\.([0-9A-Fa-f]+)", bus_id)
    if not m:
        raise ValueError(bus_id)
    return tuple(int(g, 16) for g in m.groups())


def parse_nvidia_smi_log(text: str) -> NvidiaSmiLog:
    """Parse the whole ``nvidia-smi -q -x`` document (see :class:`NvidiaSmiLog`).

    GPUs come in NVML index order, i.e. PCI bus order (which ``nvidia-smi topo -m`` uses for ``GPU<i>``):
    sorted by ``pci_bus_id`` when every GPU has one, else in document order. ``minor_number`` is kept but
    not used for ordering (it follows driver probe order, which may differ).

    Raises :class:`app.errors.InvalidInput` (``path="nvidiaSmiXml"``) for text that is not XML, declares
    entities, is not an ``nvidia_smi_log``, has no ``<gpu>``, a GPU without ``<uuid>``, a repeated UUID, or
    a number or memory size that does not parse.
    """
    if not isinstance(text, str) or not text.strip():
        raise _error("empty document")
    if re.search(r"<!ENTITY", text, re.IGNORECASE):
        raise _error("entity declarations are not accepted")
    try:
        root = ET.fromstring(text.strip())
    except ET.ParseError as exc:
        raise _error(f"not well-formed XML ({exc})") from None
    if root.tag != "nvidia_smi_log":
        raise _error(f"root element is <{root.tag}>, expected <nvidia_smi_log>")
    driver = _text(root, "driver_version")
    cuda = _text(root, "cuda_version")
    elements = root.findall("gpu")
    if not elements:
        raise _error("the document lists no <gpu>")
    gpus = [_gpu(el, i, driver, cuda) for i, el in enumerate(elements)]
    seen: set[str] = set()
    for g in gpus:
        if g.uuid in seen:
            raise _error(f"GPU {g.uuid} is listed twice")
        seen.add(g.uuid)
    try:
        if all(g.pci_bus_id for g in gpus):
            gpus.sort(key=lambda g: _pci_key(g.pci_bus_id or ""))
    except ValueError:
        pass  # an unusual bus id: keep the document's (NVML) order
    return NvidiaSmiLog(driver_version=driver, cuda_version=cuda, gpus=tuple(gpus))


def parse_nvidia_smi_xml(text: str) -> list[GpuInfo]:
    """The GPUs of an ``nvidia-smi -q -x`` document in NVML index order (see :func:`parse_nvidia_smi_log`,
    which also raises the same :class:`app.errors.InvalidInput` errors)."""
    return list(parse_nvidia_smi_log(text).gpus)

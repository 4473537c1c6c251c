"""``parse_nvidia_smi_xml`` against the real H200 host's ``nvidia-smi -q -x``, cross-checked with the same
host's ``--query-gpu`` CSV and MIG profile list (``tests/data/h200-host/``)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from app.errors import InvalidInput
from app.inventory.nvsmi_xml import (
    derive_compute_capability,
    mib_to_gib,
    parse_nvidia_smi_log,
    parse_nvidia_smi_xml,
)

H200 = Path(__file__).resolve().parent.parent / "data" / "h200-host"
XML = (H200 / "nvidia-smi-q.xml").read_text()


def _query_gpu() -> list[dict[str, str]]:
    with (H200 / "query-gpu.csv").open() as fh:
        rows = list(csv.reader(fh, skipinitialspace=True))
    return [dict(zip(rows[0], row, strict=True)) for row in rows[1:]]


def mig_xml() -> str:
    """The H200 document with MIG enabled and two MIG devices (one with a UUID, one without)."""
    devices = """<mig_devices>
        <mig_device><index>0</index><gpu_instance_id>9</gpu_instance_id>
          <compute_instance_id>0</compute_instance_id>
          <uuid>MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee</uuid>
          <device_attributes><shared><multiprocessor_count>60</multiprocessor_count></shared></device_attributes>
          <fb_memory_usage><total>71424 MiB</total><used>0 MiB</used></fb_memory_usage></mig_device>
        <mig_device><index>1</index><gpu_instance_id>5</gpu_instance_id>
          <compute_instance_id>0</compute_instance_id>
          <fb_memory_usage><total>16384 MiB</total></fb_memory_usage></mig_device>
      </mig_devices>"""
    text = XML.replace("<current_mig>Disabled</current_mig>", "<current_mig>Enabled</current_mig>")
    start = text.index("<mig_devices>")
    end = text.index("</mig_devices>") + len("</mig_devices>")
    return text[:start] + devices + text[end:]


def test_h200_matches_query_gpu_csv() -> None:
    (gpu,) = parse_nvidia_smi_xml(XML)
    (row,) = _query_gpu()
    assert gpu.uuid == row["uuid"] == "GPU-00000000-1111-2222-3333-444444444444"
    assert gpu.product_name == row["name"] == "NVIDIA H200"
    assert f"{gpu.memory_total_mib} MiB" == row["memory.total [MiB]"]
    assert gpu.pci_bus_id == row["pci.bus_id"]
    assert gpu.compute_capability == row["compute_cap"] == "9.0"
    assert gpu.compute_capability_source == "architecture"
    assert gpu.mig_mode == row["mig.mode.current"] == "Disabled"
    assert gpu.driver_version == row["driver_version"] == "580.159.04"
    assert int(row["index"]) == gpu.minor_number == 0


def test_h200_fields() -> None:
    log = parse_nvidia_smi_log(XML)
    assert (log.driver_version, log.cuda_version) == ("580.159.04", "13.0")
    (gpu,) = log.gpus
    assert gpu.architecture == "Hopper"
    assert gpu.memory_total_mib == 143771
    assert gpu.vram_gib == 140
    # MIG mode is Disabled (not N/A), and the host's `nvidia-smi mig -lgip` lists profiles: MIG-capable.
    assert "MIG 7g.141gb" in (H200 / "mig-nvlink.txt").read_text()
    assert gpu.mig_capable is True
    assert gpu.mig_enabled is False
    assert gpu.mig_devices == ()
    assert gpu.numa_node is None  # not in this XML; the importer takes it from the topo matrix


def test_mig_devices() -> None:
    (gpu,) = parse_nvidia_smi_xml(mig_xml())
    assert gpu.mig_enabled is True
    first, second = gpu.mig_devices
    assert first.id == "MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
    assert (first.gpu_instance_id, first.compute_instance_id, first.index) == (9, 0, 0)
    assert (first.memory_total_mib, first.vram_gib, first.multiprocessor_count) == (71424, 70, 60)
    assert second.id == f"MIG-{gpu.uuid}/5/0"
    assert second.vram_gib == 16 and second.multiprocessor_count is None


def test_not_mig_capable_and_explicit_compute_capability() -> None:
    text = XML.replace("<current_mig>Disabled</current_mig>", "<current_mig>N/A</current_mig>")
    text = text.replace("<pending_mig>Disabled</pending_mig>", "<pending_mig>N/A</pending_mig>")
    text = text.replace(
        "<minor_number>0</minor_number>", "<minor_number>0</minor_number><compute_cap>9.0</compute_cap>"
    )
    (gpu,) = parse_nvidia_smi_xml(text)
    assert gpu.mig_capable is False
    assert gpu.mig_mode is None
    assert (gpu.compute_capability, gpu.compute_capability_source) == ("9.0", "xml")


def test_gpus_come_in_pci_order() -> None:
    start = XML.index("<gpu id=")
    end = XML.index("</gpu>") + len("</gpu>")
    gpu = XML[start:end]
    second = gpu.replace("00000000:00:06.0", "00000000:00:05.0").replace("444444444444", "555555555555")
    doc = XML[:end] + second + XML[end:]
    uuids = [g.uuid for g in parse_nvidia_smi_xml(doc)]
    assert uuids == ["GPU-00000000-1111-2222-3333-555555555555", "GPU-00000000-1111-2222-3333-444444444444"]


@pytest.mark.parametrize(
    ("arch", "product", "cc"),
    [
        ("Volta", "Tesla V100-SXM2-32GB", "7.0"),
        ("Turing", "Tesla T4", "7.5"),
        ("Ampere", "NVIDIA A100-SXM4-80GB", "8.0"),
        ("Ampere", "NVIDIA A30", "8.0"),
        ("Ampere", "NVIDIA RTX A6000", "8.6"),
        ("Ampere", "NVIDIA GeForce RTX 3090", "8.6"),
        ("Ada Lovelace", "NVIDIA GeForce RTX 4090", "8.9"),
        ("Hopper", "NVIDIA H200", "9.0"),
        ("Blackwell", "NVIDIA B200", "10.0"),
        ("Blackwell", "NVIDIA B300 SXM6 AC", "10.3"),
        ("Blackwell", "NVIDIA RTX PRO 6000 Blackwell Server Edition", "12.0"),
        ("Blackwell", "NVIDIA GB10", "12.1"),
        ("Pascal", "Tesla P100-PCIE-16GB", "6.0"),
        ("Pascal", "Tesla P40", "6.1"),
        ("Kepler", "Tesla K80", "3.7"),
        ("Rubin", "NVIDIA R100", None),
        (None, "NVIDIA H200", None),
    ],
)
def test_derive_compute_capability(arch: str | None, product: str, cc: str | None) -> None:
    assert derive_compute_capability(arch, product) == cc


def test_mib_to_gib_rounds_to_nearest() -> None:
    assert [mib_to_gib(m) for m in (143771, 81559, 40960, 24564, 512, 511)] == [140, 80, 40, 24, 1, 0]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "empty"),
        ("<nvidia_smi_log><gpu>", "not well-formed"),
        ("<other/>", "root element"),
        ("<nvidia_smi_log><driver_version>1</driver_version></nvidia_smi_log>", "no <gpu>"),
        ("<nvidia_smi_log><gpu><product_name>x</product_name></gpu></nvidia_smi_log>", "no <uuid>"),
        (
            "<nvidia_smi_log><gpu><uuid>GPU-1</uuid></gpu><gpu><uuid>GPU-1</uuid></gpu></nvidia_smi_log>",
            "twice",
        ),
        (
            "<nvidia_smi_log><gpu><uuid>GPU-1</uuid><fb_memory_usage><total>lots</total>"
            "</fb_memory_usage></gpu></nvidia_smi_log>",
            "memory size",
        ),
        (
            "<nvidia_smi_log><gpu><uuid>GPU-1</uuid><minor_number>x</minor_number></gpu></nvidia_smi_log>",
            "integer",
        ),
        (
            '<?xml version="1.0"?><!DOCTYPE l [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;">]>'
            "<nvidia_smi_log><gpu><uuid>&b;</uuid></gpu></nvidia_smi_log>",
            "entity",
        ),
    ],
)
def test_bad_xml_is_invalid_input(text: str, fragment: str) -> None:
    with pytest.raises(InvalidInput) as info:
        parse_nvidia_smi_xml(text)
    assert info.value.path == "nvidiaSmiXml"
    assert fragment in info.value.message


@pytest.mark.parametrize(
    ("old", "new", "problems"),
    [
        ("", "", ()),
        ("<remapped_row_failure>No", "<remapped_row_failure>Yes", ("row remapping failure",)),
        ("<pending_retirement>N/A", "<pending_retirement>Yes", ("retired-page failure",)),
        ("<pending_blacklist>N/A", "<pending_blacklist>Yes", ("retired-page failure",)),
        ("<gpu_recovery_action>None", "<gpu_recovery_action>GPU Reset", ("recovery action GPU Reset",)),
        ("<c2c_mode>", "<xid_errors>79</xid_errors><c2c_mode>", ("XID error 79",)),
        ("<c2c_mode>", "<xid_errors>None</xid_errors><c2c_mode>", ()),
        ("<remapped_row_pending>No", "<remapped_row_pending>Yes", ()),  # pending is not a failure
    ],
)
def test_gpu_health_problems(old: str, new: str, problems: tuple[str, ...]) -> None:
    assert old in XML
    assert parse_nvidia_smi_log(XML.replace(old, new, 1)).gpus[0].health_problems == problems

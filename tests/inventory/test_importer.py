"""``build_imported_node``: atoms, GPU-GPU links and system labels from real nvidia-smi output."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.errors import InvalidInput
from app.inventory.importer import build_imported_node, gpu_model, gpu_product, link_rank, normalize_link
from app.inventory.topo import parse_topo_matrix

DATA = Path(__file__).resolve().parent.parent / "data"
TOPO = {p.stem: p.read_text() for p in (DATA / "topo").glob("*.txt")}
H200_TOPO = (DATA / "h200-host" / "topo-m.txt").read_text()
H200_XML = (DATA / "h200-host" / "nvidia-smi-q.xml").read_text()


def eight_gpu_xml() -> str:
    """The H200 document with its <gpu> repeated 8 times (distinct UUIDs and PCI ids, listed in reverse)."""
    start = H200_XML.index("<gpu id=")
    end = H200_XML.index("</gpu>") + len("</gpu>")
    gpu = H200_XML[start:end]
    copies = [
        gpu.replace("00000000:00:06.0", f"00000000:{0x18 + i:02X}:00.0").replace(
            "444444444444", f"44444444444{i}"
        )
        for i in reversed(range(8))
    ]
    return H200_XML[:start] + "\n".join(copies) + H200_XML[end:]


def test_h200_with_xml() -> None:
    node = build_imported_node("h200-a", H200_TOPO, H200_XML)
    (dev,) = node.devices
    assert dev.id == "GPU-00000000-1111-2222-3333-444444444444"
    assert dev.device_class == "gpu"
    assert dev.parent is None and dev.bookable
    assert dev.numa_node == 0
    assert dev.attributes == {
        "gpuProduct": "H200",
        "gpuModel": "H200",
        "vramGiB": 140,
        "computeCapability": "9.0",
        "architecture": "Hopper",
        "migCapable": True,
        "numaNode": 0,
    }
    assert node.links == []
    assert node.labels == {
        "gpu.count": "1",
        "gpu.product": "H200",
        "gpu.model": "H200",
        "mig.capable": "true",
        "cuda.driver.major": "580",
    }


def test_without_xml_atoms_are_named_after_the_node() -> None:
    node = build_imported_node("dgx-a100-1", TOPO["02-dgx-a100-12nic-mlx5-names"], None)
    assert [d.id for d in node.devices] == [f"dgx-a100-1-GPU{i}" for i in range(8)]
    assert [d.numa_node for d in node.devices] == [3, 3, 1, 1, 7, 7, 5, 5]
    assert node.devices[0].attributes == {"numaNode": 3}
    assert node.labels == {"gpu.count": "8"}
    assert len(node.links) == 28
    assert all(link == "NV12" for _, _, link in node.links)
    assert all(a < b for a, b, _ in node.links)


def test_links_cover_gpu_pairs_only_and_match_the_matrix() -> None:
    for stem, text in TOPO.items():
        matrix = parse_topo_matrix(text)
        node = build_imported_node("n", text)
        ids = {d.id for d in node.devices}
        assert len(node.links) == len(matrix.gpu_links), stem
        assert node.links == sorted(node.links)
        for a, b, link in node.links:
            assert a < b and a in ids and b in ids
            ga, gb = a.removeprefix("n-"), b.removeprefix("n-")
            assert normalize_link(matrix.gpu_link(ga, gb) or "") == link


def test_dgx1_hybrid_cube_mesh_links() -> None:
    node = build_imported_node("dgx1", TOPO["01-dgx1-v100-hybrid-cube-mesh-mlx5"])
    links = {(a, b): link for a, b, link in node.links}
    assert links[("dgx1-GPU0", "dgx1-GPU3")] == "NV2"
    assert links[("dgx1-GPU0", "dgx1-GPU5")] == "SYS"
    assert all(d.numa_node is None for d in node.devices)  # this driver prints no NUMA Affinity column


def test_legacy_soc_is_stored_as_sys() -> None:
    text = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tSOC\t0-7\nGPU1\tSOC\t X \t8-15\n"
    node = build_imported_node("old", text)
    assert node.links == [("old-GPU0", "old-GPU1", "SYS")]


def test_eight_gpus_with_xml_match_rows_in_pci_order() -> None:
    node = build_imported_node(
        "dgx-h100", TOPO["03-dgx-h100-nv18-8nic-legend-space-aligned"], eight_gpu_xml()
    )
    ids = [d.id for d in node.devices]
    assert ids == [f"GPU-00000000-1111-2222-3333-44444444444{i}" for i in range(8)]
    assert [d.numa_node for d in node.devices] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert len(node.links) == 28 and {link for _, _, link in node.links} == {"NV18"}
    assert node.labels["gpu.count"] == "8"


def test_mig_devices_become_atoms() -> None:
    devices = """<mig_devices>
        <mig_device><index>0</index><gpu_instance_id>9</gpu_instance_id>
          <compute_instance_id>0</compute_instance_id><uuid>MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee</uuid>
          <fb_memory_usage><total>71424 MiB</total></fb_memory_usage></mig_device>
        <mig_device><index>1</index><gpu_instance_id>5</gpu_instance_id>
          <compute_instance_id>0</compute_instance_id>
          <fb_memory_usage><total>16384 MiB</total></fb_memory_usage></mig_device>
      </mig_devices>"""
    text = H200_XML.replace("<current_mig>Disabled</current_mig>", "<current_mig>Enabled</current_mig>")
    start, end = text.index("<mig_devices>"), text.index("</mig_devices>") + len("</mig_devices>")
    node = build_imported_node("h200-mig", H200_TOPO, text[:start] + devices + text[end:])
    gpu, mig_a, mig_b = node.devices
    assert gpu.bookable is False and gpu.attributes["migEnabled"] is True
    assert mig_a.device_class == mig_b.device_class == "mig"
    assert mig_a.parent == mig_b.parent == gpu.id
    assert mig_a.id == "MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
    assert mig_a.attributes["vramGiB"] == 70
    assert mig_a.attributes["gpuProduct"] == "H200"
    assert mig_a.numa_node == 0
    assert mig_b.id == f"MIG-{gpu.id}/5/0"
    assert node.links == []


def test_gpu_count_mismatch_is_invalid_xml() -> None:
    with pytest.raises(InvalidInput) as info:
        build_imported_node("dgx", TOPO["02-dgx-a100-12nic-mlx5-names"], H200_XML)
    assert info.value.path == "nvidiaSmiXml"
    assert "1 GPUs" in info.value.message and "has 8" in info.value.message


@pytest.mark.parametrize("name", ["", "   ", "bad name", "x" * 130])
def test_bad_names(name: str) -> None:
    with pytest.raises(InvalidInput) as info:
        build_imported_node(name, H200_TOPO)
    assert info.value.path == "name"


def test_bad_topo_is_reported_on_topo() -> None:
    with pytest.raises(InvalidInput) as info:
        build_imported_node("n", "not a matrix", H200_XML)
    assert info.value.path == "topo"


def test_gpu_product_and_link_rank() -> None:
    assert gpu_product("NVIDIA H200") == "H200"
    assert gpu_product("NVIDIA A100-SXM4-80GB") == "A100-SXM4-80GB"
    assert gpu_product("NVIDIA GeForce RTX 4090") == "GeForce-RTX-4090"
    assert gpu_product("Tesla V100-SXM2-32GB") == "Tesla-V100-SXM2-32GB"
    assert gpu_product("NVIDIA  RTX  A6000 (rev 1)") == "RTX-A6000-rev-1"
    ranks = [link_rank(k) for k in ("NV1", "NV18", "PIX", "PXB", "PHB", "NODE", "SYS", "SOC", "C2C")]
    assert ranks == [0, 0, 1, 2, 3, 4, 5, 5, 6]


@pytest.mark.parametrize(
    ("product", "model"),
    [
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("Tesla V100-SXM2-32GB", "V100"),
        ("NVIDIA GeForce RTX 4090", "RTX-4090"),
        ("NVIDIA RTX A6000", "A6000"),
        ("NVIDIA GH200 480GB", "GH200"),
        ("Tesla K80", "K80"),
        ("NVIDIA", ""),
    ],
)
def test_gpu_model(product: str, model: str) -> None:
    assert gpu_model(product) == model


def test_h100_product_name_gives_the_model_attribute_and_label() -> None:
    xml = H200_XML.replace(
        "<product_name>NVIDIA H200</product_name>", "<product_name>NVIDIA H100 80GB HBM3</product_name>"
    )
    node = build_imported_node("h100-a", H200_TOPO, xml)
    assert node.devices[0].attributes["gpuModel"] == "H100"
    assert node.devices[0].attributes["gpuProduct"] == "H100-80GB-HBM3"
    assert node.labels["gpu.model"] == "H100"


def test_damaged_topo_imports_with_warnings() -> None:
    damaged = (DATA / "damaged" / "13-2x-a100-nv12-5nic-merged-affinity.txt").read_text()
    node = build_imported_node("a100-vm", damaged)
    assert [d.id for d in node.devices] == ["a100-vm-GPU0", "a100-vm-GPU1"]
    assert node.links == [("a100-vm-GPU0", "a100-vm-GPU1", "NV12")]
    assert len(node.warnings) == 2 and "SY0-31,64-95" in node.warnings[0]

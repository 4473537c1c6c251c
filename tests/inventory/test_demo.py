"""The demo pool manifest (``app/inventory/examples/demo-pool.json``) and its loader."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest

from app.errors import InvalidInput
from app.inventory.demo import EXAMPLES_DIR, MANIFEST_NAME, load_demo_manifest

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "data"


def test_packaged_demo_pool() -> None:
    nodes = load_demo_manifest()
    by_name = {n.name: n for n in nodes}
    assert len(by_name) == len(nodes) == 8
    nvlink_hosts = [
        n
        for n in nodes
        if n.node.topo.gpu_count == 8 and all(link.startswith("NV") for _, _, link in n.node.links)
    ]
    assert {n.name for n in nvlink_hosts} == {"dgx-a100-01", "dgx-a100-02", "dgx-h100-01", "dgx-h100-02"}
    dgx1 = by_name["dgx1-v100-01"].node
    assert {link for _, _, link in dgx1.links} == {"NV1", "NV2", "SYS"}
    pcie = by_name["rtx4090-01"].node
    assert {link for _, _, link in pcie.links} == {"SYS"}
    assert [d.numa_node for d in pcie.devices] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert by_name["dgx-a100-01"].resources == {
        "cpu": {"allocatable": Decimal(256), "ratio": Decimal(1)},
        "memory": {"allocatable": Decimal(2097152), "ratio": Decimal(1)},
    }
    h200 = by_name["h200-01"]
    assert h200.xml_text is not None
    assert [d.id for d in h200.node.devices] == ["GPU-00000000-1111-2222-3333-444444444444"]
    assert h200.node.labels["gpu.product"] == "H200"
    for n in nodes:
        assert n.node.name == n.name
        assert set(n.resources) == {"cpu", "memory"}
        assert n.node.labels["gpu.count"] == str(n.node.topo.gpu_count)
        if n.xml_text is None:
            assert all(d.id.startswith(f"{n.name}-GPU") for d in n.node.devices)
            assert "gpu.product" in n.labels
        # every cpu the matrix's affinities mention exists on the host
        cpus = [c for v in n.node.topo.cpu_affinity.values() if v for c in v.replace("-", ",").split(",")]
        assert max(int(c) for c in cpus) < n.resources["cpu"]["allocatable"]


def test_example_files_are_the_real_fixtures() -> None:
    pairs = {
        "dgx1-v100.topo.txt": "topo/01-dgx1-v100-hybrid-cube-mesh-mlx5.txt",
        "dgx-a100.topo.txt": "topo/02-dgx-a100-12nic-mlx5-names.txt",
        "dgx-h100.topo.txt": "topo/03-dgx-h100-nv18-8nic-legend-space-aligned.txt",
        "rtx4090-8x.topo.txt": "topo/08-8x-rtx4090-all-sys-2nic-no-legend.txt",
        "rtx-a6000-3x.topo.txt": "topo/06-3x-rtx-a6000-nv4-pair-ansi-header.txt",
        "h200.topo.txt": "h200-host/topo-m.txt",
        "h200.nvidia-smi-q.xml": "h200-host/nvidia-smi-q.xml",
    }
    for example, fixture in pairs.items():
        assert (EXAMPLES_DIR / example).read_bytes() == (FIXTURES / fixture).read_bytes(), example


def test_repo_examples_folder_points_at_the_package_data() -> None:
    link = REPO / "examples" / "demo-pool"
    if not link.exists():
        pytest.skip("not a source checkout")
    assert link.resolve() == EXAMPLES_DIR.resolve()
    assert [n.name for n in load_demo_manifest(link)] == [n.name for n in load_demo_manifest()]
    assert len(load_demo_manifest(EXAMPLES_DIR / MANIFEST_NAME)) == 8


def _write(tmp_path: Path, doc: object, files: dict[str, str] | None = None) -> Path:
    for name, text in (files or {}).items():
        (tmp_path / name).write_text(text)
    (tmp_path / MANIFEST_NAME).write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return tmp_path


TOPO = (EXAMPLES_DIR / "h200.topo.txt").read_text()


def _node(**over: object) -> dict[str, object]:
    node: dict[str, object] = {"name": "n1", "topo": "a.txt", "resources": {"cpu": {"allocatable": 8}}}
    node.update(over)
    return node


def test_minimal_manifest_defaults(tmp_path: Path) -> None:
    (node,) = load_demo_manifest(_write(tmp_path, {"nodes": [_node()]}, {"a.txt": TOPO}))
    assert node.labels == {}
    assert node.resources == {"cpu": {"allocatable": Decimal(8), "ratio": Decimal(1)}}
    assert [d.id for d in node.node.devices] == ["n1-GPU0"]


@pytest.mark.parametrize(
    ("doc", "path"),
    [
        ("{not json", "manifest"),
        ({"nodes": []}, "nodes"),
        ({"nodes": ["x"]}, "nodes.0"),
        ({"nodes": [_node(extra=1)]}, "nodes.0.extra"),
        ({"nodes": [_node(name="bad name")]}, "nodes.0.name"),
        ({"nodes": [_node(), _node()]}, "nodes.1.name"),
        ({"nodes": [_node(topo="missing.txt")]}, "nodes.0.topo"),
        ({"nodes": [_node(topo="../a.txt")]}, "nodes.0.topo"),
        ({"nodes": [_node(topo="/etc/hostname")]}, "nodes.0.topo"),
        ({"nodes": [_node(topo=None)]}, "nodes.0.topo"),
        ({"nodes": [_node(labels={"1bad": "x"})]}, "nodes.0.labels.1bad"),
        ({"nodes": [_node(resources={"cpu": {"allocatable": -1}})]}, "nodes.0.resources.cpu.allocatable"),
        (
            {"nodes": [_node(resources={"cpu": {"allocatable": 1, "ratio": 0}})]},
            "nodes.0.resources.cpu.ratio",
        ),
        ({"nodes": [_node(resources={"cpu": {"ratio": 1}})]}, "nodes.0.resources.cpu"),
        ({"nodes": [_node(resources={"cpu": {"allocatable": True}})]}, "nodes.0.resources.cpu.allocatable"),
        ({"nodes": [_node(topo="bad.txt")]}, "topo"),
        ({"nodes": [_node(xml="bad.txt")]}, "nvidiaSmiXml"),
    ],
)
def test_bad_manifests(tmp_path: Path, doc: object, path: str) -> None:
    (tmp_path / "a.txt").write_text(TOPO)  # a real file just outside the manifest's folder ('..' case)
    folder = tmp_path / "m"
    folder.mkdir()
    root = _write(folder, doc, {"a.txt": TOPO, "bad.txt": "nonsense"})
    with pytest.raises(InvalidInput) as info:
        load_demo_manifest(root)
    assert info.value.path == path


def test_missing_manifest(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput) as info:
        load_demo_manifest(tmp_path)
    assert info.value.path == "manifest"


@pytest.mark.parametrize(
    ("node", "path"), [(_node(topo="bad.txt"), "topo"), (_node(xml="bad.txt"), "nvidiaSmiXml")]
)
def test_parser_errors_name_the_node_and_keep_their_path(tmp_path: Path, node: object, path: str) -> None:
    root = _write(tmp_path, {"nodes": [node]}, {"a.txt": TOPO, "bad.txt": "nonsense"})
    with pytest.raises(InvalidInput) as info:
        load_demo_manifest(root)
    assert type(info.value) is InvalidInput and info.value.message.startswith("demo node n1: ")
    assert info.value.path == info.value.details["path"] == path

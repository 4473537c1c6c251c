"""``parse_topo_matrix`` against every real ``nvidia-smi topo -m`` fixture and its expected result.

The fixtures in ``tests/data/topo/`` are copies of ``shared/fixtures/topo/`` (real output from real hosts);
each ``*.expected.json`` is the oracle. Every key the oracle has that :class:`TopoMatrix` represents is
compared, including the order of the link maps.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from app.errors import InvalidInput
from app.inventory.topo import parse_topo_matrix
from app.inventory.topo_matrix import TopoMatrix, cpu_list_count, parse_cpu_list

DATA = Path(__file__).resolve().parent.parent / "data"
TOPO_FIXTURES = sorted((DATA / "topo").glob("*.txt"))
H200_TOPO = DATA / "h200-host" / "topo-m.txt"


def _key(pair: tuple[str, str]) -> str:
    return "-".join(pair)


def _as_oracle(m: TopoMatrix) -> dict[str, Any]:
    """The matrix in the oracle's shape (pairs joined with ``-``)."""
    return {
        "gpus": list(m.gpus),
        "gpu_count": m.gpu_count,
        "nics": list(m.nics),
        "nic_legend": m.nic_legend,
        "gpu_links": {_key(k): v for k, v in m.gpu_links.items()},
        "gpu_nic_links": {_key(k): v for k, v in m.gpu_nic_links.items()},
        "nic_nic_links": {_key(k): v for k, v in m.nic_nic_links.items()},
        "cpu_affinity": m.cpu_affinity,
        "cpu_affinity_count": m.cpu_affinity_count,
        "numa_affinity": m.numa_affinity,
        "gpu_numa_id": m.gpu_numa_id,
        "nvlink_counts": {_key(k): v for k, v in m.nvlink_counts.items()},
        "format": m.layout,
        "asymmetric_pairs_found": [list(p) for p in m.asymmetric_pairs],
    }


def test_fixtures_are_present() -> None:
    assert len(TOPO_FIXTURES) == 12
    for f in TOPO_FIXTURES:
        assert f.with_suffix(".expected.json").exists(), f.name


@pytest.mark.parametrize("path", TOPO_FIXTURES, ids=[p.stem for p in TOPO_FIXTURES])
def test_fixture_parses_to_expected(path: Path) -> None:
    expected = json.loads(path.with_suffix(".expected.json").read_text())
    got = _as_oracle(parse_topo_matrix(path.read_text()))
    compared = [k for k in got if k in expected]
    assert len(compared) >= 13
    for key in compared:
        assert got[key] == expected[key], key
    for key in ("gpu_links", "gpu_nic_links", "nic_nic_links", "nvlink_counts"):
        assert list(got[key]) == list(expected[key]), f"{key} order"


@pytest.mark.parametrize("path", TOPO_FIXTURES, ids=[p.stem for p in TOPO_FIXTURES])
def test_terminal_copy_parses_the_same(path: Path) -> None:
    """A terminal copy (TABs expanded to 8-column stops) gives the same matrix, empty cells included."""
    text = path.read_text()
    tabbed = dataclasses.asdict(parse_topo_matrix(text))
    spaced = dataclasses.asdict(parse_topo_matrix(text.expandtabs(8)))
    assert spaced.pop("layout") == "space"
    tabbed.pop("layout")
    assert spaced == tabbed


@pytest.mark.parametrize("path", TOPO_FIXTURES, ids=[p.stem for p in TOPO_FIXTURES])
def test_crlf_and_trailing_whitespace_do_not_matter(path: Path) -> None:
    text = path.read_text()
    assert parse_topo_matrix(text.replace("\n", "\r\n") + "\r\n\r\n") == parse_topo_matrix(text)


def test_h200_single_gpu_ansi_header() -> None:
    m = parse_topo_matrix(H200_TOPO.read_text())
    assert m.gpus == ("GPU0",)
    assert m.nics == ()
    assert m.gpu_links == {}
    assert m.cpu_affinity == {"GPU0": "0-15"}
    assert m.cpu_affinity_count == {"GPU0": 16}
    assert m.numa_affinity == {"GPU0": [0]}
    assert m.gpu_numa_id == {"GPU0": None}
    assert m.numa_node("GPU0") == 0
    assert m.legend["NV#"] == "Connection traversing a bonded set of # NVLinks"


def test_legacy_soc_legend_and_topo_mp_view() -> None:
    legacy = parse_topo_matrix((DATA / "topo" / "07-k80-4gpu-pcie-legacy-soc-legend.txt").read_text())
    assert "SOC" in legacy.legend and "NV#" not in legacy.legend
    mp = parse_topo_matrix((DATA / "topo" / "18-dgx1-topo-mp-pcie-only-view.txt").read_text())
    assert mp.nvlink_counts == {} and "NV#" not in mp.legend


def test_nic_legend_and_links() -> None:
    m = parse_topo_matrix((DATA / "topo" / "03-dgx-h100-nv18-8nic-legend-space-aligned.txt").read_text())
    assert m.nic_legend["NIC7"] == "mlx5_7"
    assert m.gpu_link("GPU3", "GPU1") == "NV18"
    assert m.gpu_link("GPU1", "GPU1") == "X"
    assert m.gpu_link("GPU1", "GPU9") is None
    assert m.numa_node("GPU5") == 1


def test_soc_link_cells_are_kept_as_printed() -> None:
    text = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tSOC\t0-7\nGPU1\tSOC\t X \t8-15\n"
    m = parse_topo_matrix(text)
    assert m.gpu_links == {("GPU0", "GPU1"): "SOC"}
    assert m.numa_affinity == {"GPU0": None, "GPU1": None}
    assert m.gpu_numa_id is None


def test_multi_node_numa_affinity_and_gpu_numa_id() -> None:
    text = "\tGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\nGPU0\t X \t0-71\t0-1\t\t9\n"
    m = parse_topo_matrix(text)
    assert m.numa_affinity == {"GPU0": [0, 1]}
    assert m.gpu_numa_id == {"GPU0": 9}
    assert m.numa_node("GPU0") == 9


def test_asymmetric_cells_are_reported() -> None:
    text = "\tGPU0\tGPU1\nGPU0\t X \tNV4\nGPU1\tSYS\t X \n"
    m = parse_topo_matrix(text)
    assert m.gpu_links == {("GPU0", "GPU1"): "NV4"}
    assert m.asymmetric_pairs == (("GPU0", "GPU1"),)


def test_cpu_lists() -> None:
    assert parse_cpu_list("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert cpu_list_count("") == 0
    assert cpu_list_count("0-19,40-59") == 40
    for bad in ("N/A", "3-1", "a", "1,,2"):
        with pytest.raises(ValueError):
            parse_cpu_list(bad)


GOOD_HEAD = "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\n"
GPU1_ROW = "GPU1\tNV4\t X \t0-7\t0\n"


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        ("", 1, "empty input"),
        ("   \n\n", 1, "empty input"),
        ("\tNIC0\tNIC1\nNIC0\t X \tPIX\nNIC1\tPIX\t X\n", 1, "no GPU column"),
        ("\tGPU0\tGPU0\n", 1, "appears twice"),
        ("\tGPU0\tCPU Affinity\tBOGUS\n", 1, "unexpected header text"),
        ("\tGPU0\tNUMA Affinity\tCPU Affinity\n", 1, "not in nvidia-smi order"),
        (GOOD_HEAD + "GPU0\t X \tNV4\t0-7\t0\n", 3, "no row for GPU1"),
        (GOOD_HEAD + "GPU0\t X \tNV4\t0-7\t0\nGPU2\tNV4\t X \t0-7\t0\n", 3, "not a column"),
        (GOOD_HEAD + "GPU0\t X \tNV4\t0-7\t0\nGPU0\tNV4\t X \t0-7\t0\n", 3, "appears twice"),
        (GOOD_HEAD + "GPU0\t X \n", 2, "has 1 link cells, expected 2"),
        (GOOD_HEAD + "GPU0\tNV4\tNV4\t0-7\t0\n", 2, "diagonal"),
        (GOOD_HEAD + "GPU0\t X \tnv4\t0-7\t0\n", 2, "not a link kind"),
        (GOOD_HEAD + "GPU0\t X \t X \t0-7\t0\n", 2, "not a link kind"),
        (GOOD_HEAD + "GPU0\t X \tPH0-7\t0\n" + GPU1_ROW, 2, "not a link kind"),  # GPU x GPU stays strict
        ("\tGPU0\tNIC0\nGPU0\tNV4\tPIX\nNIC0\tPIX\t X \n", 2, "diagonal"),
        ("\tGPU0\nGPU0\t X \n\nsomething else\n", 4, "unexpected line after the matrix"),
        ("\tGPU0\tNIC0\nGPU0\t X \tPIX\nNIC0\tPIX\t X\n\nNIC Legend:\n\n  NIC9: mlx5_9\n", 7, "not a NIC"),
        ("\tGPU0\tNIC0\nGPU0\t X \tPIX\nNIC0\tPIX\t X\n\nNIC Legend:\n\n  mlx5_9\n", 7, "NICn: name"),
    ],
)
def test_malformed_text_names_the_line(text: str, line: int, fragment: str) -> None:
    with pytest.raises(InvalidInput) as info:
        parse_topo_matrix(text)
    err = info.value
    assert err.path == "topo"
    assert err.details["path"] == "topo"
    assert err.details["line"] == line
    assert f"line {line}:" in err.message
    assert fragment in err.message


GPU_NIC_HEAD = "\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\n"
NIC_ROW = "NIC0\tPIX\tPIX\t X \n"


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        (GOOD_HEAD + "GPU0\t X \tNV4\tzero\t0\n" + GPU1_ROW, 2, "not a CPU list"),
        (GOOD_HEAD + "GPU0\t X \tNV4\t0-7\tnode0\n" + GPU1_ROW, 2, "not a NUMA node list"),
        (GOOD_HEAD + "GPU0\t X \tNV4\t0-7\t0\t\t7\n" + GPU1_ROW, 2, "more trailing values"),
        ("\tGPU0\tNIC0\nGPU0\t X \tPIX\nNIC0\tPIX\t X \t0-7\n", 3, "NIC row NIC0 has values"),
        ("\tGPU0\tGPU NUMA ID\nGPU0\t X \tfour\n", 2, "GPU NUMA ID"),
        ("\tGPU0\nGPU0\t X \t0-7\n", 2, "no trailing columns"),
        (
            GPU_NIC_HEAD + "GPU0\t X \tNV4\tpix\t0-7\t0\n" + "GPU1\tNV4\t X \tPIX\t0-7\t0\n" + NIC_ROW,
            2,
            "'pix' is not a link kind",
        ),
        (
            GPU_NIC_HEAD + "GPU0\t X \tNV4\tPH0-115\t0\n" + "GPU1\tNV4\t X \tPIX\t0-7\t0\n" + NIC_ROW,
            2,
            "merged with the CPU affinity 0-115",
        ),
        (
            GPU_NIC_HEAD
            + "GPU0\t X \tNV4\tPIX\t0-7\t0\n"
            + "GPU1\tNV4\t X \tPIX\t0-7\t0\n"
            + "NIC0\tPIX\tPIX\tNV4\n",
            4,
            "diagonal",
        ),
    ],
)
def test_malformed_cells_outside_the_gpu_block_are_warnings(text: str, line: int, fragment: str) -> None:
    m = parse_topo_matrix(text)
    assert m.gpu_count >= 1
    assert len(m.warnings) == 1, m.warnings
    assert m.warnings[0].startswith(f"line {line}: ")
    assert fragment in m.warnings[0]


def test_every_real_fixture_parses_without_warnings() -> None:
    for path in [*TOPO_FIXTURES, H200_TOPO]:
        assert parse_topo_matrix(path.read_text()).warnings == (), path.name


def test_damaged_copy_keeps_the_gpu_block_and_the_affinity() -> None:
    original = parse_topo_matrix((DATA / "topo" / "13-2x-a100-nv12-5nic.txt").read_text())
    damaged = parse_topo_matrix((DATA / "damaged" / "13-2x-a100-nv12-5nic-merged-affinity.txt").read_text())
    assert damaged.gpus == original.gpus and damaged.gpu_links == original.gpu_links
    assert damaged.cpu_affinity == original.cpu_affinity  # 0-31,64-95 recovered from the merged cell
    assert damaged.numa_affinity == original.numa_affinity
    assert damaged.gpu_numa_id == original.gpu_numa_id
    assert ("GPU0", "NIC4") not in damaged.gpu_nic_links
    assert {k: v for k, v in original.gpu_nic_links.items() if k != ("GPU0", "NIC4")} == damaged.gpu_nic_links
    assert damaged.nic_nic_links[("NIC3", "NIC4")] == "NODE"  # read from NIC4's row instead
    assert len(damaged.warnings) == 2
    assert damaged.warnings[0].startswith("line 2: row GPU0, column NIC4: 'SY0-31,64-95'")
    assert damaged.warnings[1].startswith("line 7: row NIC3, column NIC4: 'NO?E'")

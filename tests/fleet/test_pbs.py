"""PBS / Torque parsing: every qstat and pbsnodes fixture against its oracle, walltime and size tables,
folding, routing and the lane limits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.fleet.pbs import (
    PbsNodeShape,
    PbsParseError,
    PbsQueueLimits,
    neednodes_properties,
    parse_pbs_bool,
    parse_pbs_size,
    parse_pbs_walltime,
    parse_pbsnodes,
    parse_qstat_queues,
    queue_limits,
    queue_node_shape,
    size_mb,
    unfold,
)

DATA = Path(__file__).resolve().parent.parent / "data" / "pbs"
QSTAT = sorted(DATA.glob("qstat-*.txt"))
PBSNODES = sorted(DATA.glob("pbsnodes-*.txt"))


def _sample(prefix: str) -> str:
    (path,) = DATA.glob(f"{prefix}*.txt")
    return path.read_text()


def test_every_sample_is_here() -> None:
    assert (len(QSTAT), len(PBSNODES)) == (4, 5)


@pytest.mark.parametrize("sample", QSTAT, ids=lambda p: p.stem)
def test_qstat_sample_matches_oracle(sample: Path) -> None:
    expected = json.loads(sample.with_suffix(".expected.json").read_text())
    queues = parse_qstat_queues(sample.read_text())
    assert [q.name for q in queues] == [e["queue"] for e in expected["queues"]]
    for queue, want in zip(queues, expected["queues"], strict=True):
        assert queue.attributes == want["attributes"]
        assert queue.enabled is want["enabled"]
        assert queue.started is want["started"]
        assert queue.queue_type == want["queue_type"]
        assert queue.attributes.get("resources_max.walltime") == want["resources_max.walltime"]
        assert queue.max_walltime_s == want["resources_max.walltime_s"]
        assert queue.attributes.get("resources_default.walltime") == want["resources_default.walltime"]
        assert queue.default_walltime_s == want["resources_default.walltime_s"]
        assert queue.max_nodect == want["resources_max.nodect"]
        assert queue.neednodes == want["resources_default.neednodes"]
        if "acl_user_count" in want:
            assert len(queue.attributes["acl_users"].split(",")) == want["acl_user_count"]


def _count(value: str | None) -> int | None:
    return None if value is None else int(value)


def _node_fields(node) -> dict[str, object]:  # type: ignore[no-untyped-def]
    status = node.status
    return {
        "name": node.name,
        "state": node.state,
        "np": node.np,
        "properties": node.properties,
        "ntype": node.attributes.get("ntype"),
        "status_ncpus": int(status["ncpus"]) if "ncpus" in status else None,
        "physmem_raw": status.get("physmem"),
        "physmem_bytes": parse_pbs_size(status["physmem"]) if "physmem" in status else None,
        "physmem_mb": size_mb(status["physmem"]) if "physmem" in status else None,
        "totmem_raw": status.get("totmem"),
        "availmem_raw": status.get("availmem"),
        "gpus": node.attributes.get("gpus") and int(node.attributes["gpus"]),
        "gpu_status_entries": node.gpu_status_entries,
        "jobs_from_status": status.get("jobs"),
        "mom": node.attributes.get("Mom"),
        "pcpus": int(node.attributes["pcpus"]) if "pcpus" in node.attributes else None,
        "ncpus": node.cpus,
        "mem_raw": node.mem_raw,
        "mem_bytes": parse_pbs_size(node.mem_raw),
        "mem_mb": node.mem_mb,
        "ngpus": node.gpus,
        "queue": node.queue,
        "qlist": node.attributes.get("resources_available.qlist"),
        "jobs": node.jobs,
        "assigned_ncpus": _count(node.attributes.get("resources_assigned.ncpus")),
        "assigned_ngpus": _count(node.attributes.get("resources_assigned.ngpus")),
        "assigned_mem_raw": node.attributes.get("resources_assigned.mem"),
    }


@pytest.mark.parametrize("sample", PBSNODES, ids=lambda p: p.stem)
def test_pbsnodes_sample_matches_oracle(sample: Path) -> None:
    expected = json.loads(sample.with_suffix(".expected.json").read_text())
    nodes = parse_pbsnodes(sample.read_text())
    assert len(nodes) == len(expected["nodes"])
    for node, want in zip(nodes, expected["nodes"], strict=True):
        assert node.flavor == expected["flavor"]
        got = _node_fields(node)
        for key, value in want.items():
            assert got[key] == value, f"{sample.name}: {node.name}: {key}"


def test_torque_slots_come_from_np_not_status_ncpus() -> None:
    nodes = {n.name: n for n in parse_pbsnodes(_sample("pbsnodes-01"))}
    assert nodes["node04"].cpus == 28
    assert nodes["node04"].status["ncpus"] == "56"
    assert nodes["node01"].gpus == 0 and nodes["node03"].gpus == 2
    # status values keep their spaces
    assert nodes["node02"].status["sessions"] == "16988 30464"
    assert nodes["node01"].status["uname"].startswith("Linux node01 3.10.0")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30", 30),  # a bare number is seconds (Slurm would read minutes)
        ("0", 0),
        ("30:00", 1800),
        ("01:30", 90),
        ("2:00:00", 7200),
        ("24:00:00", 86400),
        ("336:00:00", 1209600),  # hours are unbounded
        ("7200:00:00", 25920000),
        ("9600:00:00", 34560000),
        ("1:00:00:00", 86400),  # days:hours:minutes:seconds
        ("2:03:04:05", 2 * 86400 + 3 * 3600 + 4 * 60 + 5),
        ("00:00:10.500", 10),  # milliseconds dropped
        ("45.9", 45),
        (" 1:00:00 ", 3600),
    ],
)
def test_pbs_walltime_formats(text: str, seconds: int) -> None:
    assert parse_pbs_walltime(text) == seconds


@pytest.mark.parametrize("text", ["", "abc", "1:2:3:4:5", "-1", "1::2", ":30", "1h", "1-00:00:00", "1:00:"])
def test_bad_pbs_walltimes(text: str) -> None:
    with pytest.raises(PbsParseError):
        parse_pbs_walltime(text)


KB = 1024
MB = 1024**2
GB = 1024**3


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("0", 0),
        ("100", 100),  # no suffix: bytes
        ("100b", 100),
        ("0b", 0),
        ("0kb", 0),
        ("527672492kb", 527672492 * KB),
        ("31922mb", 31922 * MB),
        ("1760gb", 1760 * GB),
        ("2tb", 2 * 1024**4),
        ("1pb", 1024**5),
        ("512g", 512 * GB),  # a multiplier alone
        ("4k", 4 * KB),
        ("3m", 3 * MB),
        ("1t", 1024**4),
        ("2p", 2 * 1024**5),
        ("16GB", 16 * GB),  # case-insensitive
        ("16Gb", 16 * GB),
        ("8KB", 8 * KB),
        ("10w", 80),  # a word is 8 bytes
        ("1kw", 8 * KB),
        ("2mw", 16 * MB),
        ("1gw", 8 * GB),
        ("1TW", 8 * 1024**4),
    ],
)
def test_pbs_size_formats(text: str, size: int) -> None:
    assert parse_pbs_size(text) == size


@pytest.mark.parametrize("text", ["", "kb", "1.5gb", "-1kb", "12xb", "12 kb", "1bb", "1kbw"])
def test_bad_pbs_sizes(text: str) -> None:
    with pytest.raises(PbsParseError):
        parse_pbs_size(text)


@pytest.mark.parametrize(
    ("text", "mb"),
    [("527672492kb", 515305), ("97586176kb", 95299), ("31922mb", 31922), ("1025836kb", 1001), ("2gb", 2048)],
)
def test_size_in_mib_is_floored(text: str, mb: int) -> None:
    assert size_mb(text) == mb


@pytest.mark.parametrize(
    ("text", "value"), [("True", True), ("False", False), ("true", True), ("FALSE", False)]
)
def test_pbs_bool(text: str, value: bool) -> None:
    assert parse_pbs_bool(text) is value


def test_unfold_joins_without_a_separator() -> None:
    assert unfold("    a = Comp\n\tlete:0 \n    b = x,\n\ty\n") == "    a = Complete:0 \n    b = x,y\n"
    assert unfold("a = \\u00e\r\n\t9\r\n") == "a = \\u00e9\n"


def test_folded_escape_is_rejoined_not_decoded() -> None:
    (queue,) = parse_qstat_queues(_sample("qstat-02"))
    assert queue.attributes["comment"].endswith("dlouhodob\\u00e9 v\\u00fdpo\\u010dty na GPU")
    assert queue.attributes["state_count"].endswith("Begun:0 ")


@pytest.mark.parametrize(
    "text",
    [
        "    queue_type = Execution\n",  # attribute before any queue
        "Queue: a\n    nonsense line\n",
        "Something: else\n",
        "Queue: a\n    resources_max.walltime = forever\n",
        "Queue: a\n    enabled = maybe\n",
        "Queue: a\n    resources_max.nodect = many\n",
    ],
)
def test_unparseable_qstat(text: str) -> None:
    with pytest.raises(PbsParseError):
        parse_qstat_queues(text)


@pytest.mark.parametrize(
    "text",
    [
        "     state = free\n",
        "node1\n     np = two\n",
        "node1\n     resources_available.mem = lots\n     resources_available.ncpus = 4\n",
        "node1 extra words\n     np = 2\n",
    ],
)
def test_unparseable_pbsnodes(text: str) -> None:
    with pytest.raises(PbsParseError):
        parse_pbsnodes(text)


def test_a_count_that_is_not_digits_is_named_where_it_stands() -> None:
    with pytest.raises(PbsParseError, match=r"^resources_max\.nodect is not a count: 'many'$"):
        parse_qstat_queues("Queue: a\n    resources_max.nodect = many \n")
    with pytest.raises(PbsParseError, match=r"^node node1: np is not a count: 'two'$"):
        parse_pbsnodes("node1\n     np = two\n")


@pytest.mark.parametrize(
    ("neednodes", "properties"),
    [
        ("gpuQ", ["gpuQ"]),
        ("2:ppn=8:bigmem", ["bigmem"]),
        ("gpuQ:gpus=2+cpuQ", ["gpuQ", "cpuQ"]),
        ("1", []),
        ("ppn=4", []),
    ],
)
def test_neednodes_properties(neednodes: str, properties: list[str]) -> None:
    assert neednodes_properties(neednodes) == properties


def test_torque_queue_routes_by_neednodes_properties() -> None:
    qstat, nodes = _sample("qstat-01"), _sample("pbsnodes-01")
    assert queue_node_shape(qstat, "gpuQ", nodes) == PbsNodeShape(cpus=28, mem_mb=386704, gpus=2, nodes=2)
    assert queue_node_shape(qstat, "cpuQ", nodes) == PbsNodeShape(cpus=28, mem_mb=193185, gpus=0, nodes=2)
    assert queue_limits(qstat, "gpuQ") == PbsQueueLimits(None, None, maintenance=False)


def test_torque_queue_without_neednodes_routes_to_no_node() -> None:
    # qstat-03's queue1 has no neednodes; pbsnodes-02's node carries a "queue1" property, which alone
    # never establishes membership.
    assert queue_node_shape(_sample("qstat-03"), "queue1", _sample("pbsnodes-02")) is None


def test_pbspro_routes_by_the_node_queue_attribute() -> None:
    qstat = "Queue: gpu\n    queue_type = Execution\n    resources_max.walltime = 48:00:00\n" + (
        "    resources_max.nodect = 4\n    enabled = True\n    started = False\n"
    )
    nodes = (
        _sample("pbsnodes-03").rstrip("\n")
        + "\n     queue = gpu\n\n"
        + _sample("pbsnodes-05").rstrip("\n")
        + "\n     queue = gpu\n\n"
        + _sample("pbsnodes-04").replace("node02", "node09").rstrip("\n")
        + "\n     queue = cpu\n"
    )
    assert queue_node_shape(qstat, "gpu", nodes) == PbsNodeShape(cpus=24, mem_mb=95299, gpus=3, nodes=2)
    assert queue_limits(qstat, "gpu") == PbsQueueLimits(172800, 4, maintenance=True)
    # the fixtures' nodes carry no queue attribute: the queue routes to none
    assert queue_node_shape(qstat, "gpu", _sample("pbsnodes-03")) is None


def test_down_and_offline_nodes_are_not_usable() -> None:
    qstat = _sample("qstat-01")
    nodes = _sample("pbsnodes-01").replace("node03\n  state = free", "node03\n  state = down,offline")
    assert queue_node_shape(qstat, "gpuQ", nodes) == PbsNodeShape(cpus=28, mem_mb=386704, gpus=2, nodes=1)


def test_queue_limits_from_folded_pbspro_dump() -> None:
    assert queue_limits(_sample("qstat-02"), "gpu_long") == PbsQueueLimits(1209600, None, False)


def test_default_walltime_is_not_a_maximum() -> None:
    assert queue_limits(_sample("qstat-04"), "Q_IB1").max_walltime_seconds is None


def test_queue_missing_from_qstat() -> None:
    with pytest.raises(PbsParseError):
        queue_limits(_sample("qstat-01"), "nope")

"""Slurm parsing: every sinfo fixture against its oracle, time / count / GRES tables, the shape rule."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from app.fleet.slurm import (
    INFINITE,
    GresEntry,
    JobSize,
    SlurmCount,
    SlurmParseError,
    gres_gpus,
    parse_gres,
    parse_job_size,
    parse_sinfo,
    parse_sinfo_shape,
    parse_slurm_count,
    parse_slurm_time,
    shape_command,
    split_outside_parentheses,
)

DATA = Path(__file__).resolve().parent.parent / "data" / "sinfo"
SAMPLES = sorted(DATA.glob("*.txt"))
# Outputs printed with --noheader need the --format that produced them (from each oracle's "command").
FORMATS = {"06": "%P|%D|%c|%m|%G|%b", "09": "%N,%G"}
ALIASES = {"node": "nodelist"}


def test_every_sample_is_here() -> None:
    assert len(SAMPLES) == 9


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.stem)
def test_sinfo_sample_matches_oracle(sample: Path) -> None:
    expected = json.loads(sample.with_suffix(".expected.json").read_text())
    rows = parse_sinfo(sample.read_text(), FORMATS.get(sample.name[:2]))
    assert len(rows) == len(expected["rows"])
    for row, want in zip(rows, expected["rows"], strict=True):
        got = dataclasses.asdict(row)
        for key, value in want.items():
            actual = got[ALIASES.get(key, key)]
            if key == "gres":
                actual = [{"name": g["name"], "type": g["type"], "count": g["count"]} for g in actual]
            assert actual == value, f"{sample.name}: {key}"
        for absent in expected["target_fields_absent_in_this_format"]:
            assert got[{"time_limit_s": "time_limit_raw"}.get(absent, absent)] is None


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30", 30 * 60),  # M: a bare number is minutes
        ("0", 0),
        ("30:00", 1800),  # M:S
        ("5:30", 330),
        ("2:00:00", 7200),  # H:M:S, no leading zero
        ("02:00:00", 7200),
        ("1:02:03", 3723),
        ("1-0", 86400),  # D-H
        ("2-12", 2 * 86400 + 12 * 3600),
        ("1-02:30", 86400 + 2 * 3600 + 30 * 60),  # D-H:M
        ("1-00:00:00", 86400),  # D-H:M:S
        ("4-00:00:00", 345600),
        ("7-23:59:59", 7 * 86400 + 86399),
        (" 30:00 ", 1800),
        ("infinite", INFINITE),
        ("INFINITE", INFINITE),
        ("UNLIMITED", INFINITE),
        ("unlimited", INFINITE),
        ("n/a", None),
        ("N/A", None),
    ],
)
def test_slurm_time_formats(text: str, seconds: object) -> None:
    assert parse_slurm_time(text) == seconds


def test_zero_time_request_means_no_limit() -> None:
    assert parse_slurm_time("0", zero_is_unlimited=True) == INFINITE
    assert parse_slurm_time("0:00", zero_is_unlimited=True) == INFINITE
    assert parse_slurm_time("10", zero_is_unlimited=True) == 600


@pytest.mark.parametrize(
    "text", ["", "abc", "1:2:3:4", "1-", "-1", "1-2:3:4:5", "1.5", "1:", ":30", "1--2", "1 day", "30m"]
)
def test_bad_slurm_times_are_refused(text: str) -> None:
    with pytest.raises(SlurmParseError):
        parse_slurm_time(text)


@pytest.mark.parametrize(
    ("text", "count"),
    [
        ("36", SlurmCount(36)),
        ("250+", SlurmCount(250, lower_bound=True)),
        ("190000+", SlurmCount(190000, lower_bound=True)),
        ("1K", SlurmCount(1024)),
        ("1.50K", SlurmCount(1536)),
        ("2K+", SlurmCount(2048, lower_bound=True)),
        ("1M", SlurmCount(1024**2)),
    ],
)
def test_slurm_counts(text: str, count: SlurmCount) -> None:
    assert parse_slurm_count(text) == count


@pytest.mark.parametrize("text", ["", "x", "1.3K", "-1", "+5", "1.5"])
def test_bad_slurm_counts(text: str) -> None:
    with pytest.raises(SlurmParseError):
        parse_slurm_count(text)


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("8", JobSize(8, 8)),
        ("1-16", JobSize(1, 16)),
        ("1-infinite", JobSize(1, None)),
        ("1-1K", JobSize(1, 1024)),
        ("1-1.50K", JobSize(1, 1536)),
        ("2-UNLIMITED", JobSize(2, None)),
    ],
)
def test_job_sizes(text: str, size: JobSize) -> None:
    assert parse_job_size(text) == size


@pytest.mark.parametrize(
    ("text", "entries", "gpus"),
    [
        ("(null)", [], 0),
        ("", [], 0),
        ("gpu:4", [GresEntry("gpu", None, 4)], 4),
        ("gpu:tesla:2", [GresEntry("gpu", "tesla", 2)], 2),
        ("gpu:k80:4(S:0-1)", [GresEntry("gpu", "k80", 4, "S:0-1")], 4),
        ("gpu:8(S:0-3)", [GresEntry("gpu", None, 8, "S:0-3")], 8),
        ("gpu:a100:2(S:0,1)", [GresEntry("gpu", "a100", 2, "S:0,1")], 2),
        ("gpu:4,shard:20", [GresEntry("gpu", None, 4), GresEntry("shard", None, 20)], 4),
        ("mps:400", [GresEntry("mps", None, 400)], 0),
        ("gpu:a100:4,gpu:v100:2", [GresEntry("gpu", "a100", 4), GresEntry("gpu", "v100", 2)], 6),
        (
            "gpu:tesla:1,gpu:kepler:1,bandwidth:lustre:no_consume:4G",
            [
                GresEntry("gpu", "tesla", 1),
                GresEntry("gpu", "kepler", 1),
                GresEntry("bandwidth", "lustre", 4 * 1024**3),
            ],
            2,
        ),
        ("gpu:2K", [GresEntry("gpu", None, 2048)], 2048),
        ("gpu", [GresEntry("gpu", None, 1)], 1),
        (
            "gpu:1(IDX:0),shard:8(-/5,5/5,3/5,0/5)",
            [GresEntry("gpu", None, 1, "IDX:0"), GresEntry("shard", None, 8, "-/5,5/5,3/5,0/5")],
            1,
        ),
        ("nic:mlx5:1", [GresEntry("nic", "mlx5", 1)], 0),
    ],
)
def test_gres(text: str, entries: list[GresEntry], gpus: int) -> None:
    assert parse_gres(text) == entries
    assert gres_gpus(entries) == gpus


def test_socket_affinity_is_only_an_s_suffix() -> None:
    assert GresEntry("gpu", None, 1, "S:0-1").socket_affinity == "S:0-1"
    assert GresEntry("gpu", None, 1, "IDX:0").socket_affinity is None


def test_split_only_outside_parentheses() -> None:
    assert split_outside_parentheses("a(1,2),b,c(3,(4,5))") == ["a(1,2)", "b", "c(3,(4,5))"]


@pytest.mark.parametrize("text", ["gpu:4(S:0", ":4", "gpu:4)x("])
def test_bad_gres(text: str) -> None:
    with pytest.raises(SlurmParseError):
        parse_gres(text)


def test_shape_command() -> None:
    assert shape_command("compute") == [
        "sinfo",
        "--noheader",
        "--partition",
        "compute",
        "--format",
        "%c|%m|%G|%l|%s",
    ]


def test_shape_takes_the_smallest_group_per_field() -> None:
    text = "64|512000|gpu:a100:4(S:0-1)|2-00:00:00|1-16\n36+|190000+|gpu:a100:8,shard:32|1-00:00:00|1-8\n"
    shape = parse_sinfo_shape(text)
    assert (shape.cpus, shape.mem_mb, shape.gpus) == (36, 190000, 4)
    assert (shape.max_walltime_seconds, shape.walltime_unlimited, shape.max_nodes) == (86400, False, 8)
    assert shape.groups == 2


def test_shape_mixed_gpu_partition_has_no_gpus() -> None:
    shape = parse_sinfo_shape("32|128000|gpu:4|infinite|1-infinite\n32|128000|(null)|infinite|1-infinite\n")
    assert shape.gpus == 0
    assert (shape.max_walltime_seconds, shape.walltime_unlimited, shape.max_nodes) == (None, True, None)


def test_shape_tightest_finite_limit_beats_infinite() -> None:
    shape = parse_sinfo_shape("8|1000|(null)|infinite|1\n8|1000|(null)|30:00|1-1K\n")
    assert (shape.max_walltime_seconds, shape.walltime_unlimited, shape.max_nodes) == (1800, False, 1)


def test_shape_unknown_limit_is_neither_finite_nor_unlimited() -> None:
    shape = parse_sinfo_shape("8|1000|(null)|n/a|1-infinite\n")
    assert (shape.max_walltime_seconds, shape.walltime_unlimited) == (None, False)


def test_shape_k_suffixed_job_size() -> None:
    assert parse_sinfo_shape("128|256000|(null)|UNLIMITED|1-1.50K\n").max_nodes == 1536


@pytest.mark.parametrize(
    "text",
    [
        "",  # no such partition: sinfo prints nothing
        "\n",
        "8|1000|(null)|30:00\n",  # a field missing
        "8|1000|(null)|soon|1\n",
        "eight|1000|(null)|30:00|1\n",
        "8|1000|(null)|0:00|1\n",  # a zero limit admits no job
        "sinfo: error: invalid partition specified: nope\n",
    ],
)
def test_unparseable_shape(text: str) -> None:
    with pytest.raises(SlurmParseError):
        parse_sinfo_shape(text)


def test_header_formats_need_a_header() -> None:
    with pytest.raises(SlurmParseError):
        parse_sinfo("debug up 30:00 8 idle node[0-7]\n")
    with pytest.raises(SlurmParseError):
        parse_sinfo("PARTITION WHATEVER\nx y\n")

"""Slurm output parsing: time limits, GRES, sinfo tables and the lane shape rule (docs/fleet.md).

Pure: text in, values out. No clock, no I/O. The format rules (with their sources) are in
``docs/fleet.md``; in short:

- Time (``sinfo %l``, ``sbatch --time``, ``slurm.conf MaxTime``): ``M``, ``M:S``, ``H:M:S``, ``D-H``,
  ``D-H:M``, ``D-H:M:S``; ``infinite`` / ``UNLIMITED`` is no limit; ``n/a`` is unknown.
- GRES: ``name[:type][:no_consume]:count[K|M|G|T|P][(S:..)]``, lists split on commas outside
  parentheses, ``(null)`` is none; only ``gpu`` entries count as GPUs (``shard``/``mps`` do not).
- Numbers (``%c``, ``%m``, ``%s``): a ``K`` suffix multiplies by 1024 (``1.50K`` = 1536); a trailing
  ``+`` marks the minimum of a folded row (a lower bound).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Literal

from app.errors import quote_input

INFINITE: Literal["infinite"] = "infinite"
"""Marker for an unlimited time limit or job size (``infinite`` / ``UNLIMITED``)."""

TimeLimit = int | Literal["infinite"] | None
"""A parsed time limit: seconds, :data:`INFINITE`, or ``None`` when sinfo printed ``n/a`` (unknown)."""

SHAPE_FORMAT = "%c|%m|%G|%l|%s"
"""The ``sinfo --format`` the lane shape rule reads: cpus | memory MiB | GRES | time limit | job size."""


class SlurmParseError(ValueError):
    """Text that is not valid Slurm output; the message says what and where."""


# --- time ---------------------------------------------------------------------------------------

_TIME_RE = re.compile(
    r"""^(?:
        (?P<days>\d+)-(?P<dh>\d+)(?::(?P<dm>\d+)(?::(?P<ds>\d+))?)?   # D-H, D-H:M, D-H:M:S
      | (?P<a>\d+)(?::(?P<b>\d+)(?::(?P<c>\d+))?)?                     # M, M:S, H:M:S
    )$""",
    re.VERBOSE,
)


def parse_slurm_time(text: str, *, zero_is_unlimited: bool = False) -> TimeLimit:
    """A Slurm time string as seconds (int), :data:`INFINITE`, or ``None`` for ``n/a``.

    Accepts every sbatch ``--time`` format: ``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``, ``D-H:M:S``
    (a bare number is minutes, ``30:00`` is 30 minutes, ``2:00:00`` two hours), ``infinite`` /
    ``UNLIMITED`` (any case) and ``n/a``. ``zero_is_unlimited`` applies sbatch's rule that a zero
    request means no limit; a partition limit printed as ``0:00`` stays 0. docs/explain.md.
    Raises :class:`SlurmParseError` on anything else.
    """
    raw = text.strip()
    lowered = raw.lower()
    if lowered in ("infinite", "unlimited"):
        return INFINITE
    if lowered == "n/a":
        return None
    match = _TIME_RE.match(raw)
    if match is None:
        raise SlurmParseError(f"not a Slurm time: {quote_input(text)}")
    if match.group("days") is not None:
        seconds = (
            int(match.group("days")) * 86400
            + int(match.group("dh")) * 3600
            + int(match.group("dm") or 0) * 60
            + int(match.group("ds") or 0)
        )
    else:
        a, b, c = match.group("a"), match.group("b"), match.group("c")
        if c is not None:  # H:M:S
            seconds = int(a) * 3600 + int(b) * 60 + int(c)
        elif b is not None:  # M:S
            seconds = int(a) * 60 + int(b)
        else:  # M
            seconds = int(a) * 60
    if seconds == 0 and zero_is_unlimited:
        return INFINITE
    return seconds


# --- numbers ------------------------------------------------------------------------------------

_UNIT = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}
_NUMBER_RE = re.compile(r"^(?P<num>\d+(?:\.\d+)?)(?P<unit>[KMGTP]?)(?P<plus>\+?)$")


@dataclass(frozen=True)
class SlurmCount:
    """A count sinfo printed: ``value`` and whether a ``+`` marked it as the minimum of a folded row."""

    value: int
    lower_bound: bool = False


def parse_slurm_count(text: str) -> SlurmCount:
    """``"36"`` -> 36, ``"250+"`` -> 250 (lower bound), ``"1K"`` -> 1024, ``"1.50K"`` -> 1536.

    sinfo prints ``%c``/``%s`` values of at least 1024 that are multiples of 512 with a K suffix
    (``convert_num_unit``); M/G/T/P follow the same 1024 steps. docs/explain.md.
    """
    match = _NUMBER_RE.match(text.strip())
    if match is None:
        raise SlurmParseError(f"not a Slurm count: {quote_input(text)}")
    try:
        scaled = Decimal(match.group("num")) * _UNIT[match.group("unit")]
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only decimals
        raise SlurmParseError(f"not a Slurm count: {quote_input(text)}") from exc
    if scaled != scaled.to_integral_value():
        raise SlurmParseError(f"not a whole count: {quote_input(text)}")
    return SlurmCount(int(scaled), lower_bound=bool(match.group("plus")))


@dataclass(frozen=True)
class JobSize:
    """``%s``: minimum nodes and maximum nodes (``None`` when unlimited)."""

    min_nodes: int
    max_nodes: int | None


def parse_job_size(text: str) -> JobSize:
    """``"8"`` -> 8..8, ``"1-16"`` -> 1..16, ``"1-infinite"`` -> 1..unlimited, ``"1-1K"`` -> 1..1024."""
    raw = text.strip()
    low, sep, high = raw.partition("-")
    min_nodes = parse_slurm_count(low).value
    if not sep:
        return JobSize(min_nodes, min_nodes)
    if high.lower() in ("infinite", "unlimited"):
        return JobSize(min_nodes, None)
    return JobSize(min_nodes, parse_slurm_count(high).value)


# --- GRES ---------------------------------------------------------------------------------------


def split_outside_parentheses(text: str, separator: str = ",") -> list[str]:
    """Split on ``separator`` only outside parentheses: ``gpu:1(IDX:0,1),shard:2`` -> two items."""
    items: list[str] = []
    depth = 0
    current: list[str] = []
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth = max(0, depth - 1)
        if char == separator and depth == 0:
            items.append("".join(current))
            current = []
        else:
            current.append(char)
    items.append("".join(current))
    return items


@dataclass(frozen=True)
class GresEntry:
    """One GRES entry: ``name`` (``gpu``, ``shard``, ``mps``, ...), optional ``type``, ``count`` and
    the parenthesised suffix (``S:0-1`` socket affinity, ``IDX:0`` in GresUsed)."""

    name: str
    type: str | None
    count: int
    suffix: str | None = None

    @property
    def socket_affinity(self) -> str | None:
        """The ``S:...`` suffix, when the entry carries one."""
        return self.suffix if self.suffix and self.suffix.startswith("S:") else None


_GRES_ENTRY_RE = re.compile(r"^(?P<body>[^()]+?)(?:\((?P<suffix>[^()]*)\))?$")
_GRES_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_./-]*$")


def parse_gres(text: str) -> list[GresEntry]:
    """A GRES list (``%G``, ``-O Gres``, ``GresUsed``) as entries. ``(null)`` and empty are none.

    Entry syntax (slurm.conf ``Gres=``): ``name[:type][:no_consume]:count[K|M|G|T|P]``, optionally
    followed by ``(S:0-1)`` / ``(IDX:...)``; a missing count is 1. docs/explain.md.
    """
    raw = text.strip()
    if raw in ("", "(null)"):
        return []
    entries: list[GresEntry] = []
    for item in split_outside_parentheses(raw):
        item = item.strip()
        if item in ("", "(null)"):
            continue
        match = _GRES_ENTRY_RE.match(item)
        if match is None:
            raise SlurmParseError(f"not a GRES entry: {quote_input(item)}")
        parts = [p for p in match.group("body").split(":") if p != "no_consume"]
        name = parts[0]
        if not _GRES_NAME_RE.match(name):
            raise SlurmParseError(f"not a GRES name: {quote_input(item)}")
        count = 1
        rest = parts[1:]
        if rest and _NUMBER_RE.match(rest[-1]) and not rest[-1].endswith("+"):
            count = parse_slurm_count(rest[-1]).value
            rest = rest[:-1]
        gres_type = ":".join(rest) or None
        entries.append(GresEntry(name, gres_type, count, match.group("suffix")))
    return entries


def gres_gpus(entries: list[GresEntry]) -> int:
    """Whole GPUs in a GRES list: the sum of ``gpu`` entry counts (``shard``/``mps`` are not GPUs)."""
    return sum(entry.count for entry in entries if entry.name == "gpu")


# --- sinfo tables -------------------------------------------------------------------------------

# format letter / -O field / header -> our field name
_FORMAT_FIELDS = {
    "P": "partition",
    "R": "partition",
    "a": "avail",
    "l": "time_limit",
    "s": "job_size",
    "r": "root",
    "h": "oversubscribe",
    "g": "groups",
    "D": "nodes",
    "t": "state",
    "T": "state",
    "N": "nodelist",
    "c": "cpus",
    "m": "memory",
    "d": "tmp_disk",
    "w": "weight",
    "f": "features",
    "b": "features",
    "E": "reason",
    "G": "gres",
}
_HEADER_FIELDS = {
    "PARTITION": "partition",
    "AVAIL": "avail",
    "TIMELIMIT": "time_limit",
    "JOB_SIZE": "job_size",
    "ROOT": "root",
    "OVERSUBS": "oversubscribe",
    "GROUPS": "groups",
    "NODES": "nodes",
    "STATE": "state",
    "NODELIST": "nodelist",
    "CPUS": "cpus",
    "MEMORY": "memory",
    "TMP_DISK": "tmp_disk",
    "WEIGHT": "weight",
    "FEATURES": "features",
    "AVAIL_FEATURES": "features",
    "ACTIVE_FEATURES": "features",
    "REASON": "reason",
    "GRES": "gres",
    "GRES_USED": "gres_used",
}


@dataclass
class SinfoRow:
    """One sinfo output row; fields a format does not print stay ``None``.

    ``time_limit_s`` is seconds, or ``None`` for infinite/n/a (``time_limit_raw`` tells them apart);
    ``mem_mb`` and ``tmp_disk_mb`` are MiB; ``cpus_lower_bound``/``mem_lower_bound`` record a ``+``.
    """

    partition: str | None = None
    default_partition: bool | None = None
    avail: str | None = None
    time_limit_raw: str | None = None
    time_limit_s: int | None = None
    job_size_raw: str | None = None
    min_nodes: int | None = None
    max_nodes: int | None = None
    root: str | None = None
    oversubscribe: str | None = None
    groups: str | None = None
    nodes: int | None = None
    state: str | None = None
    state_not_responding: bool | None = None
    nodelist: str | None = None
    cpus: int | None = None
    cpus_lower_bound: bool = False
    mem_mb: int | None = None
    mem_lower_bound: bool = False
    tmp_disk_mb: int | None = None
    weight: int | None = None
    features: list[str] | None = None
    reason: str | None = None
    gres_raw: str | None = None
    gres: list[GresEntry] | None = None
    gpus: int | None = None
    gpu_type: str | None = None
    gpu_socket_affinity: str | None = None
    gres_used_raw: str | None = None
    gpus_used: int | None = None
    time_limit: TimeLimit = field(default=None, repr=False)


def _apply(row: SinfoRow, name: str, value: str) -> None:
    value = value.strip()
    if name == "partition":
        row.default_partition = value.endswith("*")
        row.partition = value.rstrip("*")
    elif name == "time_limit":
        row.time_limit_raw = value
        row.time_limit = parse_slurm_time(value)
        row.time_limit_s = row.time_limit if isinstance(row.time_limit, int) else None
    elif name == "job_size":
        row.job_size_raw = value
        size = parse_job_size(value)
        row.min_nodes, row.max_nodes = size.min_nodes, size.max_nodes
    elif name == "state":
        row.state_not_responding = value.endswith("*")
        row.state = value.rstrip("*")
    elif name == "nodes":
        row.nodes = parse_slurm_count(value).value
    elif name == "cpus":
        count = parse_slurm_count(value)
        row.cpus, row.cpus_lower_bound = count.value, count.lower_bound
    elif name == "memory":
        count = parse_slurm_count(value)
        row.mem_mb, row.mem_lower_bound = count.value, count.lower_bound
    elif name == "tmp_disk":
        row.tmp_disk_mb = parse_slurm_count(value).value
    elif name == "weight":
        row.weight = parse_slurm_count(value).value
    elif name == "features":
        row.features = None if value == "(null)" else [f for f in value.split(",") if f]
    elif name == "reason":
        row.reason = None if value in ("(null)", "none") else value
    elif name == "gres":
        row.gres_raw = value
        row.gres = parse_gres(value)
        row.gpus = gres_gpus(row.gres)
        gpu_entries = [e for e in row.gres if e.name == "gpu"]
        row.gpu_type = gpu_entries[0].type if gpu_entries else None
        row.gpu_socket_affinity = gpu_entries[0].socket_affinity if gpu_entries else None
    elif name == "gres_used":
        row.gres_used_raw = value
        row.gpus_used = gres_gpus(parse_gres(value))
    else:
        setattr(row, name, value)


def _format_fields(fmt: str) -> tuple[list[str], str | None]:
    """``"%P|%D|%c"`` -> (field names, separator); width/justify modifiers such as ``%20P`` are allowed.
    A ``None`` separator means fields are separated by whitespace."""
    tokens = re.findall(r"%[.\-]?\d*([A-Za-z])", fmt)
    if not tokens:
        raise SlurmParseError(f"not a sinfo format: {quote_input(fmt)}")
    names = []
    for letter in tokens:
        if letter not in _FORMAT_FIELDS:
            raise SlurmParseError(f"unsupported sinfo format field %{letter}")
        names.append(_FORMAT_FIELDS[letter])
    between = re.split(r"%[.\-]?\d*[A-Za-z]", fmt)[1:-1]
    separators = {s for s in between}
    if separators and all(s.strip() == "" for s in separators):
        return names, None
    if len(separators) != 1:
        raise SlurmParseError(f"sinfo format needs one separator between fields: {quote_input(fmt)}")
    return names, separators.pop()


def _split_row(line: str, count: int, separator: str | None) -> list[str]:
    # The last field takes the rest of the line: a comma-separated format is unambiguous only when
    # the field that may contain commas (GRES, features) comes last.
    cells = line.split(separator, count - 1) if separator else line.split(None, count - 1)
    if len(cells) != count:
        raise SlurmParseError(f"expected {count} fields, got {len(cells)}: {quote_input(line)}")
    return cells


def parse_sinfo(text: str, fmt: str | None = None) -> list[SinfoRow]:
    """Rows of sinfo output in any of its table formats.

    With ``fmt`` (``--format`` string such as ``"%P|%D|%c|%m|%G|%b"``) the output has no header
    (``--noheader``); without it, the header line names the columns (default, ``--long``, ``-Nel``,
    ``-O``), and a ``--long`` date line before it is skipped. Cells are split by whitespace or by the
    format's separator. Raises :class:`SlurmParseError` on a row that does not fit.
    """
    lines = [line.rstrip("\r") for line in text.splitlines()]
    lines = [line for line in lines if line.strip()]
    rows: list[SinfoRow] = []
    if fmt is not None:
        names, separator = _format_fields(fmt)
        data = lines
    else:
        header_index = next(
            (i for i, line in enumerate(lines) if line.split() and line.split()[0] in _HEADER_FIELDS),
            None,
        )
        if header_index is None:
            raise SlurmParseError("no sinfo header line")
        headers = lines[header_index].split()
        unknown = [h for h in headers if h not in _HEADER_FIELDS]
        if unknown:
            raise SlurmParseError(f"unknown sinfo columns: {', '.join(unknown)}")
        names, separator = [_HEADER_FIELDS[h] for h in headers], None
        data = lines[header_index + 1 :]
    for line in data:
        row = SinfoRow()
        for name, cell in zip(names, _split_row(line, len(names), separator), strict=True):
            _apply(row, name, cell)
        rows.append(row)
    return rows


# --- the lane shape rule ------------------------------------------------------------------------


@dataclass(frozen=True)
class SlurmShape:
    """What ``--scheduler-shape`` sets on a Slurm lane (docs/fleet.md).

    ``cpus``/``mem_mb``/``gpus``: per field, the smallest node group (MiB for memory), so a job sized
    by them fits any node. ``max_walltime_seconds``: the tightest finite time limit; ``None`` with
    ``walltime_unlimited`` when every group is infinite, ``None`` without it when unknown (``n/a``).
    ``max_nodes``: the tightest finite job size, ``None`` when unlimited (keep the base record).
    """

    cpus: int
    mem_mb: int
    gpus: int
    max_walltime_seconds: int | None
    walltime_unlimited: bool
    max_nodes: int | None
    groups: int


def shape_command(queue: str) -> list[str]:
    """The argv run on a Slurm host: ``sinfo --noheader --partition QUEUE --format '%c|%m|%G|%l|%s'``."""
    return ["sinfo", "--noheader", "--partition", queue, "--format", SHAPE_FORMAT]


def parse_sinfo_shape(text: str) -> SlurmShape:
    """The lane shape from ``sinfo --noheader --partition QUEUE --format '%c|%m|%G|%l|%s'`` output.

    One line per node group ``cpus|mem_mb|gres|time limit|job size``. A ``+`` is a lower bound and is
    used as the group's value. A zero time limit admits no job and is refused, as is a group with 0 CPUs or
    0 MB (an unconfigured node, not a shape). Raises
    :class:`SlurmParseError` on empty output (no such partition) or a line that does not parse.
    """
    rows = parse_sinfo(text, SHAPE_FORMAT)
    if not rows:
        raise SlurmParseError("sinfo printed no node group for the partition")
    cpus = min(row.cpus for row in rows if row.cpus is not None)
    mem_mb = min(row.mem_mb for row in rows if row.mem_mb is not None)
    gpus = min(row.gpus or 0 for row in rows)
    if cpus == 0 or mem_mb == 0:
        raise SlurmParseError("sinfo reported a node group with 0 cpus or 0 MB of memory")
    limits = [row.time_limit for row in rows]
    finite = [limit for limit in limits if isinstance(limit, int)]
    if any(limit == 0 for limit in finite):
        raise SlurmParseError("the partition's time limit is 0: no job can run")
    unlimited = all(limit == INFINITE for limit in limits)
    max_walltime = min(finite) if finite else None
    sizes = [row.max_nodes for row in rows if row.max_nodes is not None]
    return SlurmShape(
        cpus=cpus,
        mem_mb=mem_mb,
        gpus=gpus,
        max_walltime_seconds=max_walltime,
        walltime_unlimited=unlimited,
        max_nodes=min(sizes) if sizes else None,
        groups=len(rows),
    )

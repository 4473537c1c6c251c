"""PBS Pro / Torque output parsing: ``qstat -Qf``, ``pbsnodes -a``, walltime and size values, and the
lane shape rule (docs/fleet.md).

Pure: text in, values out. Format rules and their sources are in ``docs/fleet.md``:

- ``qstat -f`` folds long values onto lines that start with a TAB; rejoin by deleting ``"\\n\\t"``
  (no separator), then read ``Queue: NAME`` blocks of ``key = value`` lines (indent width varies).
- Walltime: ``[[[days:]hours:]minutes:]seconds[.fraction]``; hours are unbounded, a bare number is
  seconds (unlike Slurm, where it is minutes).
- Size: ``integer[suffix]``, suffix ``b``/``w`` with an optional ``k m g t p`` multiplier (1024 steps),
  or the multiplier letter alone; case-insensitive; no suffix is bytes; a word is 8 bytes.
- ``pbsnodes -a``: a node-name line, then indented ``key = value`` lines. Torque: ``np``,
  ``properties``, ``status`` (``k=v`` comma list; ``physmem``), ``gpus``. PBS Pro:
  ``resources_available.{ncpus,mem,ngpus}``, ``queue``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from app.errors import quote_input


class PbsParseError(ValueError):
    """Text that is not valid PBS/Torque output; the message says what and where."""


T = TypeVar("T")


# --- values ---------------------------------------------------------------------------------------

_WALLTIME_RE = re.compile(r"^\d+(?::\d+){0,3}(?:\.\d+)?$")


def parse_pbs_walltime(text: str) -> int:
    """A PBS walltime as whole seconds: ``[[[days:]hours:]minutes:]seconds[.fraction]``.

    ``"30"`` = 30 s, ``"30:00"`` = 30 min, ``"336:00:00"`` = 14 days, ``"1:00:00:00"`` = 1 day; a
    fraction of a second is dropped (a maximum is never rounded up). docs/explain.md.
    Raises :class:`PbsParseError` on anything else.
    """
    raw = text.strip()
    if not _WALLTIME_RE.match(raw):
        raise PbsParseError(f"not a PBS walltime: {quote_input(text)}")
    whole = raw.split(".", 1)[0]
    seconds = 0
    for part, scale in zip(reversed(whole.split(":")), (1, 60, 3600, 86400), strict=False):
        seconds += int(part) * scale
    return seconds


_SIZE_RE = re.compile(r"^(?P<num>\d+)(?P<mult>[kmgtp]?)(?P<unit>[bw]?)$", re.IGNORECASE)
_MULTIPLIER = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4, "p": 1024**5}
WORD_BYTES = 8
"""Bytes in a PBS ``w`` (word) unit: the 64-bit word size."""


def parse_pbs_size(text: str) -> int:
    """A PBS size as bytes: ``527672492kb``, ``31922mb``, ``1760gb``, ``0b``, ``512g``, ``4kw``, ``100``.

    Suffixes are case-insensitive: ``b`` bytes (default), ``w`` words (8 bytes), each with an optional
    ``k m g t p`` multiplier (1024, 1024^2, ...); a multiplier alone means bytes (docs/fleet.md).
    Raises :class:`PbsParseError` on anything else.
    """
    match = _SIZE_RE.match(text.strip())
    if match is None:
        raise PbsParseError(f"not a PBS size: {quote_input(text)}")
    unit = WORD_BYTES if match.group("unit").lower() == "w" else 1
    return int(match.group("num")) * _MULTIPLIER[match.group("mult").lower()] * unit


def size_mb(text: str) -> int:
    """A PBS size in whole MiB (floored): ``527672492kb`` -> 515305."""
    return parse_pbs_size(text) // (1024 * 1024)


def parse_pbs_bool(text: str) -> bool:
    """``True``/``False`` (any case; also ``1``/``0``, ``t``/``f``, ``yes``/``no``)."""
    lowered = text.strip().lower()
    if lowered in ("true", "t", "1", "yes", "y"):
        return True
    if lowered in ("false", "f", "0", "no", "n"):
        return False
    raise PbsParseError(f"not a PBS boolean: {quote_input(text)}")


# --- key = value blocks -------------------------------------------------------------------------


def unfold(text: str) -> str:
    """Rejoin ``qstat -f`` / ``pbsnodes`` continuation lines: delete every ``"\\n\\t"``, no separator
    added (a fold can fall mid-token, even inside a ``\\u00e9`` escape)."""
    return text.replace("\r\n", "\n").replace("\n\t", "")


_ATTRIBUTE_RE = re.compile(r"^[ \t]+(?P<key>[A-Za-z_][\w.]*) = ?(?P<value>.*)$")


def _attribute(attributes: Mapping[str, str], key: str) -> str | None:
    """The value of ``key`` as printed, stripped (``None`` when not printed)."""
    value = attributes.get(key)
    return None if value is None else value.strip()


def _count(value: str, what: str) -> int:
    """A whole count (digits only); raises :class:`PbsParseError` ``<what> is not a count: ...``."""
    if not value.isdigit():
        raise PbsParseError(f"{what} is not a count: {quote_input(value)}")
    return int(value)


def _blocks(text: str, header: re.Pattern[str], what: str) -> list[tuple[str, dict[str, str]]]:
    blocks: list[tuple[str, dict[str, str]]] = []
    for number, line in enumerate(unfold(text).split("\n"), start=1):
        if not line.strip():
            continue
        if not line[0].isspace():
            match = header.match(line)
            if match is None:
                raise PbsParseError(f"line {number}: expected a {what} line, got {quote_input(line)}")
            blocks.append((match.group("name"), {}))
            continue
        attribute = _ATTRIBUTE_RE.match(line)
        if attribute is None:
            raise PbsParseError(f"line {number}: expected 'key = value', got {quote_input(line)}")
        if not blocks:
            raise PbsParseError(f"line {number}: attribute before any {what} line")
        # Values keep trailing blanks (state_count ends with one); only the line break is removed.
        blocks[-1][1][attribute.group("key")] = attribute.group("value")
    return blocks


def _parsed(attributes: Mapping[str, str], key: str, parse: Callable[[str], T]) -> T | None:
    """``parse`` of the attribute ``key``, stripped (``None`` when not printed)."""
    value = _attribute(attributes, key)
    return None if value is None else parse(value)


def _comma_items(value: str) -> list[str]:
    """A printed comma list's items, stripped, empty ones dropped."""
    return [item.strip() for item in value.split(",") if item.strip()]


# --- qstat -Qf ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PbsQueue:
    """One queue of ``qstat -Qf``: its ``name`` and raw ``attributes`` (values as printed, folds
    rejoined), with the fields the lane rule reads, parsed when the queue is read (``None`` = not
    printed): ``enabled``, ``started``, ``queue_type`` (``Execution`` or ``Route``),
    ``max_walltime_s`` (``resources_max.walltime`` in seconds), ``default_walltime_s``
    (``resources_default.walltime`` in seconds: a default, never a maximum), ``max_nodect``
    (``resources_max.nodect``: most nodes one job may have) and ``neednodes``
    (``resources_default.neednodes``: Torque lane membership)."""

    name: str
    attributes: dict[str, str]
    enabled: bool | None
    started: bool | None
    queue_type: str | None
    max_walltime_s: int | None
    default_walltime_s: int | None
    max_nodect: int | None
    neednodes: str | None


def _queue(name: str, attributes: dict[str, str]) -> PbsQueue:
    """The :class:`PbsQueue` of one ``Queue: NAME`` block; a malformed value raises :class:`PbsParseError`."""
    nodect = "resources_max.nodect"
    return PbsQueue(
        name,
        attributes,
        enabled=_parsed(attributes, "enabled", parse_pbs_bool),
        started=_parsed(attributes, "started", parse_pbs_bool),
        queue_type=_attribute(attributes, "queue_type"),
        max_walltime_s=_parsed(attributes, "resources_max.walltime", parse_pbs_walltime),
        default_walltime_s=_parsed(attributes, "resources_default.walltime", parse_pbs_walltime),
        max_nodect=_parsed(attributes, nodect, lambda value: _count(value, nodect)),
        neednodes=_attribute(attributes, "resources_default.neednodes"),
    )


_QUEUE_RE = re.compile(r"^Queue:\s*(?P<name>\S+)\s*$")


def parse_qstat_queues(text: str) -> list[PbsQueue]:
    """``qstat -Qf [QUEUE]`` output as queues, in printed order. Raises :class:`PbsParseError` when a
    line is neither ``Queue: NAME`` nor an indented ``key = value``, or a value does not parse."""
    return [_queue(name, attributes) for name, attributes in _blocks(text, _QUEUE_RE, "'Queue: NAME'")]


# --- pbsnodes -a --------------------------------------------------------------------------------

Flavor = Literal["torque", "pbspro"]


def parse_torque_status(text: str) -> dict[str, str]:
    """Torque ``status``: a comma list of ``k=v`` (values may hold spaces: ``sessions=1720 7063``)."""
    status: dict[str, str] = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if sep:
            status[key.strip()] = value
    return status


@dataclass
class PbsNode:
    """One node of ``pbsnodes -a``: ``name`` (the header line), raw ``attributes`` and the derived
    fields. ``cpus`` (slots: ``np`` or ``resources_available.ncpus``), ``mem_mb`` (MiB:
    ``resources_available.mem`` or Torque ``status physmem``), ``gpus`` (``gpus`` or
    ``resources_available.ngpus``; absent = 0)."""

    name: str
    attributes: dict[str, str]
    status: dict[str, str] = field(default_factory=dict)

    @property
    def flavor(self) -> Flavor:
        """``pbspro`` when the node carries ``resources_available.*``, else ``torque``."""
        if any(key.startswith("resources_available.") for key in self.attributes):
            return "pbspro"
        return "torque"

    @property
    def state(self) -> str | None:
        """``state`` as printed (may be a comma list, e.g. ``down,offline``)."""
        return _attribute(self.attributes, "state")

    @property
    def properties(self) -> list[str]:
        """Torque ``properties`` (comma list)."""
        return _comma_items(self.attributes.get("properties", ""))

    @property
    def queue(self) -> str | None:
        """PBS Pro ``queue`` attribute (the queue this node is associated with)."""
        return _attribute(self.attributes, "queue")

    def _int(self, key: str) -> int | None:
        return _parsed(self.attributes, key, lambda value: _count(value, f"node {self.name}: {key}"))

    @property
    def np(self) -> int | None:
        """Torque slots ``np``."""
        return self._int("np")

    @property
    def cpus(self) -> int | None:
        """Slots a job can get: ``resources_available.ncpus`` (PBS Pro) or ``np`` (Torque)."""
        if self.flavor == "pbspro":
            return self._int("resources_available.ncpus")
        return self.np

    @property
    def mem_raw(self) -> str | None:
        """The memory figure as printed: ``resources_available.mem`` or Torque ``status physmem``."""
        value = self.attributes.get("resources_available.mem") or self.status.get("physmem")
        return None if value is None else value.strip()

    @property
    def mem_mb(self) -> int | None:
        """Memory in MiB (floored)."""
        raw = self.mem_raw
        return None if raw is None else size_mb(raw)

    @property
    def gpus(self) -> int:
        """Whole GPUs: ``gpus`` (Torque) or ``resources_available.ngpus`` (PBS Pro); absent is 0."""
        value = self._int("gpus")
        if value is None:
            value = self._int("resources_available.ngpus")
        return value or 0

    @property
    def jobs(self) -> list[str]:
        """PBS Pro ``jobs`` (``", "``-separated ``jobid/slot`` list); ``[]`` when absent."""
        return _comma_items(self.attributes.get("jobs", ""))

    @property
    def gpu_status_entries(self) -> int | None:
        """Number of ``gpu[N]=`` entries in Torque ``gpu_status`` (``None`` when absent)."""
        value = self.attributes.get("gpu_status")
        if value is None:
            return None
        return len(re.findall(r"(?:^|,)gpu\[\d+\]=", value))

    @property
    def usable(self) -> bool:
        """A node a job could be given: its state names none of ``down``, ``offline``, ``unknown``,
        ``state-unknown``, ``stale``, ``unresolvable``, ``maintenance``, ``sleep``, ``provisioning``,
        ``wait-provisioning``, ``initializing``, and it records nonzero cpus and memory."""
        words = {w.strip().lower() for w in (self.state or "").split(",")}
        if words & UNUSABLE_STATES:
            return False
        return bool(self.cpus) and bool(self.mem_mb)


UNUSABLE_STATES = frozenset(
    {
        "down",
        "offline",
        "unknown",
        "state-unknown",
        "stale",
        "unresolvable",
        "maintenance",
        "sleep",
        "provisioning",
        "wait-provisioning",
        "initializing",
    }
)

_NODE_RE = re.compile(r"^(?P<name>\S+)\s*$")


def parse_pbsnodes(text: str) -> list[PbsNode]:
    """``pbsnodes -a`` (Torque or PBS Pro) output as nodes, in printed order. Raises
    :class:`PbsParseError` on a line that is neither a node name nor an indented ``key = value``,
    or on a malformed count or size."""
    nodes = []
    for name, attributes in _blocks(text, _NODE_RE, "node name"):
        status = parse_torque_status(attributes["status"]) if "status" in attributes else {}
        node = PbsNode(name, attributes, status)
        _ = (node.cpus, node.mem_mb, node.gpus)  # surface malformed values now
        nodes.append(node)
    return nodes


# --- the lane shape rule ------------------------------------------------------------------------


def neednodes_properties(neednodes: str) -> list[str]:
    """The node properties a Torque ``resources_default.neednodes`` names.

    A node spec is ``+``-joined parts of ``:``-separated tokens; counts (``2``) and resources
    (``ppn=8``, ``gpus=2``) are not properties, every other token is (``gpuQ``, ``2:ppn=8:bigmem``).
    """
    properties: list[str] = []
    for part in neednodes.split("+"):
        for token in part.split(":"):
            token = token.strip()
            if not token or token.isdigit() or "=" in token:
                continue
            if token not in properties:
                properties.append(token)
    return properties


def routed_nodes(queue: PbsQueue, nodes: list[PbsNode]) -> list[PbsNode]:
    """The usable nodes ``queue`` routes to (docs/fleet.md): Torque nodes carrying every property of the
    queue's ``resources_default.neednodes`` (no neednodes routes to none: never inferred from
    properties alone); PBS Pro nodes whose ``queue`` attribute is the queue's name."""
    routed: list[PbsNode] = []
    for node in nodes:
        if not node.usable:
            continue
        if node.flavor == "pbspro":
            if node.queue == queue.name:
                routed.append(node)
        else:
            wanted = neednodes_properties(queue.neednodes or "")
            if wanted and all(p in node.properties for p in wanted):
                routed.append(node)
    return routed


def _queue_named(qstat_text: str, queue_name: str) -> PbsQueue:
    """The queue ``queue_name`` of ``qstat -Qf`` output; raises :class:`PbsParseError` when the output
    does not parse or does not list it."""
    queues = {queue.name: queue for queue in parse_qstat_queues(qstat_text)}
    queue = queues.get(queue_name)
    if queue is None:
        raise PbsParseError(f"qstat lists no queue {quote_input(queue_name)}")
    return queue


@dataclass(frozen=True)
class PbsQueueLimits:
    """What ``qstat -Qf QUEUE`` sets on a lane: ``max_walltime_seconds`` (``resources_max.walltime``;
    ``None`` keeps the base record), ``max_nodes`` (``resources_max.nodect``), ``maintenance`` (True
    when ``enabled`` or ``started`` is false)."""

    max_walltime_seconds: int | None
    max_nodes: int | None
    maintenance: bool


def queue_limits(qstat_text: str, queue_name: str) -> PbsQueueLimits:
    """The lane's limits from ``qstat -Qf QUEUE`` output. Raises :class:`PbsParseError` when the
    output does not parse or does not list the queue."""
    queue = _queue_named(qstat_text, queue_name)
    walltime = queue.max_walltime_s
    if walltime == 0:
        raise PbsParseError(f"queue {queue_name}: resources_max.walltime is 0")
    nodect = queue.max_nodect
    return PbsQueueLimits(
        max_walltime_seconds=walltime,
        max_nodes=nodect if nodect else None,
        maintenance=queue.enabled is False or queue.started is False,
    )


@dataclass(frozen=True)
class PbsNodeShape:
    """The smallest routed node: ``cpus`` (count), ``mem_mb`` (MiB), ``gpus`` (count), over ``nodes``
    routed usable nodes."""

    cpus: int
    mem_mb: int
    gpus: int
    nodes: int


def queue_node_shape(qstat_text: str, queue_name: str, pbsnodes_text: str) -> PbsNodeShape | None:
    """Per field, the smallest of the usable nodes the queue routes to; ``None`` when it routes to
    none (the caller keeps the base node record). Raises :class:`PbsParseError` on unparsable text."""
    routed = routed_nodes(_queue_named(qstat_text, queue_name), parse_pbsnodes(pbsnodes_text))
    if not routed:
        return None
    return PbsNodeShape(
        cpus=min(node.cpus or 0 for node in routed),
        mem_mb=min(node.mem_mb or 0 for node in routed),
        gpus=min(node.gpus for node in routed),
        nodes=len(routed),
    )


def qstat_command(queue: str) -> list[str]:
    """The argv run on a PBS host for the queue: ``qstat -Qf QUEUE``."""
    return ["qstat", "-Qf", queue]


def pbsnodes_command() -> list[str]:
    """The argv run on a PBS host for the nodes: ``pbsnodes -a``."""
    return ["pbsnodes", "-a"]

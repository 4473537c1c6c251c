"""The two input documents of docs/explain.md: ``vq.placement-fleet/1`` and ``vq.placement-request/1``.

docs/explain.md, "The fields". The models record what the documents say and refuse what they cannot mean;
they never fill in a missing capability. An
omitted (or null) optional field is *unknown*, and the explain step rejects a target whose unknown
capability the request needs ("Stale or unknown essential capability is a rejection, never a fallback").

Validation rules (also written in ``docs/explain.md``):

* Labels (program names, queue, accounts, os, arch, ISA levels, data-access and license labels) are one
  case-sensitive token of 1-128 characters: a letter or digit, then letters, digits, ``. _ + -``. No
  whitespace, commas, slashes or colons, so no paths, URLs, lists or scheduler expressions. Every label
  list holds at most 256 entries and no duplicates.
* Runtime digests are tokens of 1-200 characters (letters, digits, ``. _ : + -``), e.g. a 64-hex sha256,
  ``sha256:<hex>`` or a portable runtime's artifact id. A program lists 1-256 distinct digests; the first
  is its current runtime.
* Target names are logical names of 1-200 characters (letters, digits, ``. _ + / : @ -``), unique in a
  fleet.
* Integers are JSON integers (``16``, not ``16.0``, ``"16"`` or ``true``); other figures (rates, waits,
  runtimes, MB of input and output) are finite JSON numbers. Times are ISO 8601 with a UTC offset.
* Unknown fields are refused (a misspelt field would otherwise read as "unknown" and silently reject).
* ``speed_factor`` needs its ``speed_source``; both omitted means 1.0 ``assumed``.
* A daemon host is one node: it declares no ``queue``, and ``max_nodes`` only as 1. A scheduler lane has
  no ``free``.

Errors: :func:`load_fleet` and :func:`load_request` raise :class:`app.errors.InvalidInput` whose ``path``
names the field, e.g. ``targets.3.node.cpus`` or ``runtime_seconds.high``.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Annotated, Any, Literal, Self, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)

from app.errors import InvalidInput, quote_input
from app.jsonnum import num

M = TypeVar("M", bound=BaseModel)

FLEET_SCHEMA = "vq.placement-fleet/1"
REQUEST_SCHEMA = "vq.placement-request/1"

MAX_LABELS = 256
"""docs/explain.md: each data-access / license label list holds at most 256 labels (applied to every list)."""

LABEL_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$"
DIGEST_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:+-]{0,199}$"
TARGET_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._+/:@-]{0,199}$"


class FieldError(ValueError):
    """A model-level check that names the field at fault (``field`` is a dotted suffix of the model's
    path). :func:`as_invalid_input` appends it to the location pydantic reports."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


def _number(value: Any) -> Any:
    """A finite JSON number (int or float); refuses booleans, strings, NaN and infinities."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError("must be a number")
    if not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value


def _aware_datetime(value: Any) -> Any:
    """An ISO 8601 time with a UTC offset (``2026-10-12T11:59:00+00:00`` or ``...Z``)."""
    if isinstance(value, datetime):
        parsed = value
    elif isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            raise ValueError("must be an ISO 8601 time such as 2026-10-12T11:59:00+00:00") from None
    else:
        raise ValueError("must be an ISO 8601 time string")
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        raise ValueError("must carry a UTC offset, e.g. +00:00")
    return parsed


Label = Annotated[str, StringConstraints(strict=True, pattern=LABEL_PATTERN)]
Digest = Annotated[str, StringConstraints(strict=True, pattern=DIGEST_PATTERN)]
TargetName = Annotated[str, StringConstraints(strict=True, pattern=TARGET_NAME_PATTERN)]
LabelList = Annotated[list[Label], Field(max_length=MAX_LABELS)]
PositiveInt = Annotated[StrictInt, Field(gt=0)]
NonNegativeInt = Annotated[StrictInt, Field(ge=0)]
PositiveNumber = Annotated[float, BeforeValidator(_number), Field(gt=0)]
NonNegativeNumber = Annotated[float, BeforeValidator(_number), Field(ge=0)]
AwareDatetime = Annotated[datetime, BeforeValidator(_aware_datetime)]


def _no_duplicates(values: list[str] | None) -> list[str] | None:
    if values is not None:
        seen: set[str] = set()
        for index, value in enumerate(values):
            if value in seen:
                raise FieldError(str(index), f"duplicate label {quote_input(value)}")
            seen.add(value)
    return values


class _Document(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Interval(_Document):
    """An interval ``[low, high]`` (a subclass narrows the two numbers): ``low <= high``, else a
    :class:`FieldError` on ``high``."""

    low: float
    high: float

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.low > self.high:
            raise FieldError("high", "must be at least low")
        return self


class NodeShape(_Document):
    """One compute node as one job gets it (docs/explain.md: never the cluster's total, never the login node).

    ``cpus`` (count), ``mem_mb`` (MB), ``scratch_mb`` (MB per job per node after quota; 0 = none),
    ``gpus`` (whole GPUs; 0 = none). ``None`` = unknown.
    """

    cpus: PositiveInt | None = None
    mem_mb: PositiveInt | None = None
    scratch_mb: NonNegativeInt | None = None
    gpus: NonNegativeInt | None = None


class FreeCapacity(_Document):
    """A daemon host's capacity right now: ``cpus`` (count), ``mem_mb`` (MB), optional ``scratch_mb``
    (unreserved scratch headroom, MB) and ``gpus`` (devices not assigned to a job). ``None`` = unknown."""

    cpus: NonNegativeInt
    mem_mb: NonNegativeInt
    scratch_mb: NonNegativeInt | None = None
    gpus: NonNegativeInt | None = None


class QueueWait(_Interval):
    """A queue-wait interval in seconds, ``low <= high``, with its source (docs/explain.md: ``history``,
    ``declared`` or ``scheduler-estimate``)."""

    low: NonNegativeNumber
    high: NonNegativeNumber
    source: Literal["history", "declared", "scheduler-estimate"]


class FleetTarget(_Document):
    """One target of ``vq.placement-fleet/1``: a daemon host, or a scheduler lane (a partition or queue
    with one node shape). docs/explain.md. Optional fields left out (or null) are unknown.

    Units: ``*_mb`` in MB, ``*_seconds`` in seconds, ``*_mb_per_second`` in MB/s; ``speed_factor`` is
    execution speed relative to the request's reference estimate (runtime / speed_factor).
    """

    name: TargetName
    kind: Literal["daemon", "scheduler"]
    observed_at: AwareDatetime | None = None
    reachable: StrictBool | None = None
    maintenance: StrictBool = False
    os: Label | None = None
    arch: Label | None = None
    isa_levels: LabelList | None = None
    programs: dict[Label, Annotated[list[Digest], Field(min_length=1, max_length=MAX_LABELS)]] = Field(
        default_factory=dict
    )
    accounts: LabelList | None = None
    queue: Label | None = None
    data_access: LabelList | None = None
    licenses: LabelList | None = None
    node: NodeShape | None = None
    max_nodes: PositiveInt | None = None
    max_walltime_seconds: PositiveInt | None = None
    walltime_unlimited: StrictBool = False
    free: FreeCapacity | None = None
    queue_wait_seconds: QueueWait | None = None
    speed_factor: PositiveNumber = 1.0
    speed_source: Literal["benchmark", "declared", "assumed"] | None = None

    staging_mb_per_second: PositiveNumber | None = None
    transfer_mb_per_second: PositiveNumber | None = None

    @field_validator("isa_levels", "accounts", "data_access", "licenses")
    @classmethod
    def _distinct_labels(cls, labels: list[str] | None) -> list[str] | None:
        return _no_duplicates(labels)

    @field_validator("programs")
    @classmethod
    def _distinct_digests(cls, programs: dict[str, list[str]]) -> dict[str, list[str]]:
        for program, digests in programs.items():
            try:
                _no_duplicates(digests)
            except FieldError as error:
                raise FieldError(f"{program}.{error.field}", "duplicate runtime digest") from None
        return programs

    @model_validator(mode="before")
    @classmethod
    def _speed_source_default(cls, data: Any) -> Any:
        if (
            isinstance(data, dict)
            and data.get("speed_source") is None
            and data.get("speed_factor") is not None
        ):
            raise FieldError("speed_source", "is required with speed_factor")
        return data

    @model_validator(mode="after")
    def _consistent(self) -> FleetTarget:
        if self.speed_source is None:
            # both omitted: 1.0 assumed; set without marking the field as given, so a rewritten fleet
            # (dump_document(only_given=True)) keeps the record as it was written
            object.__setattr__(self, "speed_source", "assumed")
        if self.walltime_unlimited and self.max_walltime_seconds is not None:
            raise FieldError("walltime_unlimited", "cannot be combined with max_walltime_seconds")
        if self.kind == "daemon":
            if self.queue is not None:
                raise FieldError("queue", "a daemon host cannot declare a queue")
            if self.max_nodes is not None and self.max_nodes != 1:
                raise FieldError("max_nodes", "a daemon host is one node")
        elif self.free is not None:
            raise FieldError("free", "a scheduler lane has no free capacity; use queue_wait_seconds")
        return self

    @property
    def job_max_nodes(self) -> int | None:
        """Most nodes one job may have: 1 on a daemon host, ``max_nodes`` (or unknown) on a lane."""
        return 1 if self.kind == "daemon" else self.max_nodes


class PlacementFleet(_Document):
    """``vq.placement-fleet/1``: ``{schema_name, targets: [FleetTarget]}`` with unique target names."""

    schema_name: Literal["vq.placement-fleet/1"]
    targets: list[FleetTarget] = Field(max_length=1_000_000)

    @model_validator(mode="after")
    def _unique_names(self) -> PlacementFleet:
        seen: set[str] = set()
        for index, target in enumerate(self.targets):
            if target.name in seen:
                raise FieldError(f"targets.{index}.name", f"duplicate target name {quote_input(target.name)}")
            seen.add(target.name)
        return self


class RuntimeRange(_Interval):
    """Execution time in seconds on a speed-1.0 target, ``0 < low <= high`` (docs/explain.md:
    runtime_seconds)."""

    low: PositiveNumber
    high: PositiveNumber


class PlacementRequestDoc(_Document):
    """``vq.placement-request/1`` (docs/explain.md): one job's needs.

    ``cpus`` is the total; ``nodes`` (default 1) the node count; ``mem_mb_per_node``,
    ``scratch_mb_per_node`` in MB per node; ``gpus_per_node`` whole GPUs per node;
    ``wall_time_seconds`` the limit asked at submission; ``runtime_seconds`` the execution interval on a
    speed-1.0 target; ``input_mb`` / ``output_mb`` data staged in and transferred back (MB). ``mpi_ranks``
    and ``threads_per_rank`` come together with ``cpus = mpi_ranks * threads_per_rank`` and at least one
    rank per node. Omitted optional fields add no constraint (``mem_mb_per_node`` and
    ``runtime_seconds`` may be filled from a calibrated estimate).
    """

    schema_name: Literal["vq.placement-request/1"]
    program: Label
    runtime_digest: Digest | None = None
    os: Label | None = None
    isa_level: Label | None = None
    account: Label | None = None
    queue: Label | None = None
    required_data_access: LabelList | None = None
    required_licenses: LabelList | None = None
    cpus: PositiveInt
    nodes: PositiveInt = 1
    mem_mb_per_node: PositiveInt | None = None
    mpi_ranks: PositiveInt | None = None
    threads_per_rank: PositiveInt | None = None
    scratch_mb_per_node: PositiveInt | None = None
    gpus_per_node: PositiveInt | None = None
    wall_time_seconds: PositiveInt | None = None
    runtime_seconds: RuntimeRange | None = None
    input_mb: NonNegativeNumber | None = None
    output_mb: NonNegativeNumber | None = None

    @field_validator("required_data_access", "required_licenses")
    @classmethod
    def _distinct_labels(cls, labels: list[str] | None) -> list[str] | None:
        return _no_duplicates(labels)

    @model_validator(mode="after")
    def _layout(self) -> PlacementRequestDoc:
        if (self.mpi_ranks is None) != (self.threads_per_rank is None):
            missing = "threads_per_rank" if self.threads_per_rank is None else "mpi_ranks"
            raise FieldError(missing, "mpi_ranks and threads_per_rank must be given together")
        if self.mpi_ranks is not None and self.threads_per_rank is not None:
            if self.cpus != self.mpi_ranks * self.threads_per_rank:
                raise FieldError(
                    "cpus",
                    f"must equal mpi_ranks * threads_per_rank = {self.mpi_ranks * self.threads_per_rank}",
                )
            if self.mpi_ranks < self.nodes:
                raise FieldError("mpi_ranks", f"needs at least one rank per node ({self.nodes} nodes)")
        return self

    @property
    def cpus_per_node(self) -> int:
        """CPUs each node must have (docs/explain.md): ``ceil(mpi_ranks / nodes) * threads_per_rank`` for a
        declared whole-rank layout, else ``ceil(cpus / nodes)``."""
        if self.mpi_ranks is not None and self.threads_per_rank is not None:
            return -(-self.mpi_ranks // self.nodes) * self.threads_per_rank
        return -(-self.cpus // self.nodes)


_PATTERN_SHAPES = {
    LABEL_PATTERN: "a label (1-128 characters: a letter or digit, then letters, digits, '.', '_', '+', '-')",
    DIGEST_PATTERN: "a runtime digest (1-200 characters: letters, digits, '.', '_', ':', '+', '-')",
    TARGET_NAME_PATTERN: "a target name (1-200 characters: letters, digits, '.', '_', '+', '/', ':', '@', "
    "'-')",
}


def _path(loc: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in loc)


def validated(model: type[M], data: Any, what: str) -> M:
    """``model.model_validate(data)``; a validation error raised as :func:`as_invalid_input` (``what``
    names the document in the message: ``fleet``, ``request``, ``job history``, ...)."""
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise as_invalid_input(error, what) from None


def as_invalid_input(error: ValidationError, what: str) -> InvalidInput:
    """The first validation error as :class:`InvalidInput` naming the field; all errors in details."""
    problems: list[dict[str, str]] = []
    for item in error.errors(include_url=False):
        loc = tuple(item["loc"])
        cause = (item.get("ctx") or {}).get("error")
        message = item["msg"]
        if isinstance(cause, FieldError):
            loc = loc + tuple(cause.field.split("."))
            message = cause.message
        elif message.startswith("Value error, "):
            message = message[len("Value error, ") :]
        elif item["type"] == "string_pattern_mismatch":
            shape = _PATTERN_SHAPES.get(str((item.get("ctx") or {}).get("pattern")), "the allowed syntax")
            message = f"{quote_input(item['input'])} is not {shape}"
        elif item["type"] == "extra_forbidden":
            message = "unknown field"
        elif item["type"] == "missing":
            message = "is required"
        problems.append({"path": _path(loc), "message": message})
    first = problems[0]
    where = first["path"] or "(document)"
    message = f"{what}: {where}: {first['message']}"
    return InvalidInput(message, path=first["path"], details={"errors": problems})


def _check_schema_name(data: Any, expected: str, what: str) -> None:
    if not isinstance(data, dict):
        raise InvalidInput(f"{what}: the document must be a JSON object", path="")
    name = data.get("schema_name")
    if name != expected:
        shown = "missing" if name is None else repr(name)
        raise InvalidInput(f"{what}: schema_name: {shown}, want {quote_input(expected)}", path="schema_name")


def load_fleet(data: dict[str, Any]) -> PlacementFleet:
    """Validate a parsed ``vq.placement-fleet/1`` JSON object.

    Raises :class:`InvalidInput` (``path`` such as ``targets.3.node.cpus``) for anything malformed,
    including an unknown or missing ``schema_name``. Nothing is guessed or filled.
    """
    _check_schema_name(data, FLEET_SCHEMA, "fleet")
    return validated(PlacementFleet, data, "fleet")


def load_request(data: dict[str, Any]) -> PlacementRequestDoc:
    """Validate a parsed ``vq.placement-request/1`` JSON object.

    Raises :class:`InvalidInput` (``path`` such as ``runtime_seconds.high`` or ``cpus``) for anything
    malformed, including an unknown or missing ``schema_name``.
    """
    _check_schema_name(data, REQUEST_SCHEMA, "request")
    return validated(PlacementRequestDoc, data, "request")


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, float):
        return num(value)
    return value


def dump_document(document: BaseModel, *, only_given: bool = False) -> dict[str, Any]:
    """A validated document (fleet, target, request) as its JSON object: unknown (None) fields left
    out, times as ISO 8601 with their offset, integral figures as integers. ``load_fleet(dump_document(
    fleet)) == fleet``. ``only_given`` also leaves out fields the document did not state (defaults such
    as ``maintenance: false``), so a rewritten fleet keeps each record as it was written."""
    return _plain(document.model_dump(mode="python", exclude_none=True, exclude_unset=only_given))


def parse_instant(value: str, name: str = "now") -> datetime:
    """An ISO 8601 time that carries a UTC offset (``--now``, ``now``); raises InvalidInput(path=name)
    for anything else. Reading the clock when it is omitted is the caller's job (this module is pure)."""
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidInput(f"{name}: {quote_input(value)} is not an ISO 8601 time", path="now") from None
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        raise InvalidInput(f"{name}: {quote_input(value)} must carry a UTC offset, e.g. +00:00", path="now")
    return parsed

"""The reservation / preview request body and its validation (docs/api.md).

``ReservationRequest`` is the JSON body of ``POST /v1/reservations`` and ``POST /v1/capacity/preview``
(camelCase as in the spec). ``to_placement_request`` turns a validated body into the frozen
:class:`~app.placement.model.PlacementRequest` the pipeline takes. Every malformed input raises
pydantic's ``ValidationError`` (the API maps it to 422 ``INVALID_INPUT`` with the field path) or
:class:`~app.errors.InvalidInput` with ``path`` set; nothing here touches a database.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from app.errors import InvalidInput, quote_input
from app.ids import TenantId
from app.jsonnum import JsonDecimal, num
from app.placement.model import (
    COMPARISON_OPS,
    MAX_EXPRESSIONS,
    MAX_VALUES,
    SET_OPS,
    DeviceRequest,
    Gang,
    MatchExpression,
    PlacementRequest,
    Selector,
)
from app.placement.operands import KEY_RE, parse_decimal_operand
from app.placement.selectors import parse_selector
from app.placement.system_labels import required_capabilities

IDEMPOTENCY_KEY_RE = r"^[A-Za-z0-9._:-]{1,128}$"
DURATION_RE = re.compile(r"^\s*(\d+)\s*([smhdw]?)\s*$")
# the same form for the OpenAPI document (ASCII digits, and the count above zero)
DURATION_PATTERN = r"^\s*0*[1-9][0-9]*\s*[smhdw]?\s*$"
DURATION_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
MAX_DURATION_SECONDS = 366 * 86400
MAX_DEVICE_COUNT = 4096
MAX_KEY_LENGTH = 253  # a selector key
# a window lies within years 1970..9999 (UTC): later ends cannot be represented (Python's datetime stops
# at 9999-12-31), earlier starts are no reservation anyone makes
FIRST_WINDOW_YEAR, LAST_WINDOW_YEAR = 1970, 9999
# ``start: "earliest"``: the first window within the lead at which the request fits (docs/lifecycle.md,
# "Earliest start")
EARLIEST = "earliest"


def window_end(start: datetime, seconds: int) -> datetime | None:
    """``start + seconds`` in UTC, or None when the window leaves years 1970..9999."""
    try:
        utc_start = start.astimezone(UTC)
        end = utc_start + timedelta(seconds=seconds)
    except OverflowError:
        return None
    if utc_start.year < FIRST_WINDOW_YEAR or end.year > LAST_WINDOW_YEAR:
        return None
    return end


def deadline_passed(deadline: datetime | None, start: datetime) -> bool:
    """True when a window starting at ``start`` may not be taken because of the reservation's
    ``deadline``: the start is at or after it (docs/lifecycle.md, "Deadlines"). At its deadline a
    reservation still waiting is due to be ended, so the deadline instant itself is too late."""
    return deadline is not None and start >= deadline


def parse_duration(value: str | int) -> int:
    """Seconds from ``'90m'``, ``'1d'``, ``'3d'``, ``'2h'``, ``'30s'``, ``'1w'`` or a whole number of
    seconds. Raises ``ValueError`` for anything else, zero, or more than 366 days."""
    if isinstance(value, bool):
        raise ValueError("duration must be like '90m', '1d' or a number of seconds")
    if isinstance(value, int):
        seconds = value
    else:
        m = DURATION_RE.match(value)
        if not m:
            raise ValueError("duration must be like '90m', '2h', '1d' or a number of seconds")
        seconds = int(m.group(1)) * DURATION_UNITS[m.group(2)]
    if seconds <= 0:
        raise ValueError("duration must be positive")
    if seconds > MAX_DURATION_SECONDS:
        raise ValueError("duration must be at most 366 days")
    return seconds


class MatchExpressionBody(BaseModel):
    """One matchExpression: ``{key, op, values?}`` (docs/placement-rules.md, "Device fit and selectors")."""

    model_config = ConfigDict(extra="forbid")

    key: str = Field(json_schema_extra={"pattern": KEY_RE.pattern, "maxLength": MAX_KEY_LENGTH})
    op: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Gte", "Lt", "Lte"]
    values: list[str | int | float] | None = Field(default=None, json_schema_extra={"maxItems": MAX_VALUES})

    @field_validator("key")
    @classmethod
    def _key_syntax(cls, key: str) -> str:
        if not KEY_RE.match(key) or len(key) > MAX_KEY_LENGTH:
            raise ValueError("a key starts with a letter and holds letters, digits, '.', '_', '/', '-'")
        return key

    @model_validator(mode="after")
    def _values_fit_op(self) -> MatchExpressionBody:
        values = self.values or []
        if len(values) > MAX_VALUES:
            raise ValueError(f"at most {MAX_VALUES} values per expression")
        if self.op in SET_OPS and not values:
            raise ValueError(f"{self.op} needs at least one value")
        if self.op in ("Exists", "DoesNotExist") and values:
            raise ValueError(f"{self.op} takes no values")
        if self.op in COMPARISON_OPS:
            if len(values) != 1:
                raise ValueError(f"{self.op} takes exactly one value")
            if parse_decimal_operand(values[0]) is None:
                raise ValueError(f"{self.op} needs a number, got {quote_input(values[0])}")
        return self

    def to_expression(self) -> MatchExpression:
        """The frozen pipeline form: strings for In/NotIn, one Decimal for comparisons."""
        values = self.values or []
        if self.op in COMPARISON_OPS:
            operand = parse_decimal_operand(values[0])
            assert operand is not None
            return MatchExpression(self.key, self.op, (operand,))
        return MatchExpression(self.key, self.op, tuple(_as_label_text(v) for v in values))


def _as_label_text(value: str | int | float) -> str:
    """In/NotIn compare as strings; a JSON number compares by its shortest text (80 -> '80')."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


class SelectorBody(BaseModel):
    """``{matchExpressions: [...]}``; at most 32 expressions."""

    model_config = ConfigDict(extra="forbid")

    matchExpressions: list[MatchExpressionBody] = Field(default_factory=list, max_length=MAX_EXPRESSIONS)

    def to_selector(self) -> Selector:
        return Selector(tuple(e.to_expression() for e in self.matchExpressions))


class DeviceRequestBody(BaseModel):
    """``{class, count, selector?, topology?}``; ``selector`` may also be the shorthand string."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    device_class: str = Field(alias="class", min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9._-]*$")
    count: int = Field(ge=1, le=MAX_DEVICE_COUNT, strict=True)  # strict: true is not 1
    selector: SelectorBody | str | None = None
    topology: Literal["nvlink-all"] | None = None

    @field_validator("selector", mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                parsed = parse_selector(value)
            except InvalidInput as exc:  # keep the 0-based position for the API's error details
                raise PydanticCustomError(
                    "selector_syntax", "{reason}", {"reason": exc.message, **exc.details}
                ) from exc
            return selector_body_from(parsed)
        return value

    def to_device_request(self) -> DeviceRequest:
        selector = self.selector.to_selector() if isinstance(self.selector, SelectorBody) else None
        if selector is not None and not selector.match_expressions:
            selector = None
        return DeviceRequest(self.device_class, self.count, selector, self.topology)


def selector_body_from(selector: Selector | None) -> dict[str, Any] | None:
    """The JSON form ``{matchExpressions: [...]}`` of a frozen selector (numbers stay numbers)."""
    if selector is None:
        return None
    out = []
    for e in selector.match_expressions:
        item: dict[str, Any] = {"key": e.key, "op": e.op}
        if e.values:
            item["values"] = [str(v) if isinstance(v, Decimal) else v for v in e.values]
        out.append(item)
    return {"matchExpressions": out}


class GangBody(BaseModel):
    """``{members, topologyKey?}``."""

    model_config = ConfigDict(extra="forbid")

    members: int = Field(ge=1, le=1024, strict=True)
    topologyKey: str | None = Field(default=None, pattern=KEY_RE.pattern)


ResourceAmount = Annotated[
    Decimal, JsonDecimal(gt=0, max_digits=20, decimal_places=6, numbers_only=True)
]  # a JSON number > 0 with at most 14 whole digits and 6 decimal places


DURATION_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {"type": "string", "pattern": DURATION_PATTERN},
        {"type": "integer", "minimum": 1, "maximum": MAX_DURATION_SECONDS},
    ],
    "description": "'90m', '2h', '1d', '1w', '30s' or a whole number of seconds; at most 366 days",
}


class ReservationRequest(BaseModel):
    """The body of ``POST /v1/reservations`` and ``POST /v1/capacity/preview`` (docs/api.md).

    At least one device or resource; ``duration`` is ``'90m'``, ``'1d'`` or seconds; ``start`` defaults
    to the database's now. ``deadline``, when given, is after ``start``: the latest instant a window may
    start (:func:`deadline_passed`). ``nodeLabels`` is refused: only modules set it through the capacity port.
    """

    model_config = ConfigDict(extra="forbid")

    tenantId: TenantId
    poolId: str = Field(min_length=1, max_length=128)
    devices: list[DeviceRequestBody] = Field(default_factory=list, max_length=16)
    resources: dict[Annotated[str, Field(pattern=r"^[a-z][a-z0-9._/-]*$", max_length=64)], ResourceAmount] = (
        Field(default_factory=dict)
    )
    start: datetime | Literal["earliest"] | None = Field(
        default=None,
        description="ISO 8601 with a UTC offset, in years 1970..9999; absent: the database's now; "
        "'earliest': the first window within BC_CAPACITY_MAX_LEAD at which it fits",
    )
    duration: Annotated[StrictStr | StrictInt, WithJsonSchema(DURATION_SCHEMA)]  # a boolean is neither
    deadline: datetime | None = Field(
        default=None,
        description="ISO 8601 with a UTC offset, after start, in years 1970..9999: a reservation still "
        "pending or queued then is ended (DeadlinePassed); absent: it waits without end",
    )
    binding: Literal["device", "node", "kubernetes"] = "device"
    gang: GangBody | None = None
    spot: StrictBool = False
    idempotencyKey: str = Field(pattern=IDEMPOTENCY_KEY_RE)

    @field_validator("start")
    @classmethod
    def _aware(cls, value: datetime | str | None) -> datetime | str | None:
        if not isinstance(value, datetime):
            return value  # None or "earliest"
        if value.tzinfo is None:
            raise ValueError("start needs a timezone, e.g. 2026-12-01T12:00:00Z")
        if window_end(value, 0) is None:
            raise ValueError(f"start must lie in years {FIRST_WINDOW_YEAR}..{LAST_WINDOW_YEAR} (UTC)")
        return value

    @field_validator("duration")
    @classmethod
    def _duration(cls, value: str | int, info: ValidationInfo) -> str | int:
        seconds = parse_duration(value)
        start = info.data.get("start")  # validated before duration (field order)
        if isinstance(start, datetime) and window_end(start, seconds) is None:
            raise ValueError(f"start + duration ends after year {LAST_WINDOW_YEAR}")
        return value

    @field_validator("deadline")
    @classmethod
    def _deadline(cls, value: datetime | None, info: ValidationInfo) -> datetime | None:
        if value is None:
            return value
        if value.tzinfo is None:
            raise ValueError("deadline needs a timezone, e.g. 2026-12-01T12:00:00Z")
        if window_end(value, 0) is None:
            raise ValueError(f"deadline must lie in years {FIRST_WINDOW_YEAR}..{LAST_WINDOW_YEAR} (UTC)")
        start = info.data.get("start")  # validated before deadline (field order)
        if isinstance(start, datetime) and value <= start:
            raise ValueError(f"deadline must be after start ({start.isoformat()})")
        return value

    @model_validator(mode="after")
    def _claims_something(self) -> ReservationRequest:
        if not self.devices and not self.resources:
            raise ValueError("a request claims at least one device or resource")
        classes = [d.device_class for d in self.devices]
        if len(set(classes)) != len(classes):
            raise ValueError("each device class appears once in devices")
        return self

    @property
    def fixed_start(self) -> datetime | None:
        """The explicit start, or None (absent, or ``"earliest"``)."""
        return self.start if isinstance(self.start, datetime) else None

    @property
    def earliest(self) -> bool:
        """``start: "earliest"``: search the first window that fits (docs/lifecycle.md)."""
        return self.start == EARLIEST

    @property
    def duration_seconds(self) -> int:
        return parse_duration(self.duration)

    def spec(self) -> dict[str, Any]:
        """The canonical JSON spec stored with a reservation and compared for idempotent retries."""
        # the retry key and a create's plan token are not part of the request (docs/api.md, "Plan tokens")
        spec = self.model_dump(mode="json", by_alias=True, exclude={"idempotencyKey", "ifPlan"})
        spec["resources"] = {name: num(amount) for name, amount in self.resources.items()}
        if spec["deadline"] is None:  # absent, as in the specs stored before deadlines: same hash
            del spec["deadline"]
        return spec


# ``<base64url(payload)>.<base64url(signature)>`` (docs/api.md, "Plan tokens"); a gang's is the longest
PLAN_TOKEN_PATTERN = r"^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$"
MAX_PLAN_TOKEN_LENGTH = 262_144


class CreateReservationRequest(ReservationRequest):
    """The body of ``POST /v1/reservations``: a :class:`ReservationRequest` and, optionally, ``ifPlan``,
    the plan token of a preview of the same body: the create commits exactly that plan or answers 412
    PLAN_STALE (docs/api.md, "Plan tokens"). Not part of the stored spec nor of its hash."""

    ifPlan: str | None = Field(
        default=None,
        min_length=3,
        max_length=MAX_PLAN_TOKEN_LENGTH,
        pattern=PLAN_TOKEN_PATTERN,
        description="A planToken of POST /v1/capacity/preview for this body (idempotencyKey aside): "
        "commit exactly that plan (node, atoms, window, amounts) or answer 412 PLAN_STALE; never "
        "placed elsewhere",
    )


def to_placement_request(
    body: ReservationRequest,
    now: datetime,
    *,
    enforce_device_limits: bool = False,
    node_labels: Mapping[str, str] | None = None,
) -> PlacementRequest:
    """The pipeline's request for ``body``; ``now`` (the database clock) is the default start.

    This is where a request gets its ``node_labels``, so every path that builds a PlacementRequest from a
    reservation body (create, preview, and re-place / repair, which rebuild it from the stored spec) asks
    for the same ones: ``node_labels`` a module sets through the capacity port, plus capacity's own
    requiredCapabilities (:func:`app.placement.system_labels.required_capabilities`: ``binding:
    kubernetes`` -> ``bc.dev/cap.binding.kubernetes: '*'``; host resources ->
    ``bc.dev/cap.devices.limits: '*'`` when ``enforce_device_limits``)."""
    start = body.fixed_start or now  # "earliest" searches from now
    wanted = dict(node_labels or {})
    wanted.update(
        required_capabilities(body.binding, body.resources, enforce_device_limits=enforce_device_limits)
    )
    return PlacementRequest(
        tenant_id=body.tenantId,
        pool_id=body.poolId,
        devices=tuple(d.to_device_request() for d in body.devices),
        resources=dict(body.resources),
        start=start,
        end=start + timedelta(seconds=body.duration_seconds),
        binding=body.binding,
        gang=Gang(body.gang.members, body.gang.topologyKey) if body.gang else None,
        spot=body.spot,
        node_labels=wanted,
    )

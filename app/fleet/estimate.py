"""``vq.calibrated-estimate/1`` and how it fills a placement request (docs/explain.md).

``docs/calibrated-estimate.md`` defines them and this
module validates exactly that shape. Only fields the request leaves unset are filled; an explicit value
always wins and is reported as kept:

* ``runtime_seconds`` <- ``{low: runtime.receipt_low_seconds, high: runtime.calibrated_high_seconds}``
  when ``runtime.calibrated`` is true; otherwise not filled, with the calibration's own reason.
* ``mem_mb_per_node`` <- ``ceil(peak_memory.peak_bytes / 2**20)`` (MiB, the unit of the ``*_mb`` fields)
  when the calibrated peak describes one node: ``scope`` ``node``, or ``job`` on a single-node request.
  A ``rank`` peak, or a ``job`` peak on a multi-node request, is not per-node memory and is not used.

A raw estimate receipt (``vq.estimate-receipt/1``) is refused; so is an estimate for another program.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, StrictBool, model_validator

from app.errors import InvalidInput, quote_input
from app.fleet.documents import (
    Digest,
    FieldError,
    Label,
    PlacementRequestDoc,
    PositiveInt,
    PositiveNumber,
    RuntimeRange,
    validated,
)

ESTIMATE_SCHEMA = "vq.calibrated-estimate/1"
RAW_RECEIPT_SCHEMA = "vq.estimate-receipt/1"
MIB = 1024 * 1024
MAX_REASON_LENGTH = 500


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _reason_rules(calibrated: bool, reason: str | None) -> None:
    if calibrated and reason is not None:
        raise FieldError("reason", "only an uncalibrated figure carries a reason")
    if not calibrated and (reason is None or not reason.strip()):
        raise FieldError("reason", "an uncalibrated figure must say why")
    if reason is not None and len(reason) > MAX_REASON_LENGTH:
        raise FieldError("reason", f"at most {MAX_REASON_LENGTH} characters")


class RuntimeCalibration(_Section):
    """The estimate's runtime in seconds on a speed-1.0 target.

    ``receipt_low_seconds`` / ``receipt_high_seconds``: the receipt's interval; ``calibrated_high_seconds``:
    the calibrated upper bound (present exactly when ``calibrated``); ``reason``: why the calibration left
    the runtime uncalibrated (present exactly when not ``calibrated``).
    """

    calibrated: StrictBool
    receipt_low_seconds: PositiveNumber
    receipt_high_seconds: PositiveNumber
    calibrated_high_seconds: PositiveNumber | None = None
    reason: str | None = None

    @model_validator(mode="after")
    def _consistent(self) -> RuntimeCalibration:
        if self.receipt_low_seconds > self.receipt_high_seconds:
            raise FieldError("receipt_high_seconds", "must be at least receipt_low_seconds")
        if self.calibrated:
            if self.calibrated_high_seconds is None:
                raise FieldError("calibrated_high_seconds", "is required when calibrated")
            if self.calibrated_high_seconds < self.receipt_low_seconds:
                raise FieldError("calibrated_high_seconds", "must be at least receipt_low_seconds")
        elif self.calibrated_high_seconds is not None:
            raise FieldError("calibrated_high_seconds", "only a calibrated runtime has one")
        _reason_rules(self.calibrated, self.reason)
        return self


class PeakMemoryCalibration(_Section):
    """The estimate's peak memory: ``peak_bytes`` (bytes) over ``scope`` (``node``: one node, ``job``:
    the whole job, ``rank``: one MPI rank). ``peak_bytes`` is present exactly when ``calibrated``;
    ``reason`` exactly when not."""

    calibrated: StrictBool
    scope: Literal["node", "job", "rank"]
    peak_bytes: PositiveInt | None = None
    reason: str | None = None

    @model_validator(mode="after")
    def _consistent(self) -> PeakMemoryCalibration:
        if self.calibrated and self.peak_bytes is None:
            raise FieldError("peak_bytes", "is required when calibrated")
        if not self.calibrated and self.peak_bytes is not None:
            raise FieldError("peak_bytes", "only a calibrated peak has one")
        _reason_rules(self.calibrated, self.reason)
        return self


class CalibratedEstimate(_Section):
    """``vq.calibrated-estimate/1`` as ``vq estimate --calibration ... --json`` prints it (fields defined
    in ``docs/calibrated-estimate.md``): the receipt's ``estimate_digest``, the ``calibration_id`` and
    ``hardware_class`` it was calibrated with, the ``program``, and the ``runtime`` and ``peak_memory``
    figures."""

    schema_name: Literal["vq.calibrated-estimate/1"]
    estimate_digest: Digest
    calibration_id: Label
    hardware_class: Label
    program: Label
    runtime: RuntimeCalibration
    peak_memory: PeakMemoryCalibration


FilledField = Literal["runtime_seconds", "mem_mb_per_node"]


class FieldFill(_Section):
    """What the estimate did to one request field: ``outcome`` ``filled`` (``value`` is the new value),
    ``kept`` (``value`` is the request's own), or ``not filled`` (``reason`` says why)."""

    field: FilledField
    outcome: Literal["filled", "kept", "not filled"]
    value: RuntimeRange | int | None = None
    reason: str | None = None


class EstimateReport(_Section):
    """The explanation's estimate section: digest, calibration id, hardware class and one
    :class:`FieldFill` per field (``runtime_seconds`` then ``mem_mb_per_node``)."""

    estimate_digest: str
    calibration_id: str
    hardware_class: str
    fields: tuple[FieldFill, ...]


def load_estimate(data: dict[str, Any]) -> CalibratedEstimate:
    """Validate a parsed ``vq.calibrated-estimate/1`` object, as ``vq submit`` checks one.

    Raises :class:`InvalidInput` naming the field; a raw receipt (``vq.estimate-receipt/1``) or any
    other ``schema_name`` is refused.
    """
    if not isinstance(data, dict):
        raise InvalidInput("estimate: the document must be a JSON object", path="")
    name = data.get("schema_name")
    if name == RAW_RECEIPT_SCHEMA:
        raise InvalidInput(
            "estimate: schema_name: a raw estimate receipt is refused; pass the vq.calibrated-estimate/1 "
            "from `vq estimate --calibration ... --json`",
            path="schema_name",
        )
    if name != ESTIMATE_SCHEMA:
        shown = "missing" if name is None else repr(name)
        raise InvalidInput(f"estimate: schema_name: {shown}, want {ESTIMATE_SCHEMA!r}", path="schema_name")
    return validated(CalibratedEstimate, data, "estimate")


@dataclass(frozen=True, slots=True)
class _NoFill:
    """Why the estimate fills no value into a field the request leaves unset."""

    reason: str


def _runtime_value(request: PlacementRequestDoc, estimate: CalibratedEstimate) -> RuntimeRange | _NoFill:
    """``runtime_seconds`` from a calibrated runtime: ``{receipt_low_seconds, calibrated_high_seconds}``."""
    runtime = estimate.runtime
    if not runtime.calibrated or runtime.calibrated_high_seconds is None:
        return _NoFill(f"runtime uncalibrated: {runtime.reason}")
    return RuntimeRange(low=runtime.receipt_low_seconds, high=runtime.calibrated_high_seconds)


def _memory_value(request: PlacementRequestDoc, estimate: CalibratedEstimate) -> int | _NoFill:
    """``mem_mb_per_node`` from a calibrated peak that describes one node, in whole MiB (rounded up)."""
    peak = estimate.peak_memory
    if not peak.calibrated or peak.peak_bytes is None:
        return _NoFill(f"peak memory uncalibrated: {peak.reason}")
    if peak.scope == "rank":
        return _NoFill("a rank-scope peak is not per-node memory")
    if peak.scope == "job" and request.nodes != 1:
        return _NoFill(f"a job-scope peak on a {request.nodes}-node request is not per-node memory")
    return -(-peak.peak_bytes // MIB)


_ValueOf = Callable[[PlacementRequestDoc, CalibratedEstimate], RuntimeRange | int | _NoFill]
# the fields an estimate fills, in the report's order, and the value each takes from it
_FILLS: tuple[tuple[FilledField, _ValueOf], ...] = (
    ("runtime_seconds", _runtime_value),
    ("mem_mb_per_node", _memory_value),
)


def _fill(
    request: PlacementRequestDoc,
    estimate: CalibratedEstimate,
    field: FilledField,
    value_of: _ValueOf,
) -> FieldFill:
    """``kept`` when the request sets ``field`` (an explicit value always wins), else ``filled`` with
    the estimate's value, or ``not filled`` with why."""
    own = getattr(request, field)
    if own is not None:
        return FieldFill(field=field, outcome="kept", value=own)
    value = value_of(request, estimate)
    if isinstance(value, _NoFill):
        return FieldFill(field=field, outcome="not filled", reason=value.reason)
    return FieldFill(field=field, outcome="filled", value=value)


def check_estimate_program(request: PlacementRequestDoc, estimate: CalibratedEstimate) -> None:
    """Raise :class:`InvalidInput` (path ``program``) when the estimate is for another program than the
    request's; both faces call it right after loading, so the error names the estimate document."""
    if estimate.program != request.program:
        raise InvalidInput(
            f"estimate: program: {quote_input(estimate.program)} does not match the request's "
            f"{quote_input(request.program)}",
            path="program",
        )


def apply_estimate(
    request: PlacementRequestDoc, estimate: CalibratedEstimate
) -> tuple[PlacementRequestDoc, EstimateReport]:
    """Fill the request's unset ``runtime_seconds`` and ``mem_mb_per_node`` from the estimate.

    Returns the effective request (a new document; the input is unchanged) and the report of what was
    filled, kept or not filled. Raises :class:`InvalidInput` (path ``program``) when the estimate is for
    another program than the request's.
    """
    check_estimate_program(request, estimate)
    fills = tuple(_fill(request, estimate, field, value_of) for field, value_of in _FILLS)
    update = {fill.field: fill.value for fill in fills if fill.outcome == "filled"}
    effective = request.model_copy(update=update) if update else request
    report = EstimateReport(
        estimate_digest=estimate.estimate_digest,
        calibration_id=estimate.calibration_id,
        hardware_class=estimate.hardware_class,
        fields=fills,
    )
    return effective, report

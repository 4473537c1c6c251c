"""The explanation as text and as ``vq.placement-explanation/1`` JSON (docs/explain.md: "--json prints
vq.placement-explanation/1: selected, held, the ranked candidates with their components, and rejected
with reasons").

:func:`to_json` and :func:`render_text` are deterministic: the same explanation always prints the same
bytes, so the same files and ``--now`` give byte-identical output. Pure: no clock, no I/O.
"""

from __future__ import annotations

from typing import Any

from app.fleet.documents import FleetTarget, PlacementRequestDoc, dump_document
from app.fleet.estimate import EstimateReport
from app.fleet.figures import interval_text, json_num, labels_text, num_text
from app.fleet.prediction import Candidate, Completion, Component, Explanation

EXPLANATION_SCHEMA = "vq.placement-explanation/1"


def _component_json(component: Component) -> dict[str, Any]:
    if not component.known:
        return {"known": False, "reason": component.reason}
    body: dict[str, Any] = {
        "known": True,
        "low": json_num(component.low),
        "high": json_num(component.high),
        "source": component.source,
    }
    if component.note is not None:
        body["note"] = component.note
    return body


def _completion_json(completion: Completion) -> dict[str, Any]:
    if completion.complete:
        return {
            "complete": True,
            "low": json_num(completion.low),
            "high": json_num(completion.high),
            "midpoint": json_num(completion.midpoint),
        }
    return {
        "complete": False,
        "known_low": json_num(completion.low),
        "known_high": json_num(completion.high),
        "unknown": list(completion.unknown),
    }


def _estimate_json(report: EstimateReport) -> dict[str, Any]:
    fields = []
    for fill in report.fields:
        body: dict[str, Any] = {"field": fill.field, "outcome": fill.outcome}
        if fill.value is not None:
            body["value"] = (
                fill.value if isinstance(fill.value, int) else dump_document(fill.value)  # RuntimeRange
            )
        if fill.reason is not None:
            body["reason"] = fill.reason
        fields.append(body)
    return {
        "estimate_digest": report.estimate_digest,
        "calibration_id": report.calibration_id,
        "hardware_class": report.hardware_class,
        "fields": fields,
    }


def to_json(explanation: Explanation) -> dict[str, Any]:
    """The explanation as ``vq.placement-explanation/1`` (``openapi/vq.placement-explanation-1.schema.json``):
    ``{schema_name, now, max_age_seconds, request, estimate?, held, held_reason, selected, candidates,
    rejected}``. Seconds throughout, rounded to 3 decimals; deterministic key order."""
    selected = explanation.selected
    body: dict[str, Any] = {
        "schema_name": EXPLANATION_SCHEMA,
        "now": explanation.now.isoformat(),
        "max_age_seconds": explanation.max_age_seconds,
        "request": dump_document(explanation.request),
    }
    if explanation.estimate is not None:
        body["estimate"] = _estimate_json(explanation.estimate)
    body["held"] = explanation.held
    body["held_reason"] = explanation.held_reason
    body["selected"] = (
        None
        if selected is None
        else {"target": selected.target.name, "runtime_digest": selected.runtime_digest}
    )
    body["candidates"] = [
        {
            "rank": candidate.rank,
            "target": candidate.target.name,
            "kind": candidate.target.kind,
            "runtime_digest": candidate.runtime_digest,
            "observed_at": _observed(candidate.target),
            "data_age_seconds": json_num(candidate.data_age_seconds),
            "speed_factor": json_num(candidate.target.speed_factor),
            "speed_source": candidate.target.speed_source,
            "components": {component.name: _component_json(component) for component in candidate.components},
            "completion": _completion_json(candidate.completion),
        }
        for candidate in explanation.candidates
    ]
    body["rejected"] = [
        {
            "target": rejection.target.name,
            "kind": rejection.target.kind,
            "observed_at": _observed(rejection.target),
            "data_age_seconds": json_num(rejection.data_age_seconds),
            "reasons": list(rejection.reasons),
        }
        for rejection in explanation.rejected
    ]
    return body


def _observed(target: FleetTarget) -> str | None:
    return target.observed_at.isoformat() if target.observed_at is not None else None


def _age_text(age: float | None) -> str:
    if age is None:
        return "data age unknown"
    if age < 0:
        return f"observed {num_text(-age)} s in the future"
    return f"data age {num_text(age)} s"


def _request_lines(request: PlacementRequestDoc) -> list[str]:
    runtime = request.runtime_digest or "any (each target's current runtime)"
    first = [f"program {request.program}, runtime digest {runtime}"]
    for label, value in (
        ("os", request.os),
        ("ISA", request.isa_level),
        ("account", request.account),
        ("queue", request.queue),
    ):
        if value is not None:
            first.append(f"{label} {value}")
    shape = [f"{request.cpus} CPUs on {request.nodes} node(s)"]
    if request.mpi_ranks is not None and request.threads_per_rank is not None:
        shape.append(f"{request.mpi_ranks} ranks x {request.threads_per_rank} threads")
    shape.append(f"{request.cpus_per_node} CPUs per node")
    if request.mem_mb_per_node is not None:
        shape.append(f"memory {request.mem_mb_per_node} MB per node")
    if request.scratch_mb_per_node is not None:
        shape.append(f"scratch {request.scratch_mb_per_node} MB per node")
    if request.gpus_per_node is not None:
        shape.append(f"{request.gpus_per_node} GPUs per node")
    lines = ["Request: " + ", ".join(first), "  " + ", ".join(shape)]
    needs = []
    if request.required_data_access:
        needs.append(f"data access {labels_text(request.required_data_access)}")
    if request.required_licenses:
        needs.append(f"licenses {labels_text(request.required_licenses)}")
    if needs:
        lines.append("  requires " + "; ".join(needs))
    time = []
    time.append(
        f"wall time {request.wall_time_seconds} s requested"
        if request.wall_time_seconds is not None
        else "no wall time requested"
    )
    time.append(
        f"runtime {interval_text(request.runtime_seconds.low, request.runtime_seconds.high)} s at speed 1"
        if request.runtime_seconds is not None
        else "runtime unknown"
    )
    time.append(f"input {num_text(request.input_mb or 0)} MB, output {num_text(request.output_mb or 0)} MB")
    lines.append("  " + "; ".join(time))
    return lines


def _estimate_lines(report: EstimateReport) -> list[str]:
    lines = [
        f"Estimate: digest {report.estimate_digest}, calibration {report.calibration_id}, "
        f"hardware class {report.hardware_class}"
    ]
    for fill in report.fields:
        if fill.outcome == "not filled":
            lines.append(f"  {fill.field}: not filled: {fill.reason}")
            continue
        value = fill.value
        shown = f"{value} MB" if isinstance(value, int) else f"{interval_text(value.low, value.high)} s"
        lines.append(f"  {fill.field}: {fill.outcome} ({shown})")
    return lines


COMPONENT_LABELS = {
    "staging": "staging",
    "queue_wait": "queue wait",
    "execution": "execution",
    "transfer": "transfer",
}


def _candidate_lines(candidate: Candidate) -> list[str]:
    target = candidate.target
    lines = [
        f"  {candidate.rank}. {target.name} ({target.kind}, {_age_text(candidate.data_age_seconds)}, "
        f"runtime digest {candidate.runtime_digest})"
    ]
    for component in candidate.components:
        label = COMPONENT_LABELS[component.name]
        if component.known and component.low is not None and component.high is not None:
            detail = component.source or ""
            if component.note:
                detail += f"; {component.note}"
            lines.append(
                f"       {label:<11} {interval_text(component.low, component.high) + ' s':<18} {detail}"
            )
        else:
            lines.append(f"       {label:<11} {'unknown':<18} {component.reason}")
    completion = candidate.completion
    if completion.complete:
        total = (
            f"{interval_text(completion.low, completion.high)} s (midpoint {num_text(completion.midpoint)} s)"
        )
    else:
        known = interval_text(completion.low, completion.high)
        total = f"{known} s + unknown ({', '.join(COMPONENT_LABELS[n] for n in completion.unknown)})"
    lines.append(f"       {'completion':<11} {total}")
    return lines


def render_text(explanation: Explanation) -> str:
    """The explanation for people: the request, the estimate section (when given), the selected target
    and runtime digest or the hold, each candidate (rank, data age, the four components with sources,
    completion) and each rejected target with every reason. Ends with a newline; deterministic."""
    lines = [
        f"Placement explanation at {explanation.now.isoformat()} (max age {explanation.max_age_seconds} s)",
        *_request_lines(explanation.request),
    ]
    if explanation.estimate is not None:
        lines.extend(_estimate_lines(explanation.estimate))
    lines.append("")
    selected = explanation.selected
    if selected is None:
        lines.append(f"Held: {explanation.held_reason}")
    else:
        lines.append(f"Selected: {selected.target.name}, runtime digest {selected.runtime_digest}")
    lines.append("")
    lines.append(f"Candidates ({len(explanation.candidates)}, ranked by predicted completion):")
    if not explanation.candidates:
        lines.append("  none")
    for candidate in explanation.candidates:
        lines.extend(_candidate_lines(candidate))
    lines.append("")
    lines.append(f"Rejected ({len(explanation.rejected)}):")
    if not explanation.rejected:
        lines.append("  none")
    for rejection in explanation.rejected:
        lines.append(
            f"  {rejection.target.name} ({rejection.target.kind}, {_age_text(rejection.data_age_seconds)})"
        )
        lines.extend(f"    - {reason}" for reason in rejection.reasons)
    return "\n".join(lines) + "\n"

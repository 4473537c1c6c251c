"""The daemon capacity answer (``vq broker capacity --json``) and its overlay on a daemon target
(docs/explain.md).

The answer document is ours (docs/fleet.md names its figures and its shape); ``docs/fleet.md`` defines
it as ``vq.broker-capacity/1``::

    {"schema_name": "vq.broker-capacity/1",
     "sampled_at": "2026-10-12T11:59:30+00:00", "snapshot_age_seconds": 4,
     "state_root_used": true, "admission": "open", "queue_ready": true,
     "free_cpus": 30, "free_mem_mb": 120000, "free_gpus": 1, "gpus": 2,
     "programs": {"vibe-qc": "OK", "old-tool": "MISSING"}}

Pure: the answer and the time it was taken in, a target record out.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StringConstraints

from app.errors import InvalidInput
from app.fleet.documents import AwareDatetime, NonNegativeInt, NonNegativeNumber, validated

CAPACITY_SCHEMA = "vq.broker-capacity/1"

ProgramName = Annotated[str, StringConstraints(strict=True, min_length=1, max_length=200)]
ProgramStatus = Annotated[str, StringConstraints(strict=True, min_length=1, max_length=64)]


class CapacityAnswer(BaseModel):
    """``vq.broker-capacity/1``: one daemon's published figures.

    ``sampled_at`` (ISO 8601 with offset) is when the answer was taken and ``snapshot_age_seconds`` how
    old the daemon's snapshot was then, so the figures date from ``sampled_at - snapshot_age_seconds``.
    ``state_root_used``: the daemon showed it uses its state root. ``admission`` (``open``/``closed``) and
    ``queue_ready`` gate ``free_cpus`` (count), ``free_mem_mb`` (MB) and ``free_gpus`` (count); ``gpus``
    is the host's GPU devices (``None`` unknown); ``programs`` maps a program name to its status
    (``OK`` or any other word, e.g. ``MISSING``, ``DIGEST_MISMATCH``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_name: Literal["vq.broker-capacity/1"]
    sampled_at: AwareDatetime
    snapshot_age_seconds: NonNegativeNumber
    state_root_used: StrictBool
    admission: Literal["open", "closed"]
    queue_ready: StrictBool
    free_cpus: NonNegativeInt | None = None
    free_mem_mb: NonNegativeInt | None = None
    free_gpus: NonNegativeInt | None = None
    gpus: NonNegativeInt | None = None
    programs: dict[ProgramName, ProgramStatus] = Field(default_factory=dict, max_length=4096)


def load_capacity_answer(data: Any) -> CapacityAnswer:
    """Validate a parsed capacity answer; raises :class:`InvalidInput` naming the field (a malformed
    answer is refused, docs/explain.md)."""
    if not isinstance(data, dict):
        raise InvalidInput("capacity answer: the document must be a JSON object", path="")
    if data.get("schema_name") != CAPACITY_SCHEMA:
        shown = "missing" if data.get("schema_name") is None else repr(data.get("schema_name"))
        raise InvalidInput(
            f"capacity answer: schema_name: {shown}, want {CAPACITY_SCHEMA!r}", path="schema_name"
        )
    return validated(CapacityAnswer, data, "capacity answer")


def answer_observed_at(answer: CapacityAnswer, answered_at: datetime | None = None) -> datetime:
    """When the daemon published its figures: ``answered_at`` (this host's clock at the call, for
    ``--collect``) or else the answer's ``sampled_at``, less ``snapshot_age_seconds``. Never the
    target's own clock."""
    taken = answered_at if answered_at is not None else answer.sampled_at
    return taken - timedelta(seconds=answer.snapshot_age_seconds)


def overlay_capacity(
    target: dict[str, Any], answer: CapacityAnswer, answered_at: datetime | None = None
) -> tuple[dict[str, Any], str]:
    """Apply a capacity answer to a daemon target's JSON record; returns the new record and a summary.

    Sets only (docs/explain.md): ``observed_at`` (:func:`answer_observed_at`); ``reachable`` (True only when
    the daemon showed it uses its state root); ``free`` = ``{cpus, mem_mb, gpus}`` only when admission
    is open, the queue ready and both CPU and memory figures given, else removed (a base
    ``free.scratch_mb`` is not evidence of now and goes with it); ``node.gpus`` when the answer knows
    it; programs the answer reports with a status other than ``OK`` are removed.
    """
    record = dict(target)
    record["observed_at"] = answer_observed_at(answer, answered_at).isoformat()
    record["reachable"] = answer.state_root_used
    notes = [] if answer.state_root_used else ["state root not shown in use: unreachable"]
    if (
        answer.admission == "open"
        and answer.queue_ready
        and answer.free_cpus is not None
        and answer.free_mem_mb is not None
    ):
        free: dict[str, Any] = {"cpus": answer.free_cpus, "mem_mb": answer.free_mem_mb}
        if answer.free_gpus is not None:
            free["gpus"] = answer.free_gpus
        record["free"] = free
    else:
        record.pop("free", None)
        why = []
        if answer.admission != "open":
            why.append("admission closed")
        if not answer.queue_ready:
            why.append("queue not ready")
        if answer.free_cpus is None or answer.free_mem_mb is None:
            why.append("free cpus or memory not given")
        notes.append("nothing free now (" + ", ".join(why) + ")")
    if answer.gpus is not None:
        record["node"] = {**(record.get("node") or {}), "gpus": answer.gpus}
    programs = dict(record.get("programs") or {})
    removed = sorted(name for name, status in answer.programs.items() if status != "OK" and name in programs)
    for name in removed:
        del programs[name]
    record["programs"] = programs
    if removed:
        notes.append("programs removed: " + ", ".join(f"{n} ({answer.programs[n]})" for n in removed))
    summary = f"observed {record['observed_at']}" + ("; " + "; ".join(notes) if notes else "")
    return record, summary

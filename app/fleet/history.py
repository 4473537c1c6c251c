"""Recorded jobs and the queue-wait interval from their history (docs/fleet.md;
the compare step reads the same records).

A job record is the driver daemon's view of one job (``docs/fleet.md`` defines ``vq.job-history/1``).
Times are kept as the strings recorded: a missing, unparsable, backwards or future time excludes the
job from the history rather than refusing the whole document. Pure: records and ``now`` in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from app.errors import InvalidInput
from app.fleet.documents import PositiveInt, QueueWait, validated

JOB_HISTORY_SCHEMA = "vq.job-history/1"
DEFAULT_HISTORY_JOBS = 50
DEFAULT_HISTORY_DAYS = 14
DEFAULT_HISTORY_MIN = 5

Text = Annotated[str, StringConstraints(strict=True, min_length=1, max_length=200)]
TimeText = Annotated[str, StringConstraints(strict=True, max_length=64)]


class JobRecord(BaseModel):
    """One recorded job.

    ``kind``: ``local`` (run by a daemon host of this queue) or ``scheduler`` (submitted to a scheduler
    target). ``target``: the daemon host or scheduler target it ran on. ``state``: ``queued``,
    ``running``, ``succeeded``, ``failed`` or ``cancelled``. ``cpus`` (count), ``mem_mb`` (the declared
    ``--mem-mb``, MB), ``wall_time_seconds`` (the requested limit). ``finished_at``: when it ended.
    ``scheduler_submitted_at``: when qsub/sbatch accepted it; ``scheduler_started_at``: when a poll first
    saw it run. Times are ISO 8601 strings with an offset; bad ones exclude the job, they are not refused.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    job_id: Text
    kind: Literal["local", "scheduler"]
    target: Text | None = None
    state: Literal["queued", "running", "succeeded", "failed", "cancelled"]
    program: Text | None = None
    cpus: PositiveInt | None = None
    mem_mb: PositiveInt | None = None
    wall_time_seconds: PositiveInt | None = None
    submitted_at: TimeText | None = None
    finished_at: TimeText | None = None
    scheduler_submitted_at: TimeText | None = None
    scheduler_started_at: TimeText | None = None


class JobHistory(BaseModel):
    """``vq.job-history/1``: ``{schema_name, jobs: [JobRecord]}`` (this host's queue)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_name: Literal["vq.job-history/1"]
    jobs: list[JobRecord] = Field(max_length=1_000_000)


def load_job_history(data: Any) -> JobHistory:
    """Validate a parsed ``vq.job-history/1``; raises :class:`InvalidInput` naming the field."""
    if not isinstance(data, dict) or data.get("schema_name") != JOB_HISTORY_SCHEMA:
        raise InvalidInput(f"job history: schema_name: want {JOB_HISTORY_SCHEMA!r}", path="schema_name")
    return validated(JobHistory, data, "job history")


def stored_record(record: JobRecord) -> dict[str, Any]:
    """A job record as it is stored and answered: its JSON object without unknown (None) fields."""
    return record.model_dump(mode="json", exclude_none=True)


def job_history_document(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Stored records (:func:`stored_record` objects) as ``vq.job-history/1``."""
    return {"schema_name": JOB_HISTORY_SCHEMA, "jobs": records}


def parse_time(text: str | None) -> datetime | None:
    """An ISO 8601 time with an offset, or ``None`` when missing, unparsable or naive."""
    if not text:
        return None
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        return None
    return parsed


def nearest_rank(sorted_values: list[float], percent: float) -> float:
    """Nearest-rank percentile of an ascending list: the value at rank ``ceil(percent/100 * n)``
    (at least 1)."""
    rank = max(1, math.ceil(percent / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


@dataclass(frozen=True)
class HistoryOutcome:
    """The waits found for one scheduler target: ``queue_wait`` (p10..p90 with ``source: history``, or
    ``None`` with fewer than the minimum), ``used`` waits, and ``excluded`` counts per reason."""

    queue_wait: QueueWait | None
    used: int
    excluded: dict[str, int] = field(default_factory=dict)

    def message(self, minimum: int) -> str:
        """One line for stderr / the report."""
        left_out = ", ".join(f"{count} {why}" for why, count in sorted(self.excluded.items()))
        tail = f" (left out: {left_out})" if left_out else ""
        if self.queue_wait is None:
            return f"{self.used} recorded waits, fewer than {minimum}: base record kept{tail}"
        low, high = self.queue_wait.low, self.queue_wait.high
        return f"{self.used} recorded waits: queue wait {low:g}-{high:g} s (p10-p90){tail}"


def queue_wait_from_history(
    records: list[JobRecord],
    scheduler_target: str,
    now: datetime,
    *,
    jobs: int = DEFAULT_HISTORY_JOBS,
    days: int = DEFAULT_HISTORY_DAYS,
    minimum: int = DEFAULT_HISTORY_MIN,
) -> HistoryOutcome:
    """The queue-wait interval of ``scheduler_target`` from this queue's records (docs/fleet.md).

    A wait is ``scheduler_started_at - scheduler_submitted_at`` (seconds) of a scheduler job on that
    target. Excluded: missing or unparsable times, a start before the submission (backwards), either
    time after ``now`` (future). Of the ``jobs`` most recently started within ``days`` of ``now``, the
    interval is the nearest-rank 10th to 90th percentile, ``source: "history"``; with fewer than
    ``minimum`` waits, ``queue_wait`` is ``None`` (keep the base record).
    """
    excluded: dict[str, int] = {}

    def leave_out(why: str) -> None:
        excluded[why] = excluded.get(why, 0) + 1

    window_start = now - timedelta(days=days)
    waits: list[tuple[datetime, str, float]] = []
    for record in records:
        if record.kind != "scheduler" or record.target != scheduler_target:
            continue
        if record.scheduler_submitted_at is None or record.scheduler_started_at is None:
            leave_out("missing times")
            continue
        submitted = parse_time(record.scheduler_submitted_at)
        started = parse_time(record.scheduler_started_at)
        if submitted is None or started is None:
            leave_out("unparsable times")
            continue
        if started < submitted:
            leave_out("backwards")
            continue
        if started > now or submitted > now:
            leave_out("in the future")
            continue
        if started < window_start:
            leave_out(f"started over {days} days ago")
            continue
        waits.append((started, record.job_id, (started - submitted).total_seconds()))
    waits.sort(key=lambda item: (item[0], item[1]), reverse=True)
    if len(waits) > jobs:
        excluded[f"beyond the {jobs} most recent"] = len(waits) - jobs
    recent = sorted(wait for _, _, wait in waits[:jobs])
    if len(recent) < minimum:
        return HistoryOutcome(None, len(recent), excluded)
    wait = QueueWait(low=nearest_rank(recent, 10), high=nearest_rank(recent, 90), source="history")
    return HistoryOutcome(wait, len(recent), excluded)

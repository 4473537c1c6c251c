"""The reserve/preview flags as a request body, and the way back: an API field path to the flag.

The service names a malformed field by its JSON path (``details.path``, e.g. ``devices.0.count``); a
command-line user typed ``--gpus``. :func:`flag_for` maps the one to the other, so errors name the flag.
Obvious mistakes are caught before anything is sent (:func:`request_body` raises :class:`UsageError`,
the command exits 2); the rest (a selector's grammar, the service's limits) come back as a 422 whose path
is mapped here.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any

import typer

from app.errors import AppError


class UsageError(AppError):
    """The command line is wrong (exit 2); ``message`` names the flag, e.g. ``--for '3x': ...``."""

    code = "USAGE"


ISO_EXAMPLE = "2026-12-01T12:00:00Z"


def iso_time(value: str, flag: str, other_forms: str = "") -> str:
    """``value`` when it reads as an ISO 8601 time (the service judges the rest: its offset, its years,
    naming the flag); else :class:`UsageError` naming ``flag`` and the forms it takes: ``other_forms``
    (``"a duration from now (30d) or "``), then an ISO 8601 time. Checked here, because the service's
    own text for a date it cannot read is its parser's (``input is too short``)."""
    try:
        datetime.fromisoformat(value)
    except ValueError:
        raise UsageError(
            f"{flag} {value!r}: give {other_forms}an ISO 8601 time with its offset, e.g. {ISO_EXAMPLE}"
        ) from None
    return value


# The JSON path the service reports -> the flag that set it. The longest matching prefix wins, so
# ``devices.0.selector.matchExpressions.0.op`` is ``--selector``.
REQUEST_FLAGS: dict[str, str] = {
    "tenantId": "--tenant",
    "poolId": "--pool",
    "devices": "--gpus",
    "devices.0.count": "--gpus",
    "devices.0.class": "--class",
    "devices.0.selector": "--selector",
    "devices.0.topology": "--nvlink",
    "resources": "--cpu/--memory",
    "resources.cpu": "--cpu",
    "resources.memory": "--memory",
    "duration": "--for",
    "idempotencyKey": "--idempotency-key",
    "spot": "--spot",
    "ifPlan": "--if-plan",
    "start": "--start",
    "gang": "--gang",
    "gang.members": "--gang",
    "gang.topologyKey": "--topology-key",
    "binding": "--whole-node",
}
LIST_RESERVATION_FLAGS: dict[str, str] = {"tenantId": "--tenant", "status": "--status", "limit": "--limit"}


def flag_for(path: str, flags: dict[str, str]) -> str | None:
    """The flag behind the API field ``path`` (dotted, e.g. ``devices.0.count``), or None. An entry
    ``field.*`` names each key of an object sent from ``KEY=VALUE`` items by its own item: with
    ``{"labels.*": "*="}``, an error at ``labels.bc.dev/x`` names ``bc.dev/x=`` (a key may hold dots)."""
    parts = path.split(".") if path else []
    for end in range(len(parts), 0, -1):
        field, key = ".".join(parts[:end]), ".".join(parts[end:])
        each_key = flags.get(f"{field}.*") if key else None
        flag = each_key.replace("*", key) if each_key else flags.get(field)
        if flag:
            return flag
    return None


def with_flag(message: str, path: str, flags: dict[str, str]) -> str:
    """An API error message with its field path replaced by the flag: ``devices.0.count: Input should
    be ...`` -> ``--gpus: Input should be ...``; unchanged when no flag set that field."""
    flag = flag_for(path, flags)
    if flag is None:
        return message
    field = path.rsplit(".", 1)[-1]
    # the path, pydantic's "Value error, " and a repeated field name ("selector: ...") say nothing more
    for prefix in (f"{path}: ", "Value error, ", f"{field}: "):
        message = message.removeprefix(prefix)
    return f"{flag}: {message}"


@dataclass(frozen=True)
class RequestFlags:
    """What reserve and preview were told: ``gpus`` atoms of ``device_class`` (0 = none), ``cpu``
    cores and ``memory`` MiB (None = none), ``duration`` as typed (``90m``, ``1d``, seconds).

    Each field's annotation is also its command-line option, and its default the option's: the two
    commands take these fields as their options, in this order
    (:func:`app.client.reservation_commands.request_command`)."""

    tenant: Annotated[str, typer.Option("--tenant", help="Tenant id.")]
    pool: Annotated[str, typer.Option("--pool", help="Pool id (pool_...) or name.")]
    gpus: Annotated[int, typer.Option("--gpus", help="Number of atoms of --class.")] = 0
    duration: Annotated[str, typer.Option("--for", help="Duration: 90m, 2h, 1d, or seconds.")] = "1d"
    selector: Annotated[str | None, typer.Option("--selector", help="Selector shorthand.")] = None
    nvlink: Annotated[bool, typer.Option("--nvlink", help="Only NVLink-complete sets (nvlink-all).")] = False
    cpu: Annotated[float | None, typer.Option("--cpu", help="CPU cores.")] = None
    memory: Annotated[float | None, typer.Option("--memory", help="Memory (MiB).")] = None
    idempotency_key: Annotated[
        str | None, typer.Option("--idempotency-key", help="Retry key (default: random).")
    ] = None
    device_class: Annotated[str, typer.Option("--class", help="Device class.")] = "gpu"
    # docs/preemption.md
    spot: Annotated[bool, typer.Option("--spot", help="Spot work: regular work may preempt it.")] = False
    # docs/lifecycle.md, "Earliest start"
    earliest: Annotated[
        bool, typer.Option("--earliest", help="Start at the first window that fits (= --start earliest).")
    ] = False
    start: Annotated[
        str | None, typer.Option("--start", help="ISO 8601 with a UTC offset, or 'earliest' (default: now).")
    ] = None
    # docs/api.md, gang
    gang: Annotated[
        int | None, typer.Option("--gang", help="N copies of the shape on distinct nodes, all or nothing.")
    ] = None
    topology_key: Annotated[
        str | None, typer.Option("--topology-key", help="The gang's nodes share this node label's value.")
    ] = None
    # binding "node", the whole-node lease rule
    whole_node: Annotated[bool, typer.Option("--whole-node", help="Lease whole nodes (binding: node).")] = (
        False
    )
    # reserve's only: a preview's plan token (docs/api.md, "Plan tokens")
    if_plan: Annotated[
        str | None,
        typer.Option(
            "--if-plan",
            help="Commit exactly this plan token of a preview of the same flags, or fail (PLAN_STALE).",
        ),
    ] = None

    def request_body(self) -> dict[str, Any]:
        """The ``POST /v1/reservations`` (and preview) body. Raises :class:`UsageError` when an amount
        is negative, nothing is claimed, or ``--for`` is no duration (the rule is the service's own
        ``parse_duration``)."""
        # imported here: the request model pulls in pydantic and the placement package, a third of a
        # second that get / describe / release need not pay at start-up
        from app.jsonnum import num
        from app.placement.request import parse_duration

        if self.gpus < 0:
            raise UsageError(f"--gpus must be 0 or more, not {self.gpus}")
        for flag, amount in (("--cpu", self.cpu), ("--memory", self.memory)):
            if amount is not None and not amount > 0:  # also NaN
                raise UsageError(f"{flag} must be more than 0, not {amount:g}")
        if not self.gpus and self.cpu is None and self.memory is None:
            raise UsageError("nothing to reserve: give --gpus, --cpu or --memory")
        if (self.selector or self.nvlink) and not self.gpus:
            raise UsageError("--selector and --nvlink need --gpus")
        try:
            parse_duration(self.duration)
        except ValueError as error:
            raise UsageError(f"--for {self.duration!r}: {error}") from None
        if self.earliest and self.start not in (None, "earliest"):
            raise UsageError(f"--earliest and --start {self.start!r}: give one")
        if self.start not in (None, "earliest"):
            iso_time(self.start, "--start", "'earliest' or ")
        if self.gang is not None and self.gang < 1:
            raise UsageError(f"--gang must be 1 or more, not {self.gang}")
        if self.topology_key and self.gang is None:
            raise UsageError("--topology-key needs --gang")
        start = "earliest" if self.earliest else self.start
        gang: dict[str, Any] | None = {"members": self.gang} if self.gang is not None else None
        if gang is not None and self.topology_key:
            gang["topologyKey"] = self.topology_key
        device: dict[str, Any] = {"class": self.device_class, "count": self.gpus}
        if self.selector:
            device["selector"] = self.selector
        if self.nvlink:
            device["topology"] = "nvlink-all"
        resources = {name: num(amount) for name, amount in (("cpu", self.cpu), ("memory", self.memory))}
        return {
            "tenantId": self.tenant,
            "poolId": self.pool,
            "devices": [device] if self.gpus else [],
            "resources": {name: amount for name, amount in resources.items() if amount is not None},
            "duration": self.duration,
            "idempotencyKey": self.idempotency_key or f"cli-{secrets.token_hex(8)}",
            **({"spot": True} if self.spot else {}),
            **({"start": start} if start else {}),
            **({"gang": gang} if gang else {}),
            **({"binding": "node"} if self.whole_node else {}),
            **({"ifPlan": self.if_plan} if self.if_plan else {}),
        }

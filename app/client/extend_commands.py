"""``better-compute extend ID --to ISO | --by DURATION`` (docs/cli.md, "extend"): lengthen a placed
reservation on the same GPUs and amounts (``POST /v1/reservations/{id}/extend``; docs/lifecycle.md,
"Extend").

``--to`` is the new end (ISO 8601 with a UTC offset); ``--by`` adds a duration (``30m``, ``2h``, ``1d``,
seconds) to the reservation's end as read just before (its latest allocation's end). Exactly one of the
two. Exits as every client command does (:mod:`app.client`): 0 extended (or already ending there), 1 an
API error printed ``CODE: message`` (409 CONFLICT naming the reservation in the way, 409
QUOTA_EXCEEDED, 422 at ``end`` shown as ``--to``), 2 a usage error.

``app/cli.py`` registers :func:`extend`.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Any

import typer

from app.client.api import ServiceClient
from app.client.common import Shown, client_command
from app.client.flags import UsageError, iso_time
from app.client.reservation_commands import ReservationArg, names_of

EXTEND_FLAGS = {"end": "--to"}


def new_end(current: dict[str, Any], to: str | None, by: str | None) -> str:
    """The ``end`` to send: ``to`` as given, or the reservation's end (its latest allocation's) plus
    ``by``. Raises :class:`UsageError` for both or neither flag, a ``--to`` that is no ISO 8601 time,
    an unreadable ``--by``, or ``--by`` on a reservation without allocations (not placed)."""
    if (to is None) == (by is None):
        raise UsageError("give the new end with --to ISO or --by DURATION (one of them)")
    if to is not None:
        return iso_time(to, "--to")
    from app.placement.request import parse_duration  # pydantic and placement: only when needed

    try:
        seconds = parse_duration(by or "")
    except ValueError as error:
        raise UsageError(f"--by {by!r}: {error}") from None
    ends = [datetime.fromisoformat(a["end"]) for a in current.get("allocations") or ()]
    if not ends:
        raise UsageError(f"--by: {current.get('id')} has no window to extend ({current.get('status')})")
    return (max(ends) + timedelta(seconds=seconds)).isoformat()


@client_command(EXTEND_FLAGS)
def extend(
    api: ServiceClient,
    reservation_id: ReservationArg,
    to: Annotated[str | None, typer.Option("--to", help="The new end: ISO 8601 with a UTC offset.")] = None,
    by: Annotated[
        str | None, typer.Option("--by", help="Add this to the current end: 30m, 2h, 1d, or seconds.")
    ] = None,
) -> Shown:
    """Extend a placed reservation to a later end on the same GPUs (409: something is booked there)."""
    from app.client import render as out

    current = api.reservation(reservation_id) if by is not None and to is None else {}
    end = new_end(current, to, by)
    answer = api.request("POST", f"/v1/reservations/{reservation_id}/extend", body={"end": end})[1]
    return Shown(answer, lambda wide: out.reservation_view(answer, names_of(api, [answer], True), wide))

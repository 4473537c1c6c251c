"""``reserve``, ``preview`` and ``release`` (docs/cli.md): the commands that send a reservation body or
act on one reservation. Registered by ``app/cli.py``; the shared options and the exits are
:mod:`app.client.common`'s.

``reserve --wait`` polls the reservation (``GET /v1/reservations/{id}``, once a second at first, at most
every 5 s) until it is placed (exit 0), leaves ``pending``/``queued`` unplaced (``ended`` at its
deadline, released: exit 3) or ``--wait-timeout`` passes (still pending: exit 3).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Annotated, Any

import typer

from app.client import EXIT_API_ERROR, EXIT_NOT_PLACED, EXIT_USAGE
from app.client.allocations import held_windows, reservation_nodes
from app.client.api import ServiceClient
from app.client.common import (
    CONNECTION_OPTIONS,
    Output,
    Shown,
    client_command,
    emit,
    fail,
    options_of,
    service,
    warn,
)
from app.client.flags import REQUEST_FLAGS, RequestFlags

ReservationArg = Annotated[str, typer.Argument(metavar="ID", help="Reservation id (res_...).")]
WaitOpt = Annotated[
    bool, typer.Option("--wait", help="Wait while it is pending: exit 0 once placed, 3 at the timeout.")
]
WaitTimeoutOpt = Annotated[
    str, typer.Option("--wait-timeout", help="How long --wait waits: 90s, 10m, 1h, or seconds.")
]

POLL_FIRST, POLL_MOST = 1.0, 5.0  # seconds between polls of --wait: from the first, growing to the most


def _reserve_options(wait: WaitOpt = False, wait_timeout: WaitTimeoutOpt = "5m") -> None:
    """reserve's own options, after the request's (:func:`request_command` adds them)."""


RESERVE_ONLY = ("if_plan", "wait", "wait_timeout")  # preview leaves these out


def request_command(
    send: Callable[[ServiceClient, dict[str, Any], Output, float | None], bool], *, reserve: bool = False
) -> Callable[..., None]:
    """A command that sends the request the flags describe: ``send(api, body, output, wait)`` calls
    the service, prints the answer and says whether it is done (else exit 3); ``wait`` is ``--wait``'s
    timeout in seconds (None: no wait). Preview and reserve take the same options, the fields of
    :class:`RequestFlags`, so they share this one definition; ``--if-plan``, ``--wait`` and
    ``--wait-timeout`` are reserve's only (``reserve``)."""

    def command(**arguments: Any) -> None:
        output, server, key = arguments.pop("output"), arguments.pop("server"), arguments.pop("key")
        wait, wait_timeout = arguments.pop("wait", False), arguments.pop("wait_timeout", None)
        timeout = _wait_seconds(wait_timeout) if wait else None
        with service(server, key, REQUEST_FLAGS) as api:
            flags = RequestFlags(**{**arguments, "pool": api.pool_id(arguments["pool"])})
            done = send(api, flags.request_body(), output, timeout)
        if not done:
            raise typer.Exit(EXIT_NOT_PLACED)

    options = [*options_of(RequestFlags), *options_of(_reserve_options), *CONNECTION_OPTIONS]
    kept = options if reserve else [o for o in options if o.name not in RESERVE_ONLY]
    command.__signature__ = inspect.Signature(kept)  # type: ignore[attr-defined]
    return command


def _wait_seconds(text: str) -> float:
    """``--wait-timeout`` in seconds (the service's duration rule); a bad one exits 2."""
    from app.placement.request import parse_duration

    try:
        return float(parse_duration(text))
    except ValueError as error:
        raise fail(f"--wait-timeout {text!r}: {error}", EXIT_USAGE) from None


def preview(api: ServiceClient, body: dict[str, Any], output: Output, _wait: float | None) -> bool:
    """Preview; done when it would fit. A request the pool could never hold (``satisfiable: false``)
    exits 1 like reserve's UNSATISFIABLE error, not 3: waiting will not help (docs/cli.md)."""
    from app.client import render as out

    answer = api.preview(body)
    emit(answer, output, lambda wide: out.preview_view(answer, wide))
    if answer.get("planToken") and output in (Output.table, Output.wide):  # json/yaml carry it already
        # one line of its own, never wrapped: `reserve ... --if-plan TOKEN` commits exactly this plan
        typer.echo(f"plan token: {answer['planToken']}")
    warn(answer)
    if answer.get("satisfiable") is False:
        why = answer.get("unsatisfiableReason") or answer.get("reason", "")
        raise fail(f"UNSATISFIABLE: {why}", EXIT_API_ERROR)
    return bool(answer.get("fits"))


def reserve(api: ServiceClient, body: dict[str, Any], output: Output, wait: float | None) -> bool:
    """Reserve; done when placed (pending and queued are not). With ``wait`` (seconds), a pending or
    queued answer is polled until it is placed, decided otherwise, or the time is up; the answer
    printed is the last one read."""
    from app.client import render as out

    answer = api.reserve(body)
    warn(answer)
    if wait is not None:
        answer = wait_for_placement(api, answer, wait)
    emit(answer, output, lambda wide: out.reservation_view(answer, names_of(api, [answer], True), wide))
    return answer.get("status") == "placed"


def wait_for_placement(api: ServiceClient, reservation: dict[str, Any], seconds: float) -> dict[str, Any]:
    """``reservation`` read again until its status is no longer ``pending`` or ``queued``, or
    ``seconds`` have passed (monotonic clock); polls ``POLL_FIRST`` s apart, growing to ``POLL_MOST``."""
    deadline = time.monotonic() + seconds
    pause = POLL_FIRST
    while reservation.get("status") in ("pending", "queued"):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(pause, left))
        pause = min(pause * 1.5, POLL_MOST)
        reservation = api.reservation(reservation["id"])
    return reservation


USAGE_SPAN = timedelta(days=366)  # the longest period GET /v1/usage answers


def names_of(api: ServiceClient, reservations: list[dict[str, Any]], current: bool = False) -> dict[str, str]:
    """Node names for the reservations' allocations (``current``: only their current ones), a view's
    lookup for people only. A node that answers no name (deleted, or a key without inventory reads) is
    looked up in the usage by node of the periods it held their work, which names deleted nodes too;
    one that held nothing keeps its id."""
    wanted = reservation_nodes(reservations, current)
    names = api.node_names(wanted)
    unnamed = set().union(*wanted.values()) - names.keys() if wanted else set()
    if unnamed:
        for (tenant, pool), (start, end) in held_windows(reservations, unnamed, current).items():
            end = min(end, start + USAGE_SPAN)
            found = api.held_node_names(tenant, pool, start.isoformat(), end.isoformat())
            names.update({node_id: name for node_id, name in found.items() if node_id in unnamed})
    return names


@client_command()
def release(api: ServiceClient, reservation_id: ReservationArg) -> Shown:
    """Release a reservation (its holdings end now)."""
    from app.client import render as out

    answer = api.release(reservation_id)
    return Shown(answer, lambda wide: out.reservation_view(answer, {}, wide))

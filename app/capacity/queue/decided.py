"""The ``bc_decided`` notification's payloads: :func:`decided_payloads` packs decided reservations'
views as lines ``<id>\t<view JSON>`` under NOTIFY's 8000-byte limit (:data:`PAYLOAD_BYTES`), and
:func:`parse_decided` reads them back. The view JSON is the ``Reservation`` answer as the API writes
it (:func:`view_json`; :func:`read_view_json` reads it back). Pure string work, no I/O; the long-poll
that waits on them is described on docs/lifecycle.md.
"""

from __future__ import annotations

from collections.abc import Iterator

from app.answers.reservations import Reservation

PAYLOAD_BYTES = 7900  # a bc_decided payload stays under NOTIFY's 8000-byte limit


def view_json(view: Reservation) -> str:
    """``view`` as compact JSON, the fields it has set under their JSON names (what the route answers)."""
    return view.model_dump_json(by_alias=True, exclude_unset=True)


def read_view_json(text: str) -> Reservation:
    """The ``Reservation`` of a :func:`view_json` text."""
    return Reservation.model_validate_json(text)


def decided_payloads(views: list[Reservation], limit: int = PAYLOAD_BYTES) -> list[str]:
    """The ``bc_decided`` payloads of ``views``: lines ``<id>\t<view JSON>``, each payload under
    ``limit`` bytes; a view too long for one payload is sent as its bare ``<id>`` (its waiters read it)."""
    payloads: list[str] = []
    lines: list[str] = []
    size = 0
    for view in views:
        line = f"{view.id}\t{view_json(view)}"
        n = len(line.encode())
        if n >= limit:
            line, n = view.id, len(view.id.encode())
        if lines and size + 1 + n >= limit:
            payloads.append("\n".join(lines))
            lines, size = [], 0
        lines.append(line)
        size += n + (1 if size else 0)
    if lines:
        payloads.append("\n".join(lines))
    return payloads


def parse_decided(payload: str) -> Iterator[tuple[str, str]]:
    """``(reservation id, view JSON or "")`` per line of a ``bc_decided`` payload, the JSON not parsed."""
    for line in payload.split("\n"):
        rid, _, view = line.partition("\t")
        if rid:
            yield rid, view

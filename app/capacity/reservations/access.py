"""Who may act on a reservation: the reservations' authorization and not-found rule, written once.

A reservation exists for a caller when it is there and, for a tenant-scoped key, the key's tenant owns
it (:func:`app.iam.authorize.exists_for`); otherwise the answer is 404 ``reservation '<id>' not found``,
never 403, so its existence is not revealed. A visible reservation still needs ``action`` granted on
``tenant:<owner>`` (403). Routes call :func:`authorized_reservation_tenant` before the service call and
the service re-applies :func:`visible` to the row it reads under its lock; the long-poll
(:meth:`app.capacity.queue.worker.QueueWorker.wait`) reads the view first and authorizes on the owner it
names,
with the same rule (:func:`~app.iam.authorize.authorize_owned`), so it needs one read, not two.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.locks import lock_reservation
from app.db.tables import reservations
from app.db.tx import reads
from app.errors import NotFound, quote_input
from app.iam.authorize import Principal, authorize_owned, exists_for, not_found


def reservation_named(reservation_id: str) -> str:
    """``reservation '<id>'``: how errors name a reservation."""
    return f"reservation {quote_input(reservation_id)}"


def reservation_not_found(reservation_id: str) -> NotFound:
    """The one 404 of a reservation that does not exist or is another tenant's."""
    return not_found(reservation_named(reservation_id))


def visible(row: Any, tenant_id: str | None) -> bool:
    """Whether the reservation ``row`` (None: absent) exists for a caller acting for ``tenant_id``."""
    return row is not None and exists_for(tenant_id, row.tenant_id)


async def lock_visible(conn: AsyncConnection, reservation_id: str, tenant_id: str | None) -> Any:
    """The reservation's row locked ``FOR UPDATE`` (:func:`app.db.locks.lock_reservation`, first in the
    lock order) for a caller acting for ``tenant_id``; NotFound when it does not exist for that caller
    (:func:`visible`). The write paths on one reservation (release, extend) start here."""
    row = await lock_reservation(conn, reservation_id)
    if not visible(row, tenant_id):
        raise reservation_not_found(reservation_id)
    return row


@reads
async def authorized_reservation_tenant(
    conn: AsyncConnection, principal: Principal, reservation_id: str, action: str
) -> str:
    """The tenant owning ``reservation_id`` once ``action`` is authorized on it: NotFound (404) when it
    does not exist or is another tenant's than a tenant-scoped principal's, Forbidden (403) when
    ``action`` is not granted on ``tenant:<owner>``.

    ``SELECT tenant_id FROM reservations WHERE id = :reservation_id`` (no lock: a reservation never
    changes tenant)."""
    owner = (
        await conn.execute(sa.select(reservations.c.tenant_id).where(reservations.c.id == reservation_id))
    ).scalar()
    return authorize_owned(principal, action, owner, reservation_named(reservation_id))

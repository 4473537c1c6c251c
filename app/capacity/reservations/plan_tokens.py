"""Plan tokens (docs/api.md, "Plan tokens"): what a preview planned, signed, so that a create with
``ifPlan`` commits exactly that plan (:mod:`app.capacity.reservations.plan_commit`) or nothing.

A token is ``<base64url(payload)>.<base64url(HMAC-SHA256(key, first part))>``, unpadded. The payload is
compact JSON::

    {"v": 1, "tenant": "acme", "pool": "pool_...", "body": "<spec_hash of the body>",
     "start": "<ISO 8601>", "end": "<ISO 8601>",
     "nodes": [{"id": "node_...", "name": "dgx-03", "atoms": [["GPU-..."]], "held": [],
                "resources": {"cpu": "8"}, "reasons": [], "cordoned": false, "ready": true,
                "heartbeatLost": false, "bookings": "<sha256 of the overlapping allocation ids>"}],
     "iat": "<ISO 8601>", "exp": "<ISO 8601>"}

``body`` is :func:`app.capacity.requests.spec_hash` of the body as stored (idempotencyKey and ifPlan
left out), so only the same request may commit the plan. ``nodes`` is the plan: one node, or a gang's
members; per node the atoms per device request, a whole-node lease's held atoms, the scalar amounts,
and the state the plan read (its NoSchedule reasons and conditions, and which bookings overlapped the
window there). ``iat`` and ``exp`` are on the database clock, ``exp = iat + BC_PLAN_TOKEN_TTL``.

The key is ``BC_PLAN_TOKEN_SECRET`` when set, else the random secret of the ``plan_token_secrets``
table, made once by the first preview that signs (every replica reads the same row) and kept in
:class:`~app.capacity.config.PlanTokenKeys` once read. A token that does not verify with a kept key is
checked once more against the row read again.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.answers.reservations import Preview
from app.capacity.config import CapacityConfig, PlanTokenKeys
from app.capacity.requests import spec_hash
from app.db.tables import device_bookings, devices, nodes, plan_token_secrets
from app.db.windows import window
from app.errors import InvalidInput
from app.observability.metrics import PLAN_TOKEN_CREATES
from app.placement.model import Candidate, PlacementRequest
from app.placement.request import ReservationRequest

VERSION = 1
PATH = "ifPlan"  # the field a refused token is named by
SECRET_ROW = 1


@dataclass(frozen=True, slots=True)
class PlannedNode:
    """One node of a signed plan: what to book there and the state the plan read of it."""

    node_id: str
    node_name: str
    atoms_by_request: tuple[tuple[str, ...], ...]
    held_atoms: tuple[str, ...]
    resources: Mapping[str, Decimal]
    reasons: tuple[str, ...]  # nodes.no_schedule_reasons as read
    cordoned: bool
    ready: bool
    heartbeat_lost: bool
    bookings: str  # sha256 of the ids of the allocations booked on the node in the window, sorted

    def candidate(self) -> Candidate:
        """The candidate the guarded commit writes (no score: it is not ranked again)."""
        return Candidate(
            self.node_id,
            self.node_name,
            self.atoms_by_request,
            dict(self.resources),
            0.0,
            {},
            self.held_atoms,
        )


@dataclass(frozen=True, slots=True)
class PlanClaim:
    """A verified token: the tenant, pool and body hash it binds, the window ``[start, end)``, the
    plan's nodes (a gang's members, else one) and when it was issued and expires (database clock)."""

    tenant_id: str
    pool_id: str
    body: str
    start: datetime
    end: datetime
    nodes: tuple[PlannedNode, ...]
    issued: datetime
    expires: datetime

    def node(self, node_id: str) -> PlannedNode | None:
        return next((n for n in self.nodes if n.node_id == node_id), None)


# --- the key ------------------------------------------------------------------------------------------

# INSERT INTO plan_token_secrets (id, secret) VALUES (1, :secret) ON CONFLICT (id) DO NOTHING
MAKE_SECRET = pg_insert(plan_token_secrets).on_conflict_do_nothing(index_elements=["id"])
# SELECT secret FROM plan_token_secrets WHERE id = 1
READ_SECRET = sa.select(plan_token_secrets.c.secret).where(plan_token_secrets.c.id == SECRET_ROW)


async def signing_key(engine: AsyncEngine, keys: PlanTokenKeys) -> bytes:
    """The key to sign with: ``BC_PLAN_TOKEN_SECRET``, or the stored secret (made here, in a unit of
    work of its own, by the first signer of a database; a concurrent maker's row wins)."""
    if keys.configured is not None:
        return keys.configured.encode()
    if keys.stored is None:
        async with engine.begin() as conn:
            await conn.execute(MAKE_SECRET, {"id": SECRET_ROW, "secret": secrets.token_hex(32)})
            keys.stored = (await conn.execute(READ_SECRET)).scalar_one().encode()
    return keys.stored


async def checking_key(conn: AsyncConnection, keys: PlanTokenKeys, *, fresh: bool = False) -> bytes | None:
    """The key to check with: ``BC_PLAN_TOKEN_SECRET``, the stored secret as kept, or (``fresh``, or
    none kept) as read now; None when the database has none (no token was ever signed there)."""
    if keys.configured is not None:
        return keys.configured.encode()
    if keys.stored is None or fresh:
        stored = (await conn.execute(READ_SECRET)).scalar_one_or_none()
        keys.stored = stored.encode() if stored is not None else None
    return keys.stored


# --- the format ---------------------------------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _signature(key: bytes, signed: str) -> bytes:
    return hmac.new(key, signed.encode(), hashlib.sha256).digest()


def encode(payload: Mapping[str, Any], key: bytes) -> str:
    """The token of ``payload`` signed with ``key``."""
    signed = _b64(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode())
    return f"{signed}.{_b64(_signature(key, signed))}"


def decode(token: str, key: bytes) -> dict[str, Any] | None:
    """The payload of ``token`` when its signature is ``key``'s; None when it is not, or the token is
    no ``<payload>.<signature>`` of base64url and JSON."""
    signed, dot, signature = token.partition(".")
    try:
        given = _unb64(signature)
    except (binascii.Error, ValueError):
        return None
    if not dot or not hmac.compare_digest(given, _signature(key, signed)):
        return None
    try:
        payload = json.loads(_unb64(signed))
    except (binascii.Error, ValueError):
        return None
    return payload if isinstance(payload, dict) else None


def bookings_digest(allocation_ids: Sequence[str] | None) -> str:
    """The identifier of the bookings a plan saw on a node: sha256 of their allocation ids, sorted."""
    return hashlib.sha256("\n".join(sorted(set(allocation_ids or ()))).encode()).hexdigest()


def node_payload(candidate: Candidate, state: Any) -> dict[str, Any]:
    """One node of a payload: ``candidate``'s plan and ``state``, its row of :data:`NODE_STATES`."""
    return {
        "id": candidate.node_id,
        "name": candidate.node_name,
        "atoms": [list(group) for group in candidate.atoms_by_request],
        "held": list(candidate.held_atoms),
        "resources": {name: str(amount) for name, amount in sorted(candidate.resources.items())},
        "reasons": list(state.no_schedule_reasons or ()),
        "cordoned": bool(state.cordoned),
        "ready": bool(state.ready),
        "heartbeatLost": bool(state.heartbeat_lost),
        "bookings": bookings_digest(state.bookings),
    }


def claim_of(payload: Mapping[str, Any]) -> PlanClaim:
    """The :class:`PlanClaim` of a verified payload. Raises KeyError, TypeError or ValueError for one
    of another shape (another version of the service signed it)."""
    if payload["v"] != VERSION:
        raise ValueError("another version")
    planned = tuple(
        PlannedNode(
            node_id=str(n["id"]),
            node_name=str(n["name"]),
            atoms_by_request=tuple(tuple(str(a) for a in group) for group in n["atoms"]),
            held_atoms=tuple(str(a) for a in n["held"]),
            resources={str(k): Decimal(str(v)) for k, v in n["resources"].items()},
            reasons=tuple(str(r) for r in n["reasons"]),
            cordoned=bool(n["cordoned"]),
            ready=bool(n["ready"]),
            heartbeat_lost=bool(n["heartbeatLost"]),
            bookings=str(n["bookings"]),
        )
        for n in payload["nodes"]
    )
    if not planned:
        raise ValueError("no nodes")
    return PlanClaim(
        tenant_id=str(payload["tenant"]),
        pool_id=str(payload["pool"]),
        body=str(payload["body"]),
        start=datetime.fromisoformat(payload["start"]),
        end=datetime.fromisoformat(payload["end"]),
        nodes=planned,
        issued=datetime.fromisoformat(payload["iat"]),
        expires=datetime.fromisoformat(payload["exp"]),
    )


# --- signing a preview --------------------------------------------------------------------------------

_NODE_IDS = sa.bindparam("node_ids", type_=pg.ARRAY(sa.Text))
_DURING = sa.bindparam("during", type_=device_bookings.c.during.type)
# SELECT n.id, n.cordoned, n.ready, n.heartbeat_lost, n.no_schedule_reasons,
#        (SELECT array_agg(DISTINCT b.allocation_id) FROM device_bookings b JOIN devices d
#          ON d.pk = b.device_pk WHERE d.node_id = n.id AND b.during && :during) AS bookings, now() AS now
#   FROM nodes n WHERE n.id = ANY(:node_ids)
NODE_STATES = sa.select(
    nodes.c.id,
    nodes.c.cordoned,
    nodes.c.ready,
    nodes.c.heartbeat_lost,
    nodes.c.no_schedule_reasons,
    sa.select(sa.func.array_agg(sa.distinct(device_bookings.c.allocation_id)))
    .select_from(device_bookings.join(devices, devices.c.pk == device_bookings.c.device_pk))
    .where(devices.c.node_id == nodes.c.id, device_bookings.c.during.op("&&")(_DURING))
    .scalar_subquery()
    .label("bookings"),
    sa.func.now().label("now"),
).where(nodes.c.id == sa.any_(_NODE_IDS))


async def sign_preview(
    engine: AsyncEngine,
    config: CapacityConfig,
    body: ReservationRequest,
    request: PlacementRequest,
    ranked: Sequence[Candidate],
    answer: Preview,
    *,
    gang: bool,
) -> None:
    """Give a preview that fits its plan tokens: each of ``ranked`` (the answer's candidates, in order)
    its own, the best one's also as ``planToken``; a gang (``ranked`` are its members) one token for
    all its members, as ``planToken`` only. Reads the candidates' nodes once (:data:`NODE_STATES`);
    a node gone meanwhile gets no token."""
    assert request.start is not None and request.end is not None
    keys = config.plan_tokens
    key = await signing_key(engine, keys)
    async with engine.connect() as conn:
        params = {
            "node_ids": sorted({c.node_id for c in ranked}),
            "during": window(request.start, request.end),
        }
        states = {row.id: row for row in (await conn.execute(NODE_STATES, params)).all()}
    if not states or any(c.node_id not in states for c in (ranked if gang else ranked[:1])):
        return
    now = next(iter(states.values())).now
    common = {
        "v": VERSION,
        "tenant": body.tenantId,
        "pool": body.poolId,
        "body": spec_hash(body.spec()),
        "start": request.start.isoformat(),
        "end": request.end.isoformat(),
        "iat": now.isoformat(),
        "exp": (now + timedelta(seconds=keys.ttl)).isoformat(),
    }
    if gang:
        nodes_of = [node_payload(c, states[c.node_id]) for c in ranked]
        answer.planToken = encode({**common, "nodes": nodes_of}, key)
        return
    for shown, ranked_candidate in zip(answer.candidates, ranked, strict=True):
        state = states.get(ranked_candidate.node_id)
        if state is not None:
            shown.planToken = encode({**common, "nodes": [node_payload(ranked_candidate, state)]}, key)
    answer.planToken = answer.candidates[0].planToken


# --- checking a create's token ------------------------------------------------------------------------


def refused(message: str) -> InvalidInput:
    """422 INVALID_INPUT at ``ifPlan``, counted as an ``invalid`` plan-token create."""
    PLAN_TOKEN_CREATES.labels("invalid").inc()
    return InvalidInput(message, path=PATH)


async def read_claim(
    conn: AsyncConnection,
    config: CapacityConfig,
    body: ReservationRequest,
    digest: str,
    token: str,
    now: datetime,
) -> PlanClaim:
    """The plan ``token`` binds, checked for the create ``body`` (``digest``: its spec hash) at the
    database's ``now``. Raises InvalidInput at ``ifPlan`` (docs/api.md, "Plan tokens") for a token
    this service did not sign or that was altered, one of another tenant, pool or body, one expired,
    and one whose window has ended."""
    keys = config.plan_tokens
    key = await checking_key(conn, keys)
    payload = decode(token, key) if key is not None else None
    if payload is None and keys.configured is None:  # the stored secret may have been made again
        key = await checking_key(conn, keys, fresh=True)
        payload = decode(token, key) if key is not None else None
    if payload is None:
        raise refused("ifPlan is not a plan token of this service, or it was altered: preview again")
    try:
        claim = claim_of(payload)
    except (KeyError, TypeError, ValueError, AttributeError, InvalidOperation):
        raise refused("ifPlan was signed by another version of this service: preview again") from None
    if claim.tenant_id != body.tenantId:
        raise refused(f"ifPlan was issued for another tenant, not {body.tenantId}")
    if claim.pool_id != body.poolId:
        raise refused(f"ifPlan was issued for another pool, not {body.poolId}")
    if claim.body != digest:
        raise refused(
            "ifPlan was issued for another request: the body must be the previewed one (idempotencyKey aside)"
        )
    if claim.expires <= now:
        raise refused(f"ifPlan expired at {claim.expires.isoformat()} (now {now.isoformat()}): preview again")
    if claim.end <= now:  # a short window previewed without a start: nothing of it is left to hold
        raise refused(
            f"ifPlan's window ended at {claim.end.isoformat()} (now {now.isoformat()}): preview again"
        )
    return claim

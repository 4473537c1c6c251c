"""IAM service: create and revoke API keys, resolve a presented key to a principal (docs/operating.md,
"Keys")."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from app.answers.iam import ApiKey
from app.db.tables import api_keys, grants, principals
from app.db.tx import transaction
from app.errors import Forbidden, InvalidInput, Unauthenticated, quote_input
from app.iam.authorize import (
    ACTIONS,
    Grant,
    Principal,
    authorize,
    authorize_owned,
    is_admin,
    is_allowed,
    not_found,
    refusal,
)
from app.iam.keys import generate_key, hash_key, same_key
from app.ids import new_id

BOOTSTRAP_KEY_ID = "bootstrap"  # the key id of BC_BOOTSTRAP_ADMIN_KEY (access log, rate limit)
BOOTSTRAP_PRINCIPAL = Principal(
    id="principal_bootstrap", name="bootstrap-admin", grants=(Grant("*", "*"),), key_id=BOOTSTRAP_KEY_ID
)
RESOURCE_PREFIXES = ("pool:", "tenant:")


def validate_grants(items: list[Grant]) -> None:
    """Refuse unknown actions and resources other than ``*``, ``pool:<id>``, ``tenant:<id>``.

    Raises :class:`~app.errors.InvalidInput` with the path ``grants.<i>.action|resource``.
    """
    for i, g in enumerate(items):
        if g.action != "*" and g.action not in ACTIONS and not g.action.endswith(":*"):
            raise InvalidInput(f"unknown action {quote_input(g.action)}", path=f"grants.{i}.action")
        if g.resource != "*" and not (
            g.resource.startswith(RESOURCE_PREFIXES) and len(g.resource.split(":", 1)[1]) > 0
        ):
            raise InvalidInput("a resource is '*', 'pool:<id>' or 'tenant:<id>'", path=f"grants.{i}.resource")


def authorize_key_creation(creator: Principal, tenant_id: str | None, key_grants: list[Grant]) -> None:
    """No escalation: a key mints keys only for its own tenant and only with grants it holds itself.

    An admin (untenanted, ``compute:iam:admin`` on ``*``) mints anything. Any other creator needs
    ``compute:iam:admin`` on ``tenant:<tenantId>`` (on ``*`` for an untenanted key); a tenant-scoped
    creator must name its own tenant, and every requested grant must be covered by one of its own
    (``pool:*`` covers ``pool:p1``; ``*`` only by ``*``). Raises :class:`~app.errors.Forbidden`.

    The grants are checked as input first, for every creator that holds ``compute:iam:admin`` on some
    resource (:func:`validate_grants`, 422 naming ``grants.<i>.action|resource``): an unknown action is
    bad input, not an escalation. A key that holds it nowhere was refused before its body was read
    (app/api/route_grants.py)."""
    validate_grants(key_grants)
    if is_admin(creator):
        return
    resource = f"tenant:{tenant_id}" if tenant_id else "*"
    if creator.tenant_id is not None and tenant_id != creator.tenant_id:
        raise refusal(creator, "compute:iam:admin", resource, tenant_scope=True)
    authorize(creator, "compute:iam:admin", resource, tenant=tenant_id)
    for i, g in enumerate(key_grants):
        if not is_allowed(creator, g.action, g.resource):
            raise Forbidden(
                f"grants.{i}: this key does not hold {g.action} on {g.resource} itself",
                {"path": f"grants.{i}", "action": g.action, "resource": g.resource},
            )


@transaction
async def create_api_key(
    conn: AsyncConnection,
    name: str,
    tenant_id: str | None,
    key_grants: list[Grant],
    expires_at: datetime | None = None,
) -> ApiKey:
    """Create a principal named ``name`` with ``key_grants`` and one key; answers the
    :class:`~app.answers.iam.ApiKey` whose ``key`` is shown this once (it is stored hashed, app/iam/keys.py;
    docs/api.md). ``expires_at`` (aware; None: never) must be after the database's now. Raises
    :class:`~app.errors.InvalidInput` for a grant :func:`validate_grants` refuses (``grants.<i>.*``) or an
    ``expires_at`` not in the future (``expiresAt``); nothing is written then."""
    validate_grants(key_grants)
    if expires_at is not None:
        now = (await conn.execute(sa.select(sa.func.now()))).scalar_one()
        if expires_at <= now:
            raise InvalidInput(f"expiresAt: must be in the future (now {now.isoformat()})", path="expiresAt")
    principal_id = new_id("principal")
    key_id = new_id("key")
    key = generate_key()
    await conn.execute(sa.insert(principals).values(id=principal_id, name=name, tenant_id=tenant_id))
    if key_grants:
        await conn.execute(
            sa.insert(grants),
            [
                {"principal_id": principal_id, "action": g.action, "resource": g.resource}
                for g in set(key_grants)
            ],
        )
    await conn.execute(
        sa.insert(api_keys).values(
            id=key_id, principal_id=principal_id, key_hash=hash_key(key), expires_at=expires_at
        )
    )
    return ApiKey(
        id=key_id,
        key=key,
        principal=name,
        tenantId=tenant_id,
        expiresAt=None if expires_at is None else expires_at.isoformat(),
    )


@transaction
async def revoke_api_key(conn: AsyncConnection, key_id: str, revoker: Principal) -> None:
    """Revoke a key. Raises :class:`~app.errors.NotFound` for an unknown or already revoked id, or a key
    of another tenant than a tenant-scoped revoker's; :class:`~app.errors.Forbidden` without
    ``compute:iam:admin`` on the key's tenant (``*`` for an untenanted key)."""
    # SELECT p.tenant_id FROM api_keys k JOIN principals p ON p.id = k.principal_id
    #  WHERE k.id = :key_id AND k.revoked_at IS NULL
    row = (
        await conn.execute(
            sa.select(principals.c.tenant_id)
            .select_from(api_keys.join(principals, principals.c.id == api_keys.c.principal_id))
            .where(api_keys.c.id == key_id, api_keys.c.revoked_at.is_(None))
        )
    ).first()
    what = f"api key {quote_input(key_id)}"
    if row is None:
        raise not_found(what)
    if row.tenant_id is None:
        if revoker.tenant_id is not None:  # an untenanted key is invisible to a tenant's key
            raise not_found(what)
        authorize(revoker, "compute:iam:admin", "*")
    else:
        authorize_owned(revoker, "compute:iam:admin", row.tenant_id, what)
    result = await conn.execute(
        sa.update(api_keys)
        .where(api_keys.c.id == key_id, api_keys.c.revoked_at.is_(None))
        .values(revoked_at=sa.func.now())
        .returning(api_keys.c.id)
    )
    if result.first() is None:  # revoked meanwhile
        raise not_found(what)


LAST_USE_EVERY_SECONDS = 60  # ``last_used_at`` is written at most this often per key (docs/operating.md)
_LAST_USE_STALE = sa.literal_column(f"interval '{LAST_USE_EVERY_SECONDS} seconds'")
KEY_EXPIRED = "key expired"
UNKNOWN_KEY = "unknown or revoked API key"


@dataclass(frozen=True, slots=True)
class KeyLookup:
    """A presented key's principal, and ``expires_in``: seconds until the key expires by the database's
    clock (None: never), so a cache of principals can stop serving it at that instant
    (app/iam/key_cache.py)."""

    principal: Principal
    expires_in: float | None = None


async def principal_for_key(conn: AsyncConnection, key: str, bootstrap_key: str | None) -> KeyLookup:
    """The principal behind ``key`` (one statement). Raises :class:`~app.errors.Unauthenticated`:
    ``unknown or revoked API key``, or ``key expired`` once the database's now reaches its ``expires_at``.

    The same statement notes the use: ``last_used_at`` becomes now when it is null or older than
    :data:`LAST_USE_EVERY_SECONDS` (a data-modifying CTE whose condition is false on almost every lookup,
    so a key writes its row at most once a minute however many processes and requests use it)."""
    if bootstrap_key and same_key(key, bootstrap_key):
        return KeyLookup(BOOTSTRAP_PRINCIPAL)
    key_hash = hash_key(key)
    # WITH touched AS (UPDATE api_keys SET last_used_at = now() WHERE key_hash = :hash
    #   AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())
    #   AND (last_used_at IS NULL OR last_used_at < now() - interval '60 seconds') RETURNING id)
    # SELECT k.id, extract(epoch FROM k.expires_at - now()), p.id, p.name, p.tenant_id, g.action,
    #   g.resource FROM api_keys k JOIN principals p ON p.id = k.principal_id
    #   LEFT JOIN grants g ON g.principal_id = p.id WHERE k.key_hash = :hash AND k.revoked_at IS NULL
    touched = (
        sa.update(api_keys)
        .where(
            api_keys.c.key_hash == key_hash,
            api_keys.c.revoked_at.is_(None),
            sa.or_(api_keys.c.expires_at.is_(None), api_keys.c.expires_at > sa.func.now()),
            sa.or_(
                api_keys.c.last_used_at.is_(None),
                api_keys.c.last_used_at < sa.func.now() - _LAST_USE_STALE,
            ),
        )
        .values(last_used_at=sa.func.now())
        .returning(api_keys.c.id)
        .cte("touched")
    )
    rows = (
        await conn.execute(
            sa.select(
                api_keys.c.id.label("key_id"),
                sa.extract("epoch", api_keys.c.expires_at - sa.func.now()).label("expires_in"),
                principals.c.id,
                principals.c.name,
                principals.c.tenant_id,
                grants.c.action,
                grants.c.resource,
            )
            .add_cte(touched)
            .select_from(
                api_keys.join(principals, principals.c.id == api_keys.c.principal_id).outerjoin(
                    grants, grants.c.principal_id == principals.c.id
                )
            )
            .where(api_keys.c.key_hash == key_hash, api_keys.c.revoked_at.is_(None))
        )
    ).all()
    if not rows:
        raise Unauthenticated(UNKNOWN_KEY)
    first = rows[0]
    expires_in = None if first.expires_in is None else float(first.expires_in)
    if expires_in is not None and expires_in <= 0:
        raise Unauthenticated(KEY_EXPIRED)
    held = tuple(Grant(r.action, r.resource) for r in rows if r.action is not None)
    principal = Principal(
        id=first.id, name=first.name, tenant_id=first.tenant_id, grants=held, key_id=first.key_id
    )
    return KeyLookup(principal, expires_in)

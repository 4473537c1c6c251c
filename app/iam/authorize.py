"""Authorization: does a principal hold a grant of ``action`` on ``resource``? (docs/api.md, "HTTP API").

Actions: ``compute:capacity:read``, ``compute:reservations:create|read|release``,
``compute:inventory:write|read``, ``compute:nodes:hello`` (a node agent: Hello and heartbeats of the
pool's nodes), ``compute:quota:write``, ``compute:placement:explain``, ``compute:iam:admin``.
Resources: ``pool:<id>``, ``tenant:<id>``, ``*``. A grant's action may be ``*`` or end in ``:*`` (a
prefix); its resource may be ``*`` or ``pool:*`` / ``tenant:*``.

Tenant scope (docs/api.md) lives here, once for every route: a tenant-scoped principal
acts only for its own tenant (another tenant named in a body or path is 403 whatever its grants say),
and a resource owned by another tenant does not exist for it (404, :func:`authorize_owned`). An admin is
a principal without a tenant holding ``compute:iam:admin`` on ``*``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from app.errors import Forbidden, NotFound

ACTIONS: tuple[str, ...] = (
    "compute:capacity:read",
    "compute:reservations:create",
    "compute:reservations:read",
    "compute:reservations:release",
    "compute:inventory:write",
    "compute:inventory:read",
    "compute:nodes:hello",
    "compute:quota:write",
    "compute:placement:explain",
    "compute:iam:admin",
)


@dataclass(frozen=True, slots=True)
class Grant:
    """One ``(action, resource)`` pair held by a principal."""

    action: str
    resource: str


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: ``tenant_id`` set means a tenant-scoped key that sees only that tenant's work."""

    id: str
    name: str
    tenant_id: str | None = None
    grants: tuple[Grant, ...] = field(default_factory=tuple)
    key_id: str | None = None  # the API key presented ("bootstrap" for BC_BOOTSTRAP_ADMIN_KEY)


def _covers(granted: str, wanted: str) -> bool:
    """The one matching rule of a grant's action and of its resource: ``*``, the name itself, or a
    prefix ending in ``:*`` (``compute:reservations:*``, ``pool:*``)."""
    if granted in ("*", wanted):
        return True
    return granted.endswith(":*") and wanted.startswith(granted[:-1])


def is_allowed(principal: Principal, action: str, resource: str) -> bool:
    """True when some grant covers ``action`` on ``resource``."""
    return any(_covers(g.action, action) and _covers(g.resource, resource) for g in principal.grants)


def is_admin(principal: Principal) -> bool:
    """An admin key: no tenant, and ``compute:iam:admin`` on ``*``."""
    return principal.tenant_id is None and is_allowed(principal, "compute:iam:admin", "*")


def holds_grant_on(principal: Principal, resource: str) -> bool:
    """True when some grant (any action) covers ``resource``, e.g. ``pool:<id>`` (pool listing)."""
    return any(_covers(g.resource, resource) for g in principal.grants)


def can_see_tenant(principal: Principal, tenant_id: str) -> bool:
    """False when a tenant-scoped principal looks at another tenant's resource."""
    return exists_for(principal.tenant_id, tenant_id)


def _another_tenants(principal: Principal, resource: str) -> bool:
    """True when ``resource`` is ``tenant:<id>`` of a tenant ``principal`` may not see."""
    return resource.startswith("tenant:") and not can_see_tenant(principal, resource[len("tenant:") :])


def exists_for(acting_tenant: str | None, owner_tenant: str | None) -> bool:
    """The one visibility rule: a resource owned by ``owner_tenant`` (None: there is no such resource)
    exists for a caller acting for ``acting_tenant`` (None: an untenanted key, which sees every tenant)
    when it is there and, for a tenant-scoped caller, its own. A service re-reading a row under its lock
    applies it as :func:`authorize_owned` did before the call."""
    return owner_tenant is not None and (acting_tenant is None or acting_tenant == owner_tenant)


def may_read_work_of(principal: Principal, tenant_id: str) -> bool:
    """Whether ``principal`` may read ``tenant_id``'s reservations, as ``GET /v1/reservations?tenantId=``
    would let it: the tenant exists for it (:func:`exists_for`: its own, or any for an untenanted key)
    and it holds ``compute:reservations:read`` on ``tenant:<tenant_id>``. The occupancy's rule for
    showing who booked an atom (app/inventory/occupancy.py)."""
    return exists_for(principal.tenant_id, tenant_id) and is_allowed(
        principal, "compute:reservations:read", f"tenant:{tenant_id}"
    )


def not_found(what: str) -> NotFound:
    """The one 404 of a resource that does not exist or may not be seen: ``<what> not found`` (its
    existence is not revealed: the same text either way)."""
    return NotFound(f"{what} not found")


def granted_pools(principal: Principal, action: str) -> frozenset[str] | None:
    """The pool ids on which ``action`` is granted (``pool:<id>`` grants), or ``None`` when a grant covers
    every pool (resource ``*`` or ``pool:*``). Lets a hot path guard its statement by pool instead of
    reading the row's pool first; :func:`authorize` stays the rule."""
    return _granted_ids(principal, action, "pool:")


def granted_tenants(principal: Principal, action: str) -> frozenset[str] | None:
    """The tenant ids on which ``action`` is granted (``tenant:<id>`` grants), or ``None`` when a grant
    covers every tenant (resource ``*`` or ``tenant:*``); :func:`granted_pools`' twin for tenants."""
    return _granted_ids(principal, action, "tenant:")


def _granted_ids(principal: Principal, action: str, kind: str) -> frozenset[str] | None:
    """The ids of the ``<kind><id>`` resources on which ``action`` is granted, or ``None`` when a grant
    covers every one of them (resource ``*`` or ``<kind>*``)."""
    ids: set[str] = set()
    for g in principal.grants:
        if not _covers(g.action, action):
            continue
        if g.resource in ("*", f"{kind}*"):
            return None
        if g.resource.startswith(kind):
            ids.add(g.resource[len(kind) :])
    return frozenset(ids)


def refusal(principal: Principal, action: str, resource: str, tenant_scope: bool = False) -> Forbidden:
    """The one 403 (:class:`~app.errors.Forbidden`) of refusing ``action`` on ``resource``: details
    ``{"action", "resource"}``, plus ``tenantId`` (the tenant the key acts for) when the refusal is about
    tenant scope, i.e. ``resource`` is another tenant's (``tenant:<other>``) or ``tenant_scope`` says so."""
    details = {"action": action, "resource": resource}
    if tenant_scope or _another_tenants(principal, resource):
        return Forbidden(
            f"this key acts for tenant {principal.tenant_id} only",
            {**details, "tenantId": principal.tenant_id},
        )
    return Forbidden(f"{action} is not granted on {resource}", details)


def authorize(principal: Principal, action: str, *resources: str, tenant: str | None = None) -> None:
    """Raise :func:`refusal` (403) unless ``action`` is granted on every one of ``resources``.

    ``tenant`` names the tenant the request acts for (a body's ``tenantId``, a path's tenant). A
    tenant-scoped principal may act only for its own tenant: another ``tenant`` (refused as resource
    ``tenant:<tenant>``) and any ``tenant:<other>`` resource are refused whatever its grants say.
    """
    if tenant is not None and not can_see_tenant(principal, tenant):
        raise refusal(principal, action, f"tenant:{tenant}")
    for resource in resources or ("*",):
        if _another_tenants(principal, resource) or not is_allowed(principal, action, resource):
            raise refusal(principal, action, resource)


def authorize_owned(principal: Principal, action: str, owner_tenant: str | None, what: str) -> str:
    """Authorize ``action`` on a resource owned by ``owner_tenant`` (None: it does not exist) and return
    the owner. Raises :class:`~app.errors.NotFound` (``"<what> not found"``) when it does not exist or
    belongs to another tenant than a tenant-scoped principal's (404, not 403: its existence is not
    revealed), :class:`~app.errors.Forbidden` when it is visible but ``action`` is not granted on
    ``tenant:<owner>``."""
    if owner_tenant is None or not exists_for(principal.tenant_id, owner_tenant):
        raise not_found(what)
    authorize(principal, action, f"tenant:{owner_tenant}")
    return owner_tenant


def holds_action(principal: Principal, action: str) -> bool:
    """True when some grant covers ``action`` on some resource: without one, :func:`authorize` refuses
    ``action`` whatever the resource (the request guard's check before a body is read)."""
    return any(_covers(g.action, action) for g in principal.grants)


def refusal_everywhere(action: str) -> Forbidden:
    """The 403 of a key that holds ``action`` on no resource at all: details ``{"action", "resource":
    "*"}``."""
    return Forbidden(
        f"{action} is not granted to this key on any resource", {"action": action, "resource": "*"}
    )

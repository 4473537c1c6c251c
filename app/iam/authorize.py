"""Authorization: does a principal hold a grant of ``action`` on ``resource``? (DESIGN.md, "HTTP API").

Actions: ``compute:capacity:read``, ``compute:reservations:create|read|release``,
``compute:inventory:write|read``, ``compute:nodes:hello`` (a node agent: Hello and heartbeats of the
pool's nodes), ``compute:quota:write``, ``compute:placement:explain``, ``compute:iam:admin``.
Resources: ``pool:<id>``, ``tenant:<id>``, ``*``. A grant's action may be ``*`` or end in ``:*`` (a
prefix); its resource may be ``*`` or ``pool:*`` / ``tenant:*``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from app.errors import Forbidden

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


def _action_matches(granted: str, wanted: str) -> bool:
    if granted in ("*", wanted):
        return True
    return granted.endswith(":*") and wanted.startswith(granted[:-1])


def _resource_matches(granted: str, wanted: str) -> bool:
    if granted in ("*", wanted):
        return True
    return granted.endswith(":*") and wanted.startswith(granted[:-1])


def is_allowed(principal: Principal, action: str, resource: str) -> bool:
    """True when some grant covers ``action`` on ``resource``."""
    return any(
        _action_matches(g.action, action) and _resource_matches(g.resource, resource)
        for g in principal.grants
    )


def granted_pools(principal: Principal, action: str) -> frozenset[str] | None:
    """The pool ids on which ``action`` is granted (``pool:<id>`` grants), or ``None`` when a grant covers
    every pool (resource ``*`` or ``pool:*``). Lets a hot path guard its statement by pool instead of
    reading the row's pool first; :func:`authorize` stays the rule."""
    pools: set[str] = set()
    for g in principal.grants:
        if not _action_matches(g.action, action):
            continue
        if g.resource in ("*", "pool:*"):
            return None
        if g.resource.startswith("pool:"):
            pools.add(g.resource[len("pool:") :])
    return frozenset(pools)


def authorize(principal: Principal, action: str, *resources: str) -> None:
    """Raise :class:`~app.errors.Forbidden` unless ``action`` is granted on every one of ``resources``.

    A tenant-scoped principal may act only for its own tenant: a ``tenant:<other>`` resource is refused
    whatever its grants say.
    """
    for resource in resources or ("*",):
        if (
            principal.tenant_id is not None
            and resource.startswith("tenant:")
            and resource != f"tenant:{principal.tenant_id}"
        ):
            raise Forbidden(f"this key acts for tenant {principal.tenant_id} only", {"resource": resource})
        if not is_allowed(principal, action, resource):
            raise Forbidden(
                f"{action} is not granted on {resource}", {"action": action, "resource": resource}
            )

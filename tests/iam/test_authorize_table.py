"""``authorize()`` as a table (issue 16): (the principal's grants and tenant, the tenant acted for, the
action, the resources) -> allowed, or the refusal's shape (403 with ``details`` ``{action, resource}``,
plus ``tenantId`` when the refusal is about tenant scope); and ``authorize_owned`` -> 404 / 403 / owner."""

from __future__ import annotations

from typing import Any

import pytest

from app.errors import Forbidden, NotFound
from app.iam.authorize import Grant, Principal, authorize, authorize_owned

READ = "compute:reservations:read"
CREATE = "compute:reservations:create"
ADMIN = "compute:iam:admin"


def principal(*grants: tuple[str, str], tenant: str | None = None) -> Principal:
    return Principal(id="prn_1", name="p", tenant_id=tenant, grants=tuple(Grant(a, r) for a, r in grants))


def own(action: str, resource: str) -> dict[str, Any]:
    """The refusal of a missing grant."""
    return {
        "message": f"{action} is not granted on {resource}",
        "details": {"action": action, "resource": resource},
    }


def scoped(action: str, resource: str, tenant: str | None) -> dict[str, Any]:
    """The refusal of a tenant-scoped key acting for another tenant."""
    return {
        "message": f"this key acts for tenant {tenant} only",
        "details": {"action": action, "resource": resource, "tenantId": tenant},
    }


# (case, grants, principal's tenant, tenant acted for, action, resources, None = allowed or the refusal)
TABLE: list[tuple[str, tuple[tuple[str, str], ...], str | None, str | None, str, tuple[str, ...], Any]] = [
    ("exact grant", ((READ, "pool:p1"),), None, None, READ, ("pool:p1",), None),
    ("no grant at all", (), None, None, READ, ("pool:p1",), own(READ, "pool:p1")),
    ("other pool", ((READ, "pool:p1"),), None, None, READ, ("pool:p2",), own(READ, "pool:p2")),
    ("other action", ((READ, "pool:p1"),), None, None, CREATE, ("pool:p1",), own(CREATE, "pool:p1")),
    ("action *", (("*", "pool:p1"),), None, None, CREATE, ("pool:p1",), None),
    ("action prefix", (("compute:reservations:*", "*"),), None, None, CREATE, ("pool:p1",), None),
    (
        "prefix of another family",
        (("compute:quota:*", "*"),),
        None,
        None,
        CREATE,
        ("pool:p1",),
        own(CREATE, "pool:p1"),
    ),
    (
        "a prefix is not a substring",
        (("compute:res:*", "*"),),
        None,
        None,
        READ,
        ("pool:p1",),
        own(READ, "pool:p1"),
    ),
    ("resource *", ((READ, "*"),), None, None, READ, ("tenant:acme",), None),
    ("resource pool:*", ((READ, "pool:*"),), None, None, READ, ("pool:p9",), None),
    (
        "pool:* is not tenant:*",
        ((READ, "pool:*"),),
        None,
        None,
        READ,
        ("tenant:acme",),
        own(READ, "tenant:acme"),
    ),
    (
        "every resource must be granted",
        ((READ, "pool:p1"),),
        None,
        None,
        READ,
        ("pool:p1", "pool:p2"),
        own(READ, "pool:p2"),
    ),
    ("no resource means *", ((READ, "pool:p1"),), None, None, READ, (), own(READ, "*")),
    ("no resource, granted *", ((READ, "*"),), None, None, READ, (), None),
    ("admin acts for any tenant", ((ADMIN, "*"), (CREATE, "*")), None, "globex", CREATE, ("pool:p1",), None),
    ("own tenant", ((CREATE, "*"),), "acme", "acme", CREATE, ("pool:p1",), None),
    (
        "other tenant, whatever the grants",
        (("*", "*"),),
        "acme",
        "globex",
        CREATE,
        ("pool:p1",),
        scoped(CREATE, "tenant:globex", "acme"),
    ),
    (
        "other tenant's resource",
        (("*", "*"),),
        "acme",
        None,
        READ,
        ("tenant:globex",),
        scoped(READ, "tenant:globex", "acme"),
    ),
    ("own tenant's resource", ((READ, "tenant:acme"),), "acme", None, READ, ("tenant:acme",), None),
    ("own tenant, no grant", (), "acme", "acme", READ, ("tenant:acme",), own(READ, "tenant:acme")),
]


@pytest.mark.parametrize(
    ("case", "grants", "scope", "tenant", "action", "resources", "refused"),
    TABLE,
    ids=[row[0] for row in TABLE],
)
def test_authorize(
    case: str,
    grants: tuple[tuple[str, str], ...],
    scope: str | None,
    tenant: str | None,
    action: str,
    resources: tuple[str, ...],
    refused: Any,
) -> None:
    who = principal(*grants, tenant=scope)
    if refused is None:
        assert authorize(who, action, *resources, tenant=tenant) is None
        return
    with pytest.raises(Forbidden) as caught:
        authorize(who, action, *resources, tenant=tenant)
    error = caught.value
    assert (error.status, error.code) == (403, "FORBIDDEN")
    assert {"message": error.message, "details": error.details} == refused


@pytest.mark.parametrize(
    ("grants", "scope", "owner", "outcome"),
    [
        (((READ, "*"),), None, "acme", "acme"),
        (((READ, "*"),), "acme", "acme", "acme"),
        (((READ, "*"),), "acme", "globex", NotFound),  # another tenant's: it does not exist for this key
        (((READ, "*"),), None, None, NotFound),  # it does not exist
        (((READ, "tenant:globex"),), None, "acme", Forbidden),  # visible, not granted
    ],
)
def test_authorize_owned(
    grants: tuple[tuple[str, str], ...], scope: str | None, owner: str | None, outcome: Any
) -> None:
    who = principal(*grants, tenant=scope)
    if isinstance(outcome, str):
        assert authorize_owned(who, READ, owner, "reservation") == outcome
        return
    with pytest.raises(outcome) as caught:
        authorize_owned(who, READ, owner, "reservation")
    if outcome is NotFound:
        assert (caught.value.status, caught.value.message) == (404, "reservation not found")
    else:
        assert caught.value.details == {"action": READ, "resource": "tenant:acme"}

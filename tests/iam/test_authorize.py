"""Table tests of the authorization rules (app/iam/authorize.py): grants, tenant scope, and the one
visibility rule behind every 404 of another tenant's resource. Pure: no database."""

from __future__ import annotations

import pytest

from app.errors import Forbidden, NotFound
from app.iam.authorize import Grant, Principal, authorize, authorize_owned, exists_for, not_found


def key(*grants: tuple[str, str], tenant: str | None = None) -> Principal:
    return Principal(id="p", name="p", tenant_id=tenant, grants=tuple(Grant(a, r) for a, r in grants))


READ = "compute:reservations:read"
ADMIN = key(("*", "*"))
POOL_READER = key(("compute:inventory:read", "pool:p1"))
ANY_POOL = key(("compute:inventory:*", "pool:*"))
ACME = key((READ, "tenant:acme"), tenant="acme")
ACME_WIDE = key(("*", "*"), tenant="acme")


@pytest.mark.parametrize(
    ("principal", "action", "resources", "tenant", "refused"),
    [
        (ADMIN, "compute:iam:admin", ("*",), None, None),
        (ADMIN, READ, ("tenant:globex",), "globex", None),
        (POOL_READER, "compute:inventory:read", ("pool:p1",), None, None),
        (POOL_READER, "compute:inventory:read", ("pool:p2",), None, "pool:p2"),
        (POOL_READER, "compute:inventory:write", ("pool:p1",), None, "pool:p1"),
        (POOL_READER, "compute:inventory:read", ("*",), None, "*"),  # a pool grant is not every pool
        (POOL_READER, "compute:inventory:read", (), None, "*"),  # no resource named: "*"
        (ANY_POOL, "compute:inventory:write", ("pool:p9",), None, None),  # pool:* and a :* action
        (ANY_POOL, "compute:quota:write", ("pool:p9",), None, "pool:p9"),  # compute:inventory:* only
        (ANY_POOL, "compute:inventory:read", ("tenant:acme",), None, "tenant:acme"),
        (ACME, READ, ("tenant:acme",), "acme", None),
        (ACME, READ, ("tenant:globex",), None, "tenant:globex"),  # another tenant's resource
        (ACME_WIDE, READ, ("tenant:globex",), None, "tenant:globex"),  # whatever its grants say
        (ACME_WIDE, READ, ("pool:p1",), "globex", "tenant:globex"),  # acting for another tenant
        (ACME_WIDE, READ, ("pool:p1", "tenant:acme"), "acme", None),
        (
            key((READ, "tenant:acme"), ("compute:capacity:read", "pool:p1")),
            READ,
            ("tenant:acme", "pool:p1"),
            None,
            "pool:p1",
        ),
    ],
)
def test_authorize(
    principal: Principal, action: str, resources: tuple[str, ...], tenant: str | None, refused: str | None
) -> None:
    if refused is None:
        authorize(principal, action, *resources, tenant=tenant)
        return
    with pytest.raises(Forbidden) as error:
        authorize(principal, action, *resources, tenant=tenant)
    assert error.value.details["resource"] == refused
    assert error.value.details["action"] == action


@pytest.mark.parametrize(
    ("acting", "owner", "exists"),
    [
        (None, "acme", True),  # an untenanted key sees every tenant
        ("acme", "acme", True),
        ("acme", "globex", False),  # another tenant's: does not exist for it
        (None, None, False),  # not there at all
        ("acme", None, False),
    ],
)
def test_exists_for(acting: str | None, owner: str | None, exists: bool) -> None:
    assert exists_for(acting, owner) is exists


@pytest.mark.parametrize(
    ("principal", "owner", "answer"),
    [
        (ADMIN, "globex", "globex"),
        (ACME, "acme", "acme"),
        (ACME, "globex", NotFound),  # 404, not 403: its existence is not revealed
        (ADMIN, None, NotFound),
        (key(("compute:capacity:read", "*")), "acme", Forbidden),  # visible, action not granted
        (key((READ, "tenant:globex")), "acme", Forbidden),
    ],
)
def test_authorize_owned(principal: Principal, owner: str | None, answer: object) -> None:
    if isinstance(answer, str):
        assert authorize_owned(principal, READ, owner, "reservation 'r1'") == answer
        return
    assert isinstance(answer, type)
    with pytest.raises(answer) as error:
        authorize_owned(principal, READ, owner, "reservation 'r1'")
    if answer is NotFound:
        assert error.value.message == "reservation 'r1' not found" == not_found("reservation 'r1'").message

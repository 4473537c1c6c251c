"""``better-compute key create|list|revoke`` against one real running service (docs/cli.md, "Keys"),
through typer's runner as in tests/test_cli_client.py (the ``server`` fixture of tests/conftest.py: a
``better-compute serve`` process on the test database)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import yaml

from app.client.key_commands import Role, expires_at, role_grants
from tests.servers import Server
from tests.test_cli_client import cli


def test_key_create_list_and_revoke(server: Server) -> None:
    made = cli(
        server, "key", "create", "--tenant", "cli-t", "--role", "admin", "--expires", "30d", "-o", "json"
    )
    assert made.exit_code == 0, made.stderr
    key = json.loads(made.stdout)
    assert key["tenantId"] == "cli-t" and key["principal"] == "cli-t-admin" and key["key"].startswith("bck_")
    ahead = datetime.fromisoformat(key["expiresAt"]) - datetime.now(UTC)
    assert timedelta(days=29) < ahead <= timedelta(days=30)

    shown = cli(server, "key", "create", "--tenant", "cli-t", "--role", "reader", "--name", "ro")
    assert shown.exit_code == 0, shown.stderr
    assert "key (shown once, store it now): bck_" in shown.stdout and "ro" in shown.stdout
    other = cli(server, "key", "create", "--tenant", "cli-u", "-o", "yaml")
    assert other.exit_code == 0 and yaml.safe_load(other.stdout)["principal"] == "cli-u-user"

    listed = cli(server, "key", "list", "-o", "json")
    assert listed.exit_code == 0, listed.stderr
    items = json.loads(listed.stdout)["items"]
    assert key["id"] in {k["id"] for k in items} and key["key"] not in listed.stdout
    table = cli(server, "key", "list", "-o", "wide")
    assert table.exit_code == 0 and "LAST USED" in table.stdout and "GRANTS" in table.stdout
    row = next(line for line in table.stdout.splitlines() if line.startswith(key["id"]))
    assert "active" in row and "compute:iam:admin on tenant:cli-t" in row

    # the tenant's admin key lists its tenant's keys only
    own = cli(server, "key", "list", "-o", "json", key=key["key"])
    assert own.exit_code == 0, own.stderr
    assert {k["tenantId"] for k in json.loads(own.stdout)["items"]} == {"cli-t"}

    revoked = cli(server, "key", "revoke", key["id"])
    assert (revoked.exit_code, revoked.stdout) == (0, f"revoked {key['id']}\n")
    after = {k["id"]: k for k in json.loads(cli(server, "key", "list", "-o", "json").stdout)["items"]}
    assert after[key["id"]]["revokedAt"] is not None
    refused = cli(server, "key", "list", key=key["key"])
    assert refused.exit_code == 1 and refused.stderr == "UNAUTHENTICATED: unknown or revoked API key\n"
    again = cli(server, "key", "revoke", key["id"])
    assert again.exit_code == 1 and again.stderr.startswith("NOT_FOUND: ")


def test_key_create_errors_name_the_flag(server: Server) -> None:
    past = cli(server, "key", "create", "--tenant", "cli-t", "--expires", "2001-01-01T00:00:00Z")
    assert past.exit_code == 1 and past.stderr.startswith("INVALID_INPUT: --expires: must be in the future")
    naive = cli(server, "key", "create", "--expires", "2031-01-01T00:00:00")
    assert naive.exit_code == 1 and naive.stderr.startswith("INVALID_INPUT: --expires: "), naive.stderr
    zero = cli(server, "key", "create", "--expires", "0d")
    assert zero.exit_code == 2 and "--expires '0d'" in zero.stderr
    huge = cli(server, "key", "create", "--expires", "99999999999d")
    assert huge.exit_code == 2 and huge.stderr == "--expires '99999999999d': too far ahead (past year 9999)\n"
    for text in ("yesterday", "-5m"):
        unread = cli(server, "key", "create", "--expires", text)
        assert unread.exit_code == 2, unread.output
        assert unread.stderr.startswith(f"--expires {text!r}: give a duration"), unread.stderr
        assert "30d" in unread.stderr and "2026-12-01T12:00:00Z" in unread.stderr
    role = cli(server, "key", "create", "--role", "god")
    assert role.exit_code == 2 and "'god' is not one of 'admin', 'user', 'reader'" in role.output
    assert "Value error" not in role.output  # typer 0.29's pydantic wording (pyproject.toml pins below it)


def test_roles_and_expiry_flags() -> None:
    assert role_grants(Role.admin, None) == [{"action": "*", "resource": "*"}]
    reader = role_grants(Role.reader, "t")
    assert {"action": "compute:reservations:read", "resource": "tenant:t"} in reader
    assert all(g["action"] != "compute:iam:admin" for g in reader)
    now = datetime(2026, 12, 1, tzinfo=UTC)
    assert expires_at("12h", now) == "2026-12-01T12:00:00+00:00"
    assert expires_at("2027-01-01T00:00:00Z", now) == "2027-01-01T00:00:00Z"

"""``better-compute usage`` against a real running service (docs/cli.md, "usage"): the table and
``-o json`` of a released reservation's hours, ``--last``, and the flags' errors (exit 2 before anything
is sent, the service's 422 named by its flag with exit 1)."""

from __future__ import annotations

import json
import secrets
from datetime import datetime, timedelta
from decimal import Decimal

import httpx
import pytest

from app.client.flags import UsageError
from app.client.usage_commands import hours_text, period_query
from tests.servers import Server
from tests.test_cli_client import ADMIN, api_get, cli, make_pool


def test_usage_table_and_json(server: Server) -> None:
    pool = make_pool(server, {"u1": 4})
    (name, node_id), tenant = next(iter(pool.nodes.items())), f"t-{secrets.token_hex(3)}"
    body = {
        "tenantId": tenant,
        "poolId": pool.id,
        "devices": [{"class": "gpu", "count": 2}],
        "resources": {"cpu": 8},
        "duration": "1h",
        "idempotencyKey": f"k-{secrets.token_hex(4)}",
    }
    placed = httpx.post(f"{server.url}/v1/reservations", json=body, headers=ADMIN).json()
    released = httpx.post(f"{server.url}/v1/reservations/{placed['id']}/release", headers=ADMIN).json()
    [allocation] = released["allocations"]
    start = datetime.fromisoformat(allocation["start"])
    held = (datetime.fromisoformat(allocation["releasedAt"]) - start).total_seconds()
    period = [
        "--from",
        (start - timedelta(hours=1)).isoformat(),
        "--to",
        (start + timedelta(hours=2)).isoformat(),
    ]

    result = cli(server, "usage", *period, "--tenant", tenant, "--by", "node", "-o", "json")
    assert result.exit_code == 0, result.output
    answer = json.loads(result.output)
    params = {"from": period[1], "to": period[3], "tenantId": tenant, "groupBy": "node"}
    assert answer == api_get(server, "/v1/usage", **params)
    [row] = answer["rows"]
    assert (row["nodeId"], row["nodeName"], row["poolId"]) == (node_id, name, pool.id)
    assert row["deviceHours"]["gpu"]["regular"] == pytest.approx(2 * held / 3600, abs=1e-9)
    assert row["scalarHours"]["cpu"]["regular"] == pytest.approx(8 * held / 3600, abs=1e-9)

    result = cli(server, "usage", *period, "--pool", pool.id, "--by", "node")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("usage from ") and lines[0].endswith(f"pool {pool.name}, by node"), lines[0]
    assert lines[1].split() == ["NODE", "RESOURCE", "REGULAR", "SPOT", "TOTAL", "UNIT"]
    gpu = hours_text(Decimal(2 * held) / 3600)
    assert lines[2].split() == [name, "gpu", gpu, "0", gpu, "GPU-hours"]
    assert lines[3].split()[:2] == [name, "cpu"] and lines[3].split()[-1] == "core-hours"
    wide = cli(server, "usage", *period, "--pool", pool.id, "--by", "node", "-o", "wide")
    assert wide.exit_code == 0 and node_id in wide.output and "NODE ID" in wide.output, wide.output
    by_name = cli(server, "usage", *period, "--pool", pool.name, "--by", "node")  # the pool by its name
    assert by_name.output == result.output, by_name.output
    for unknown in ("no-such-pool", "pool_00000000000000000000000000"):
        missing = cli(server, "usage", "--pool", unknown)
        assert missing.exit_code == 1 and missing.stderr.startswith(f"NOT_FOUND: pool '{unknown}' not found")

    by_resource = cli(server, "usage", *period, "--tenant", tenant, "--by", "resource")
    assert by_resource.exit_code == 0, by_resource.output
    assert [line.split()[0] for line in by_resource.output.splitlines()[1:]] == ["RESOURCE", "cpu", "gpu"]

    result = cli(server, "usage", "--last", "1d", "--tenant", tenant, "--by", "resource", "-o", "yaml")
    assert result.exit_code == 0 and "groupBy: resource" in result.output, result.output
    nothing = cli(server, "usage", "--tenant", f"nobody-{secrets.token_hex(2)}")
    assert nothing.exit_code == 0 and "nothing was held in the period" in nothing.output, nothing.output


def test_usage_flag_errors(server: Server) -> None:
    both = cli(server, "usage", "--last", "7d", "--from", "2026-01-01T00:00:00Z")
    assert both.exit_code == 2 and "--last is the period up to now" in both.output, both.output
    bad = cli(server, "usage", "--last", "7x")
    assert bad.exit_code == 2 and "--last '7x': duration must be like" in bad.output, bad.output
    backwards = cli(server, "usage", "--from", "2026-01-02T00:00:00Z", "--to", "2026-01-01T00:00:00Z")
    assert backwards.exit_code == 1 and backwards.output.startswith("INVALID_INPUT: --to: "), backwards.output
    no_offset = cli(server, "usage", "--from", "2026-01-02T00:00:00")
    assert no_offset.exit_code == 1 and "--from" in no_offset.output, no_offset.output
    assert cli(server, "usage", "--by", "rack").exit_code == 2


def test_period_query() -> None:
    now = datetime.fromisoformat("2026-03-01T00:00:00+00:00")
    assert period_query("2d", None, None, now) == {"from": "2026-02-27T00:00:00+00:00"}
    assert period_query(None, "a", None, now) == {"from": "a"}
    assert period_query(None, None, None, now) == {}
    with pytest.raises(UsageError):
        period_query("1d", None, "b", now)
    assert [hours_text(v) for v in (4.5, 0.0019444, 12, 0)] == ["4.5", "0.002", "12", "0"]

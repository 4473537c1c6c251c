"""``better-compute extend ID --to ISO | --by DURATION`` against a real running service (docs/cli.md,
"extend"): exit 0 extended (or already ending there), 1 an API error ``CODE: message`` with ``end``
shown as ``--to``, 2 a usage error that sends nothing."""

from __future__ import annotations

import json
import secrets
from datetime import datetime, timedelta
from typing import Any

import httpx
from typer.testing import CliRunner, Result

from app.cli import app
from tests.conftest import ADMIN_KEY
from tests.factories import gpu_node
from tests.servers import Server

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


def cli(server: Server, *args: str) -> Result:
    env = {"BC_SERVER": server.url, "BC_API_KEY": ADMIN_KEY}
    result = CliRunner().invoke(app, list(args), env=env)
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), (
        result.exception
    )
    return result


def api(server: Server, method: str, path: str, body: Any = None) -> dict[str, Any]:
    answer = httpx.request(method, f"{server.url}{path}", json=body, headers=ADMIN)
    assert answer.status_code in (200, 201), answer.text
    return answer.json()


def end_of(view: dict[str, Any]) -> datetime:
    return max(datetime.fromisoformat(a["end"]) for a in view["allocations"])


def test_extend_by_and_to_with_its_exit_codes(server: Server) -> None:
    suffix = secrets.token_hex(3)
    pool = api(server, "POST", "/v1/pools", {"name": f"cli-extend-{suffix}"})["id"]
    api(server, "POST", f"/v1/pools/{pool}/nodes", gpu_node(f"x-{suffix}", 1))

    def reserve(**extra: Any) -> dict[str, Any]:
        body = {
            "tenantId": "acme",
            "poolId": pool,
            "devices": [{"class": "gpu", "count": 1}],
            "duration": "1h",
            "idempotencyKey": f"k-{secrets.token_hex(4)}",
            **extra,
        }
        return api(server, "POST", "/v1/reservations", body)

    placed = reserve()
    first_end = end_of(placed)

    by = cli(server, "extend", placed["id"], "--by", "1h", "-o", "json")
    assert by.exit_code == 0, by.stderr
    assert end_of(json.loads(by.stdout)) == first_end + timedelta(hours=1)

    same = cli(server, "extend", placed["id"], "--to", (first_end + timedelta(hours=1)).isoformat())
    assert same.exit_code == 0, same.stderr
    assert placed["id"] in same.stdout and f"x-{suffix}" in same.stdout  # its table, the node by name
    assert "node_" not in same.stdout

    later = reserve(start=(first_end + timedelta(hours=2)).isoformat())
    blocked = cli(server, "extend", placed["id"], "--by", "2h")
    assert blocked.exit_code == 1
    assert blocked.stderr.startswith("CONFLICT: cannot extend to ") and later["id"] in blocked.stderr

    before = cli(server, "extend", placed["id"], "--to", "2000-01-01T00:00:00Z")
    assert before.exit_code == 1 and before.stderr.startswith("INVALID_INPUT: --to: "), before.stderr

    for args, says in (
        ((), "--to ISO or --by DURATION"),
        (("--to", "2030-01-01T00:00:00Z", "--by", "1h"), "--to ISO or --by DURATION"),
        (("--by", "3x"), "--by '3x'"),
        (("--to", "tomorrow"), "--to 'tomorrow': give an ISO 8601 time with its offset, e.g. "),
    ):
        usage = cli(server, "extend", placed["id"], *args)
        assert usage.exit_code == 2 and says in usage.stderr, (args, usage.stderr)
    now = api(server, "GET", f"/v1/reservations/{placed['id']}")
    assert end_of(now) == first_end + timedelta(hours=1)  # the refusals and usage errors changed nothing

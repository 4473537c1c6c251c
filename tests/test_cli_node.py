"""``better-compute node drain|undrain|delete`` against one real running service (docs/cli.md;
docs/operating.md, "Maintenance: drain and delete"): NODE by name or id (``--pool`` for a name), the
output (nodes by name, the drain in STATUS), ``-o json``, and exit codes (0 done, 1 an API error such as
the CONFLICT of a busy node's delete, printed ``CODE: message``); and ``get reservations`` after a drain
moved one (only its current allocation counts) and after its node was deleted (still by name)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import httpx

from tests.factories import gpu_node
from tests.servers import Server
from tests.test_cli_client import ADMIN, api_get, api_reserve, cli, cli_process, finished, make_pool


def row_of(output: str, first: str) -> list[str]:
    """The cells of the table line that starts with ``first`` (split on blanks; indented lines too)."""
    return next(line.split() for line in output.splitlines() if line.lstrip().startswith(first))


def test_node_drain_reschedule_undrain_and_delete(server: Server) -> None:
    pool = make_pool(server, {"m1": 4})
    (name, node_id) = next(iter(pool.nodes.items()))
    tenant = "t-maint"
    later = (datetime.now(UTC) + timedelta(days=2)).isoformat()
    future = httpx.post(
        f"{server.url}/v1/reservations",
        json={
            "tenantId": tenant,
            "poolId": pool.id,
            "devices": [{"class": "gpu", "count": 2}],
            "duration": "1h",
            "start": later,
            "idempotencyKey": f"k-{node_id}",
        },
        headers=ADMIN,
    )
    assert future.status_code == 201, future.text
    moved = future.json()
    placed = api_reserve(server, tenant, pool, 2)
    other = httpx.post(
        f"{server.url}/v1/pools/{pool.id}/nodes", json=gpu_node(f"m2-{pool.name}", 4), headers=ADMIN
    )
    assert other.status_code == 201, other.text
    other_name = other.json()["name"]

    # by name: the future reservation moves to the other node, named in the table
    result = cli(server, "node", "drain", name, "--reschedule")
    assert result.exit_code == 0, result.output
    assert row_of(result.output, name)[2:] == ["draining", "draining"], result.output
    assert "Rescheduled:" in result.output and "\n\n" not in result.output
    assert row_of(result.output, moved["id"]) == [
        moved["id"],
        "other_node",
        other_name,
    ]
    listed = cli(server, "get", "reservations", "--tenant", tenant)
    assert listed.exit_code == 0, listed.output
    assert row_of(listed.output, moved["id"])[2:5] == ["placed", "2", other_name], listed.output
    assert row_of(cli(server, "get", "nodes", "--pool", pool.name).output, name)[2] == "draining"

    code, out, err = finished(cli_process(server.url, "node", "delete", name))
    assert code == 1 and out == "", (code, out, err)
    assert err.startswith("CONFLICT: ") and placed["id"] in err and "Traceback" not in err

    release = httpx.post(f"{server.url}/v1/reservations/{placed['id']}/release", headers=ADMIN)
    assert release.status_code == 200, release.text
    result = cli(server, "node", "drain", node_id, "-o", "json")
    assert result.exit_code == 0 and json.loads(result.output)["drain"] == "drained", result.output
    described = cli(server, "describe", "node", name)
    assert "drained" in next(line for line in described.output.splitlines() if line.startswith("Status:"))

    result = cli(server, "node", "undrain", name, "--pool", pool.name, "-o", "yaml")
    assert result.exit_code == 0 and "drain: null" in result.output, result.output
    result = cli(server, "node", "drain", name, "--pool", pool.id)
    assert result.exit_code == 0 and row_of(result.output, name)[2:] == ["drained", "drained"]

    code, out, err = finished(cli_process(server.url, "node", "delete", name, "--pool", pool.name))
    assert code == 0 and out == f"node {name} ({node_id}) deleted\n", (out, err)
    assert [n["name"] for n in api_get(server, f"/v1/pools/{pool.id}/nodes")["items"]] == [other_name]
    code, _, err = finished(cli_process(server.url, "node", "delete", node_id, "-o", "json"))
    assert code == 1 and err.startswith("NOT_FOUND: "), err
    code, _, err = finished(cli_process(server.url, "node", "undrain", name))
    assert code == 1 and err.startswith(f"NOT_FOUND: node '{name}' not found"), err

    # the released reservation still names the deleted node (its usage names it; GET /v1/nodes is 404)
    listed = cli(server, "get", "reservations", "--tenant", tenant)
    assert row_of(listed.output, placed["id"])[2:5] == ["released", "2", name], listed.output
    described = cli(server, "describe", "reservation", moved["id"])
    assert described.exit_code == 0 and name in described.output and other_name in described.output

"""``better-compute node drain|undrain|delete`` against one real running service (docs/cli.md;
docs/operating.md, "Maintenance: drain and delete"): output, ``-o json``, and exit codes (0 done, 1 an
API error such as the CONFLICT of a busy node's delete, printed ``CODE: message``)."""

from __future__ import annotations

import json

import httpx

from tests.servers import Server
from tests.test_cli_client import (  # noqa: F401 (fixtures)
    ADMIN,
    api_get,
    api_reserve,
    cli,
    cli_process,
    finished,
    fresh_tables,
    make_pool,
    server,
)


def test_node_drain_reschedule_undrain_and_delete(server: Server) -> None:  # noqa: F811 (the fixture)
    pool = make_pool(server, {"m1": 4})
    (name, node_id) = next(iter(pool.nodes.items()))
    placed = api_reserve(server, "t-maint", pool, 2)

    result = cli(server, "node", "drain", node_id, "--reschedule")
    assert result.exit_code == 0, result.output
    assert name in result.output and "draining" in result.output

    code, out, err = finished(cli_process(server.url, "node", "delete", node_id))
    assert code == 1 and out == "", (code, out, err)
    assert err.startswith("CONFLICT: ") and placed["id"] in err and "Traceback" not in err

    release = httpx.post(f"{server.url}/v1/reservations/{placed['id']}/release", headers=ADMIN)
    assert release.status_code == 200, release.text
    result = cli(server, "node", "drain", node_id, "-o", "json")
    assert result.exit_code == 0 and json.loads(result.output)["drain"] == "drained", result.output

    result = cli(server, "node", "undrain", node_id, "-o", "yaml")
    assert result.exit_code == 0 and "drain: null" in result.output, result.output

    code, out, err = finished(cli_process(server.url, "node", "delete", node_id, "-o", "json"))
    assert code == 0 and json.loads(out) == {"id": node_id, "deleted": True}, (out, err)
    assert api_get(server, f"/v1/pools/{pool.id}/nodes")["items"] == []
    code, _, err = finished(cli_process(server.url, "node", "delete", node_id))
    assert code == 1 and err.startswith("NOT_FOUND: "), err

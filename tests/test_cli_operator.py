"""The operator commands of the CLI against one real running service (docs/cli.md, "Operator
commands"): ``pool create|archive``, ``node import|label|taint|untaint|cordon|uncordon``,
``quota get|set``, reserve's ``--start``, ``--gang``, ``--topology-key``, ``--whole-node`` and ``--wait``,
and the start-up rule that ``import app.cli`` imports no server module.

Each command runs in-process through typer's runner (the real command, the real service) or, where the
exit status and stderr are the point, as a real ``python -m app.cli`` process.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx

from tests.servers import REPO, Server
from tests.test_cli_client import ADMIN, api_get, api_reserve, cli, cli_process, finished, make_pool

TOPO = REPO / "tests" / "data" / "topo" / "05-4x-a100-nv4-mangled-header.txt"


def test_import_app_cli_imports_no_server_module() -> None:
    """The start-up rule (docs/cli.md, "Start-up"): checked on sys.modules of a fresh interpreter."""
    code = (
        "import sys, app.cli\n"
        "heavy = ('app.main', 'app.capacity', 'app.api', 'app.db', 'sqlalchemy', 'fastapi', 'httpx',"
        " 'yaml', 'pydantic')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy or m.startswith(heavy)))"
    )
    found = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True
    ).stdout
    assert found.strip() == "[]", found


def test_pool_create_and_archive(server: Server) -> None:
    name = f"op-{secrets.token_hex(3)}"
    result = cli(server, "pool", "create", name, "-o", "json")
    assert result.exit_code == 0, result.output
    pool = json.loads(result.stdout)
    assert pool["name"] == name and pool["archivedAt"] is None

    code, _, err = finished(cli_process(server.url, "pool", "create", name))
    assert code == 1 and err.startswith("CONFLICT: ") and len(err.strip().splitlines()) == 1
    code, _, err = finished(cli_process(server.url, "pool", "create", "bad name"))
    assert code == 1 and err.startswith("INVALID_INPUT: NAME: "), err

    result = cli(server, "pool", "archive", name)  # by its name
    assert result.exit_code == 0 and name in result.stdout and "archived" in result.stdout
    assert api_get(server, f"/v1/pools/{pool['id']}")["archivedAt"] is not None
    code, _, err = finished(cli_process(server.url, "pool", "archive", "no-such-pool"))
    assert code == 1 and err.startswith("NOT_FOUND: pool 'no-such-pool' not found"), err


def test_node_import_from_topo_output(server: Server, tmp_path: Path) -> None:
    pool = make_pool(server, {})
    topo = tmp_path / "a100-box.txt"
    topo.write_text(TOPO.read_text())
    result = cli(server, "node", "import", pool.name, str(topo), "--label", "rack=r1", "-o", "json")
    assert result.exit_code == 0, result.output
    node = json.loads(result.stdout)
    assert node["name"] == "a100-box" and node["labels"]["rack"] == "r1"
    assert sum(1 for d in node["devices"] if d["class"] == "gpu") == 4

    table = cli(server, "node", "import", pool.id, str(topo), "--name", "second")
    assert table.exit_code == 0 and "second" in table.stdout and "4 gpu" in table.stdout

    garbage = tmp_path / "garbage.txt"
    garbage.write_text("not a topo matrix\n")
    code, _, err = finished(cli_process(server.url, "node", "import", pool.id, str(garbage)))
    assert code == 1 and err.startswith("INVALID_INPUT: FILE: "), err
    code, _, err = finished(cli_process(server.url, "node", "import", pool.id, str(tmp_path / "none.txt")))
    assert code == 2 and "cannot read" in err
    names = [n["name"] for n in api_get(server, f"/v1/pools/{pool.id}/nodes")["items"]]
    assert sorted(names) == ["a100-box", "second"]  # nothing else was written


def test_node_label_sets_and_removes_operator_labels(server: Server) -> None:
    pool = make_pool(server, {"l1": 1})
    name, node_id = next(iter(pool.nodes.items()))
    result = cli(server, "node", "label", name, "team=ml", "tier=gold", "-o", "json")
    assert result.exit_code == 0, result.output
    assert {"team": "ml", "tier": "gold"}.items() <= json.loads(result.stdout)["labels"].items()

    result = cli(server, "node", "label", node_id, "tier=silver", "--remove", "team")
    assert result.exit_code == 0 and "tier=silver" in result.stdout and "team=" not in result.stdout
    labels = api_get(server, f"/v1/nodes/{node_id}")["labels"]
    assert labels.get("tier") == "silver" and "team" not in labels

    code, _, err = finished(cli_process(server.url, "node", "label", node_id, "bc.dev/x=1"))
    assert code == 1 and err.startswith("INVALID_INPUT: bc.dev/x=: "), err
    code, _, err = finished(cli_process(server.url, "node", "label", node_id, "--remove", "nope"))
    assert code == 1 and err.startswith("NOT_FOUND: "), err
    code, _, err = finished(cli_process(server.url, "node", "label", node_id))
    assert code == 2 and "nothing to change" in err
    code, _, err = finished(cli_process(server.url, "node", "label", node_id, "novalue"))
    assert code == 2 and "key=value" in err.lower()
    assert api_get(server, f"/v1/nodes/{node_id}")["labels"] == labels  # the refusals changed nothing


def test_node_taint_and_untaint(server: Server) -> None:
    pool = make_pool(server, {"t1": 1})
    name, node_id = next(iter(pool.nodes.items()))
    result = cli(server, "node", "taint", name, "gpu=repair:NoSchedule")
    assert result.exit_code == 0, result.output
    assert "gpu=repair:NoSchedule" in result.stdout and "tainted gpu=repair" in result.stdout
    result = cli(server, "node", "taint", name, "gpu=fixed:NoSchedule", "-o", "yaml")
    assert result.exit_code == 0 and "fixed" in result.stdout
    taints = api_get(server, f"/v1/nodes/{node_id}")["taints"]
    assert taints == [{"key": "gpu", "value": "fixed", "effect": "NoSchedule"}]  # replaced, not added

    code, _, err = finished(cli_process(server.url, "node", "taint", node_id, "gpu=x:Sometimes"))
    assert code == 2 and "NoSchedule, PreferNoSchedule, NoExecute" in err

    result = cli(server, "node", "untaint", name, "gpu", "-o", "json")
    assert result.exit_code == 0 and json.loads(result.stdout)["taints"] == []
    code, _, err = finished(cli_process(server.url, "node", "untaint", node_id, "gpu"))
    assert code == 1 and err.startswith("NOT_FOUND: ") and "has no taint gpu" in err


def test_node_cordon_and_uncordon(server: Server) -> None:
    pool = make_pool(server, {"c1": 1})
    name, node_id = next(iter(pool.nodes.items()))
    result = cli(server, "node", "cordon", name, "--pool", pool.name)
    assert result.exit_code == 0, result.output
    assert "Cordoned:" in result.stdout and "yes" in result.stdout
    assert api_get(server, f"/v1/nodes/{node_id}")["cordoned"] is True
    result = cli(server, "node", "uncordon", node_id, "-o", "json")
    assert result.exit_code == 0 and json.loads(result.stdout)["cordoned"] is False
    code, _, err = finished(cli_process(server.url, "node", "cordon", "no-such-node"))
    assert code == 1 and err.startswith("NOT_FOUND: node 'no-such-node' not found")


def test_quota_set_and_get(server: Server) -> None:
    pool = make_pool(server, {"q1": 4})
    tenant = f"t-{secrets.token_hex(3)}"
    result = cli(server, "quota", "set", tenant, pool.name, "gpu=8", "cpu=64", "-o", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["limits"] == {"cpu": 64, "gpu": 8}
    api_reserve(server, tenant, pool, 2)

    result = cli(server, "quota", "get", tenant, pool.id)
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line.split()[1:] for line in result.stdout.splitlines()[1:]}
    assert rows["gpu"][:2] == ["8", "2"] and rows["cpu"][0] == "64"

    result = cli(server, "quota", "set", tenant, pool.id, "gpu=4")  # cpu is dropped: a warning
    assert result.exit_code == 0 and "warning: " in result.stderr and "cpu" in result.stderr
    code, _, err = finished(cli_process(server.url, "quota", "set", tenant, pool.id, "gpu=lots"))
    assert code == 1 and err.startswith("INVALID_INPUT: gpu=: "), err
    code, _, err = finished(cli_process(server.url, "quota", "set", tenant, pool.id, "gpu"))
    assert code == 2 and "RESOURCE=AMOUNT 'gpu'" in err
    assert api_get(server, f"/v1/tenants/{tenant}/quotas/{pool.id}")["limits"] == {"gpu": 4}


def test_reserve_start_gang_topology_key_and_whole_node(server: Server) -> None:
    pool = make_pool(server, {"g1": 2, "g2": 2})
    for node_id in pool.nodes.values():
        labelled = httpx.put(
            f"{server.url}/v1/nodes/{node_id}/labels", json={"labels": {"rack": "r1"}}, headers=ADMIN
        )
        assert labelled.status_code == 200, labelled.text
    tenant = f"t-{secrets.token_hex(3)}"
    common = ["--tenant", tenant, "--pool", pool.name, "-o", "json"]  # the pool by its name

    later = (datetime.now(UTC) + timedelta(days=2)).replace(microsecond=0).isoformat()
    result = cli(server, "reserve", *common, "--gpus", "1", "--for", "1h", "--start", later)
    assert result.exit_code == 0, result.output
    placed = json.loads(result.stdout)
    assert datetime.fromisoformat(placed["allocations"][0]["start"]) == datetime.fromisoformat(later)

    gang = ["--gpus", "1", "--for", "1h", "--gang", "2", "--topology-key", "rack"]
    result = cli(server, "preview", *common, *gang)
    assert result.exit_code == 0 and len(json.loads(result.stdout)["candidates"]) == 2
    result = cli(server, "reserve", *common, *gang)
    assert result.exit_code == 0, result.output
    reserved = json.loads(result.stdout)
    assert reserved["spec"]["gang"] == {"members": 2, "topologyKey": "rack"}
    assert {a["nodeId"] for a in reserved["allocations"]} == set(pool.nodes.values())

    result = cli(server, "reserve", *common, "--gpus", "1", "--for", "1h", "--whole-node", "--start", later)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["spec"]["binding"] == "node"

    code, _, err = finished(cli_process(server.url, "reserve", *common, "--gpus", "1", "--gang", "0"))
    assert code == 2 and "--gang must be 1 or more" in err
    code, _, err = finished(
        cli_process(server.url, "reserve", *common, "--gpus", "1", "--start", "yesterday")
    )
    assert code == 2 and err.startswith("--start 'yesterday': give 'earliest' or an ISO 8601 time"), err
    code, _, err = finished(
        cli_process(server.url, "reserve", *common, "--gpus", "1", "--start", "2026-12-01T08:00:00")
    )
    assert code == 1 and err.startswith("INVALID_INPUT: --start: start needs a timezone"), err


def test_reserve_wait_until_placed_or_timeout(server: Server) -> None:
    pool = make_pool(server, {"w1": 2})
    tenant = f"t-{secrets.token_hex(3)}"
    blocker = api_reserve(server, tenant, pool, 2)
    common = ["--tenant", tenant, "--pool", pool.id, "--gpus", "2", "--for", "1h"]

    code, out, _ = finished(
        cli_process(server.url, "reserve", *common, "--wait", "--wait-timeout", "2s", "-o", "json")
    )
    assert code == 3 and json.loads(out)["status"] == "pending"  # still pending when the wait ran out
    gone = httpx.post(f"{server.url}/v1/reservations/{json.loads(out)['id']}/release", headers=ADMIN)
    assert gone.status_code == 200, gone.text  # so the release below wakes the next one

    waiting = cli_process(server.url, "reserve", *common, "--wait", "--wait-timeout", "2m", "-o", "json")
    time.sleep(1)  # let it be stored pending first; the release then wakes it
    release = threading.Thread(
        target=lambda: httpx.post(
            f"{server.url}/v1/reservations/{blocker['id']}/release", headers=ADMIN, timeout=30
        )
    )
    release.start()
    code, out, err = finished(waiting)
    release.join()
    assert code == 0, (out, err)
    assert json.loads(out)["status"] == "placed"

    code, _, err = finished(cli_process(server.url, "reserve", *common, "--wait", "--wait-timeout", "soon"))
    assert code == 2 and "--wait-timeout 'soon'" in err

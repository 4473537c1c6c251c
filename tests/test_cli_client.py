"""The CLI's client commands against one real running service (docs/cli.md; issue 10).

``get``, ``describe``, ``reserve``, ``preview`` and ``release`` talk HTTP to a ``better-compute serve``
process on the test database. Most commands run in-process through typer's runner (the real commands,
the real service); the exit-code and unreachable-service tests run the real ``python -m app.cli``
process, because what a shell sees (the exit status, stderr without a traceback) is the point there.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import typer
import yaml
from typer.testing import CliRunner, Result

from app.cli import app
from app.client.api import ServiceClient
from app.client.flags import REQUEST_FLAGS, RequestFlags, UsageError, with_flag
from app.client.render import when
from tests.conftest import ADMIN_KEY
from tests.factories import gpu_node
from tests.servers import REPO, Server, free_port, running_server

pytestmark = pytest.mark.slow  # a long module: it starts early in a parallel run (tests/conftest.py)

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


@dataclass
class Pool:
    """A pool made for one test: its id, name and ``{node name: node id}``."""

    id: str
    name: str
    nodes: dict[str, str]


def make_pool(server: Server, nodes: dict[str, int]) -> Pool:
    """A new pool with one ``gpu_node`` per ``{name: gpus}`` (names get the pool's suffix)."""
    suffix = secrets.token_hex(3)
    name = f"cli-{suffix}"
    pool_id = httpx.post(f"{server.url}/v1/pools", json={"name": name}, headers=ADMIN).json()["id"]
    ids = {}
    for node, gpus in nodes.items():
        body = gpu_node(f"{node}-{suffix}", gpus)
        answer = httpx.post(f"{server.url}/v1/pools/{pool_id}/nodes", json=body, headers=ADMIN)
        assert answer.status_code == 201, answer.text
        ids[body["name"]] = answer.json()["id"]
    return Pool(pool_id, name, ids)


def api_reserve(server: Server, tenant: str, pool: Pool, gpus: int) -> dict[str, Any]:
    body = {
        "tenantId": tenant,
        "poolId": pool.id,
        "devices": [{"class": "gpu", "count": gpus}],
        "duration": "1h",
        "idempotencyKey": f"k-{secrets.token_hex(4)}",
    }
    answer = httpx.post(f"{server.url}/v1/reservations", json=body, headers=ADMIN)
    assert answer.status_code == 201, answer.text
    return answer.json()


def api_get(server: Server, path: str, **params: Any) -> Any:
    answer = httpx.get(f"{server.url}{path}", params=params, headers=ADMIN)
    assert answer.status_code == 200, answer.text
    return answer.json()


def cli(server: Server | None, *args: str, key: str | None = ADMIN_KEY) -> Result:
    """The real command in-process (typer's runner), against ``server``."""
    env = {"BC_SERVER": server.url if server else "http://127.0.0.1:9", "BC_API_KEY": key or ""}
    result = CliRunner().invoke(app, list(args), env=env)
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), (
        result.exception
    )
    return result


def cli_process(url: str, *args: str, key: str = ADMIN_KEY) -> subprocess.Popen[str]:
    """``python -m app.cli ARGS`` as its own process (started, not waited for)."""
    env = {"BC_SERVER": url, "BC_API_KEY": key, "PATH": "/usr/bin:/bin", "HOME": "/tmp"}
    return subprocess.Popen(
        [sys.executable, "-m", "app.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        encoding="utf-8",
        cwd=REPO,
        env=env,
    )


def finished(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    stdout, stderr = process.communicate(timeout=60)
    assert "Traceback" not in stdout + stderr, stderr
    return process.returncode, stdout, stderr


def test_reserve_and_preview_exit_codes_placed_pending_and_no_fit(server: Server) -> None:
    pool = make_pool(server, {"a1": 4})
    (name, node_id), tenant = next(iter(pool.nodes.items())), f"t-{secrets.token_hex(3)}"
    common = ["--tenant", tenant, "--pool", pool.id]

    code, out, _ = finished(cli_process(server.url, "preview", *common, "--gpus", "2", "--nvlink"))
    assert code == 0 and name in out and node_id not in out  # people see the node's name

    code, out, err = finished(
        cli_process(server.url, "reserve", *common, "--gpus", "4", "--cpu", "8", "--for", "2h", "-o", "json")
    )
    assert code == 0, err
    placed = json.loads(out)
    assert placed["status"] == "placed" and len(placed["allocations"][0]["atoms"]) == 4

    pending_table = cli_process(server.url, "reserve", *common, "--gpus", "1")
    pending_json = cli_process(server.url, "reserve", *common, "--gpus", "2", "-o", "json")
    no_fit = cli_process(server.url, "preview", *common, "--gpus", "1")
    code, out, _ = finished(pending_table)
    assert code == 3 and "pending" in out and "1 × fits: 0 of 4 gpu free" in out
    code, out, _ = finished(pending_json)
    assert code == 3 and json.loads(out)["status"] == "pending"
    assert "×" in out and "\\u00d7" not in out  # UTF-8, not an escape
    code, out, _ = finished(no_fit)
    assert code == 3 and "does not fit" in out and "0 of 4 gpu free" in out
    assert "Rejections:" in out and "Nearest misses:" in out
    assert [name, "fits", "0", "of", "1", "gpu", "free", "1"] in [line.split() for line in out.splitlines()]

    # what the pool could never hold is an error (exit 1), not a wait (exit 3): docs/cli.md
    never = f"UNSATISFIABLE: no node of pool {pool.name} can hold 5 gpu: the largest has 4"
    never_reserve = cli_process(server.url, "reserve", *common, "--gpus", "5")
    never_preview = cli_process(server.url, "preview", *common, "--gpus", "5")
    typo = cli_process(server.url, "reserve", *common, "--gpus", "1", "--class", "tpu")
    code, _, err = finished(never_reserve)
    assert code == 1 and err.strip() == never
    code, out, err = finished(never_preview)
    assert code == 1 and err.strip() == never and "does not fit" in out
    code, _, err = finished(typo)
    unknown = f"INVALID_INPUT: --class: pool {pool.name} has no device class tpu; it has: gpu"
    assert code == 1 and err.strip() == unknown

    code, out, _ = finished(cli_process(server.url, "release", placed["id"]))
    assert code == 0 and f"{placed['id']} released" in out


def test_reserve_with_the_pool_lease_placer_answers_the_decision(
    database_url: str, fresh_tables: None, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """With ``BC_CAPACITY_PLACER=pool-lease`` the create answers 202 ``queued``; ``reserve`` waits for
    the batch worker's decision (the long-poll) and exits 0 when placed, 3 when pending (found by a
    fresh-user run: it printed ``queued`` and exited 3 for work placed milliseconds later)."""
    lease = {"BC_CAPACITY_PLACER": "pool-lease"}
    with running_server(database_url, tmp_path_factory.mktemp("cli-lease"), extra_env=lease) as server:
        pool = make_pool(server, {"q1": 2})
        common = ["--tenant", f"t-{secrets.token_hex(3)}", "--pool", pool.id, "-o", "json"]
        code, out, err = finished(cli_process(server.url, "reserve", *common, "--gpus", "2"))
        assert code == 0, err
        assert json.loads(out)["status"] == "placed" and len(json.loads(out)["allocations"][0]["atoms"]) == 2
        code, out, _ = finished(cli_process(server.url, "reserve", *common, "--gpus", "1"))
        assert code == 3 and json.loads(out)["status"] == "pending"


def test_spot_work_and_the_preview_that_would_preempt_it(server: Server) -> None:
    pool = make_pool(server, {"s1": 4})
    (name, _node_id), tenant = next(iter(pool.nodes.items())), f"t-{secrets.token_hex(3)}"
    common = ["--tenant", tenant, "--pool", pool.id]
    code, out, err = finished(
        cli_process(server.url, "reserve", *common, "--gpus", "4", "--spot", "-o", "json")
    )
    assert code == 0, err
    assert json.loads(out)["spec"]["spot"] is True
    code, out, _ = finished(cli_process(server.url, "preview", *common, "--gpus", "4"))
    assert code == 3 and "does not fit" in out
    assert f"fits by preempting 1 spot reservation(s) on {name}" in out, out
    code, out, _ = finished(cli_process(server.url, "preview", *common, "--gpus", "4", "--spot"))
    assert code == 3 and "preempting" not in out  # spot never preempts spot


def test_reserve_earliest_and_the_preview_that_names_the_window(server: Server) -> None:
    pool = make_pool(server, {"e1": 4})
    (name, _node_id), tenant = next(iter(pool.nodes.items())), f"t-{secrets.token_hex(3)}"
    common = ["--tenant", tenant, "--pool", pool.id]
    code, out, err = finished(
        cli_process(server.url, "reserve", *common, "--gpus", "2", "--for", "1h", "-o", "json")
    )
    assert code == 0, err
    held_end = json.loads(out)["allocations"][0]["end"]
    code, out, _ = finished(cli_process(server.url, "preview", *common, "--gpus", "4", "--for", "1h"))
    assert (
        code == 3 and "does not fit" in out and f"earliest: from {when(held_end)}" in out and name in out
    ), out
    code, out, err = finished(
        cli_process(server.url, "reserve", *common, "--gpus", "4", "--for", "1h", "--earliest", "-o", "json")
    )
    assert code == 0, err
    placed = json.loads(out)
    assert placed["spec"]["start"] == "earliest" and placed["allocations"][0]["start"] == held_end


def test_preview_prints_its_plan_token_and_reserve_if_plan_commits_exactly_it(server: Server) -> None:
    """docs/cli.md: ``preview`` prints ``plan token: <token>``; ``reserve --if-plan`` with the same flags
    commits exactly that plan, and a second one with the same token is PLAN_STALE (exit 1)."""
    pool = make_pool(server, {"p1": 4, "p2": 4})
    common = ["--tenant", f"t-{secrets.token_hex(3)}", "--pool", pool.id, "--gpus", "2", "--for", "2h"]
    shown = cli(server, "preview", *common)
    assert shown.exit_code == 0, shown.stderr
    [line] = [x for x in shown.stdout.splitlines() if x.startswith("plan token: ")]
    token = line.removeprefix("plan token: ")
    as_json = json.loads(cli(server, "preview", *common, "-o", "json").stdout)
    best = as_json["candidates"][0]
    assert as_json["planToken"] and best["planToken"]
    assert "--if-plan" not in cli(server, "preview", "--help").stdout  # preview takes no token

    placed = cli(server, "reserve", *common, "--if-plan", token, "-o", "json")
    assert placed.exit_code == 0, placed.stderr
    [alloc] = json.loads(placed.stdout)["allocations"]
    assert (alloc["nodeId"], alloc["atoms"]) == (best["nodeId"], best["atoms"])
    again = cli(server, "reserve", *common, "--if-plan", token)
    assert again.exit_code == 1 and again.stderr.startswith("PLAN_STALE: "), again.stderr
    name = {node_id: node for node, node_id in pool.nodes.items()}[best["nodeId"]]
    assert f"on {name} were booked by another reservation" in again.stderr
    other = cli(server, "reserve", *common[:-2], "--for", "3h", "--if-plan", token)
    assert other.exit_code == 1 and other.stderr.startswith("INVALID_INPUT: --if-plan: "), other.stderr


def test_get_pools_and_nodes_in_every_output(server: Server) -> None:
    pool = make_pool(server, {"n1": 2, "n2": 1})
    (n1, n1_id), (n2, n2_id) = pool.nodes.items()
    httpx.post(f"{server.url}/v1/nodes/{n2_id}/cordon", headers=ADMIN).raise_for_status()

    table = cli(server, "get", "pools")
    assert table.exit_code == 0 and pool.name in table.stdout and pool.id in table.stdout
    assert "{}" not in table.stdout
    assert "CPU" in cli(server, "get", "pools", "-o", "wide").stdout
    assert json.loads(cli(server, "get", "pools", pool.id, "-o", "json").stdout) == api_get(
        server, f"/v1/pools/{pool.id}"
    )
    listed = yaml.safe_load(cli(server, "get", "pools", "-o", "yaml").stdout)
    assert pool.id in [p["id"] for p in listed["items"]]

    nodes = cli(server, "get", "nodes", "--pool", pool.id)
    assert nodes.exit_code == 0
    lines = {line.split()[0]: line for line in nodes.stdout.splitlines()[1:]}
    assert set(lines) == {n1, n2}
    assert "schedulable" in lines[n1] and "2 gpu" in lines[n1] and "cordoned" in lines[n2]
    as_json = json.loads(cli(server, "get", "nodes", "--pool", pool.id, "-o", "json").stdout)
    assert [n["id"] for n in as_json["items"]] == sorted([n1_id, n2_id])
    one = json.loads(cli(server, "get", "nodes", "--pool", pool.id, "--limit", "1", "-o", "json").stdout)
    assert len(one["items"]) == 1
    assert yaml.safe_load(cli(server, "get", "nodes", n1_id, "-o", "yaml").stdout) == api_get(
        server, f"/v1/nodes/{n1_id}"
    )
    everywhere = cli(server, "get", "nodes", "-o", "wide").stdout  # every pool's, with the pool's name
    assert any(n1 in line and pool.name in line for line in everywhere.splitlines())


def test_get_and_describe_reservations(server: Server) -> None:
    pool = make_pool(server, {"r1": 2})
    (name, node_id), tenant = next(iter(pool.nodes.items())), f"t-{secrets.token_hex(3)}"
    placed = api_reserve(server, tenant, pool, 2)
    pending = api_reserve(server, tenant, pool, 2)
    assert (placed["status"], pending["status"]) == ("placed", "pending")

    table = cli(server, "get", "reservations", "--tenant", tenant)
    assert table.exit_code == 0
    rows = {line.split()[0]: line for line in table.stdout.splitlines()[1:]}
    assert set(rows) == {placed["id"], pending["id"]}
    assert name in rows[placed["id"]] and node_id not in table.stdout and "{}" not in table.stdout
    assert (
        "no node fits (1 node" in rows[pending["id"]] and "1 × fits: 0 of 2 gpu free" in rows[pending["id"]]
    )

    only_pending = cli(server, "get", "reservations", "--tenant", tenant, "--status", "pending", "-o", "json")
    assert [r["id"] for r in json.loads(only_pending.stdout)["items"]] == [pending["id"]]
    listed = yaml.safe_load(cli(server, "get", "reservations", "--tenant", tenant, "-o", "yaml").stdout)
    assert listed["items"] == api_get(server, "/v1/reservations", tenantId=tenant)["items"]
    wide = cli(server, "get", "reservations", placed["id"], "-o", "wide").stdout
    assert pool.id in wide and placed["idempotencyKey"] in wide

    described = cli(server, "describe", "reservation", placed["id"])
    assert described.exit_code == 0 and "{}" not in described.stdout
    assert f"{name}  {name}-GPU0, {name}-GPU1" in described.stdout
    assert "Request:" in described.stdout and "2 gpu, for 1h" in described.stdout
    waiting = cli(server, "describe", "reservation", pending["id"]).stdout
    assert "Unschedulable" in waiting and "NoFit" in waiting and "0 of 2 gpu free" in waiting
    # the pending reservation's rejection rows and nearest misses, as tables (docs/reasons.md)
    assert "Rejections:" in waiting and "Nearest misses:" in waiting
    rows = [line.split() for line in waiting.splitlines()]
    assert ["fits", "fits:", "0", "of", "2", "gpu", "free", "1", name] in rows
    assert [name, "fits", "0", "of", "2", "gpu", "free", "2"] in rows
    assert json.loads(cli(server, "describe", "reservation", placed["id"], "-o", "json").stdout) == api_get(
        server, f"/v1/reservations/{placed['id']}"
    )

    taint = {"key": "dedicated", "value": tenant, "effect": "NoSchedule"}
    httpx.put(
        f"{server.url}/v1/nodes/{node_id}/taints", json={"taints": [taint]}, headers=ADMIN
    ).raise_for_status()
    node = cli(server, "describe", "node", node_id)
    assert node.exit_code == 0 and f"Taints:    dedicated={tenant}:NoSchedule" in node.stdout
    assert f"Name:      {name}" in node.stdout and f"{pool.name} ({pool.id})" in node.stdout
    assert f"{name}-GPU1" in node.stdout and "NV12 × 1" in node.stdout and "cpu" in node.stdout

    released = cli(server, "release", placed["id"], "-o", "yaml")
    assert released.exit_code == 0 and yaml.safe_load(released.stdout)["status"] == "released"


def test_a_key_that_cannot_read_nodes_still_lists_its_reservations_by_node_name(server: Server) -> None:
    """Its node reads are 403; the names come from its tenant's usage by node (docs/cli.md, "Output")."""
    pool = make_pool(server, {"k1": 1})
    (name, node_id), tenant = next(iter(pool.nodes.items())), f"t-{secrets.token_hex(3)}"
    placed = api_reserve(server, tenant, pool, 1)
    minted = httpx.post(
        f"{server.url}/v1/api-keys",
        json={
            "principal": "reader",
            "tenantId": tenant,
            "grants": [{"action": "compute:reservations:read", "resource": f"tenant:{tenant}"}],
        },
        headers=ADMIN,
    )
    assert minted.status_code == 201, minted.text
    listed = cli(server, "get", "reservations", key=minted.json()["key"])
    assert listed.exit_code == 0, listed.output
    assert placed["id"] in listed.stdout and name in listed.stdout and node_id not in listed.stdout


def test_api_errors_print_code_and_message_naming_the_flag(server: Server) -> None:
    pool = make_pool(server, {"e1": 1})
    tenant = f"t-{secrets.token_hex(3)}"
    common = ["--tenant", tenant, "--pool", pool.id]

    too_many = cli(server, "reserve", *common, "--gpus", "5000")
    assert too_many.exit_code == 1
    assert too_many.stderr.startswith("INVALID_INPUT: --gpus: ") and "devices" not in too_many.stderr
    selector = cli(server, "preview", *common, "--gpus", "1", "--selector", "vramGiB >> 3")
    assert selector.exit_code == 1 and selector.stderr.startswith("INVALID_INPUT: --selector: ")
    bad_tenant = cli(server, "reserve", "--tenant", "no/slash", "--pool", pool.id, "--gpus", "1")
    assert bad_tenant.exit_code == 1 and bad_tenant.stderr.startswith("INVALID_INPUT: --tenant: ")
    assert api_get(server, "/v1/reservations", tenantId=tenant)["items"] == []  # nothing was written

    for args in (
        ("get", "reservations", "res_nope"),
        ("describe", "reservation", "res_nope"),
        ("describe", "node", "node_nope"),
        ("get", "nodes", "--pool", "pool_nope"),
        ("release", "res_nope"),
    ):
        missing = cli(server, *args)
        assert missing.exit_code == 1 and missing.stderr.startswith("NOT_FOUND: "), (args, missing.stderr)
        assert len(missing.stderr.splitlines()) == 1
    wrong_key = cli(server, "get", "pools", key="not-a-key")
    assert wrong_key.exit_code == 1 and wrong_key.stderr.startswith("UNAUTHENTICATED: ")


def test_usage_errors_exit_2_and_send_nothing(server: Server) -> None:
    pool = make_pool(server, {"u1": 1})
    tenant = f"t-{secrets.token_hex(3)}"
    common = ["reserve", "--tenant", tenant, "--pool", pool.id]
    cases = {
        "--gpus": [*common, "--gpus", "-1"],
        "--cpu": [*common, "--cpu", "0"],
        "--for": [*common, "--gpus", "1", "--for", "3x"],
        "nothing to reserve": common,
        "--output": [*common, "--gpus", "1", "-o", "xml"],
        "--status": ["get", "reservations", "--status", "nope"],
        "--limit": ["get", "nodes", "--limit", "0"],
        "--server": ["get", "pools", "--server", "localhost:8000"],
        "--pool": ["get", "nodes", "node_x", "--pool", pool.id],
    }
    for names, args in cases.items():
        result = cli(server, *args)
        assert result.exit_code == 2, (args, result.stdout, result.stderr)
        assert names in result.stderr, (args, result.stderr)
    no_key = cli(server, "get", "pools", key=None)
    assert no_key.exit_code == 2 and "API key" in no_key.stderr
    assert api_get(server, "/v1/reservations", tenantId=tenant)["items"] == []


def test_an_unreachable_service_is_one_line_naming_the_url_for_every_client_command() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    request = ["--tenant", "t", "--pool", "pool_x", "--gpus", "1"]
    commands = [
        ["reserve", *request],
        ["preview", *request, "-o", "json"],
        ["release", "res_x"],
        ["get", "reservations"],
        ["get", "pools", "-o", "yaml"],
        ["get", "nodes", "--pool", "pool_x"],
        ["describe", "reservation", "res_x"],
        ["describe", "node", "node_x"],
    ]
    started = [(args, cli_process(url, *args)) for args in commands]  # in parallel: each is a process
    for args, process in started:
        code, out, err = finished(process)
        assert (code, out, err) == (1, "", f"cannot reach {url}: connection refused\n"), args


def _commands(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every command path under ``command`` (typer's click group), the group itself first."""
    yield path
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, (*path, name))


def test_help_shows_flags_without_a_bool_metavar() -> None:
    root = typer.main.get_command(app)
    paths = list(_commands(root))
    assert ("get", "reservations") in paths and ("describe", "node") in paths
    for path in paths:
        result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
        assert result.exit_code == 0, (path, result.stdout)
        assert "<bool>" not in result.stdout and "BOOLEAN" not in result.stdout, path
    assert "--nvlink " in CliRunner().invoke(app, ["reserve", "--help"], env={"COLUMNS": "200"}).stdout
    assert "--demo " in CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "200"}).stdout


def test_lists_are_read_page_by_page(server: Server) -> None:
    pool = make_pool(server, {"p1": 1, "p2": 1, "p3": 1})
    with ServiceClient(server.url, ADMIN_KEY, page_size=1) as client:
        assert [n["id"] for n in client.nodes(pool.id)] == sorted(pool.nodes.values())
        assert len(client.nodes(pool.id, limit=2)) == 2


@pytest.mark.parametrize(
    ("path", "message", "expected"),
    [
        ("devices.0.count", "devices.0.count: Input should be ≥ 1", "--gpus: Input should be ≥ 1"),
        ("devices.0.selector.matchExpressions.0.op", "bad op", "--selector: bad op"),
        ("devices.0.selector", "selector: > needs a number", "--selector: > needs a number"),
        ("duration", "duration: Value error, duration must be positive", "--for: duration must be positive"),
        (
            "resources.cpu",
            "resources.cpu: Input should be greater than 0",
            "--cpu: Input should be greater than 0",
        ),
        ("tenantId", "tenantId: String should match pattern", "--tenant: String should match pattern"),
        ("start", "start: needs a timezone", "--start: needs a timezone"),
        ("deadline", "deadline: needs a timezone", "deadline: needs a timezone"),  # no flag: unchanged
        ("", "a JSON body is required", "a JSON body is required"),
    ],
)
def test_api_field_paths_become_flags(path: str, message: str, expected: str) -> None:
    assert with_flag(message, path, REQUEST_FLAGS) == expected


def test_request_flags_make_the_api_body() -> None:
    flags = RequestFlags("acme", "pool_x", 2, "90m", "vramGiB >= 80", True, 8.0, 0.5, "k-1", "gpu")
    assert flags.request_body() == {
        "tenantId": "acme",
        "poolId": "pool_x",
        "devices": [{"class": "gpu", "count": 2, "selector": "vramGiB >= 80", "topology": "nvlink-all"}],
        "resources": {"cpu": 8, "memory": 0.5},
        "duration": "90m",
        "idempotencyKey": "k-1",
    }
    earliest = RequestFlags("acme", "pool_x", 1, "1h", None, False, None, None, "k", "gpu", earliest=True)
    assert earliest.request_body()["start"] == "earliest"
    cpu_only = RequestFlags("acme", "pool_x", 0, "1d", None, False, 4.0, None, None, "gpu").request_body()
    assert cpu_only["devices"] == [] and cpu_only["idempotencyKey"].startswith("cli-")
    with pytest.raises(UsageError, match="--selector and --nvlink need --gpus"):
        RequestFlags("acme", "pool_x", 0, "1d", "a = b", False, 4.0, None, None, "gpu").request_body()


def test_audit_lists_the_log_filtered_by_resource_and_actor(server: Server) -> None:
    pool = make_pool(server, {"a": 2})
    node = next(iter(pool.nodes.values()))
    assert httpx.post(f"{server.url}/v1/nodes/{node}/cordon", headers=ADMIN).status_code == 200
    result = cli(server, "audit", "--since", "1h", "--resource", node, "-o", "json")
    assert result.exit_code == 0, result.output
    events = json.loads(result.output)["items"]
    assert [(e["operationId"], e["status"], e["actor"]["keyId"]) for e in events] == [
        ("cordonNode", 200, "bootstrap"),
        ("createNode", 201, "bootstrap"),
    ]
    table = cli(server, "audit", "--resource", pool.id, "--actor", "bootstrap")
    assert table.exit_code == 0, table.output
    lines = table.output.splitlines()
    assert lines[0].split() == ["AT", "ACTOR", "OPERATION", "RESOURCES", "STATUS"]
    assert [line.split()[2] for line in lines[1:]] == ["createNode", "createPool"]
    refused = cli(server, "audit", key="not-a-key")
    assert refused.exit_code == 1 and refused.output.startswith("UNAUTHENTICATED:"), refused.output

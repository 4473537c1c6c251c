"""Hello is bounded like the operator routes, on create and on update (docs/api.md, "Limits"): at most
256 labels on a node (system and operator labels together), and no more devices or links than
``POST /v1/pools/{id}/nodes`` takes. Over a bound is 422 at its field, never 500, and changes nothing;
no node ever holds more than 256 labels."""

from __future__ import annotations

import httpx
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.tables import node_labels, nodes
from app.inventory.schemas import MAX_LABELS, MAX_LINKS
from tests.api.test_agents import hello_body
from tests.factories import make_pool


def _labels(n: int, prefix: str = "free") -> dict[str, str]:
    return {f"{prefix}.{i}": "x" for i in range(n)}


async def _most_labels_on_a_node(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        counts = (
            await conn.execute(
                sa.select(sa.func.count()).select_from(node_labels).group_by(node_labels.c.node_id)
            )
        ).scalars()
        return max(counts, default=0)


async def test_hello_with_257_labels_is_422_on_create_and_on_update(
    admin_client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    pool = await make_pool(admin_client)
    create = await admin_client.post("/v1/nodes/hello", json=hello_body(pool, labels=_labels(257)))
    assert create.status_code == 422, create.text
    assert create.json()["error"]["details"]["path"] == "labels"
    async with engine.connect() as conn:
        assert (await conn.execute(sa.select(sa.func.count()).select_from(nodes))).scalar_one() == 0
    first = await admin_client.post("/v1/nodes/hello", json=hello_body(pool, labels={"rack": "r1"}))
    assert first.status_code == 200, first.text
    before = (await admin_client.get(f"/v1/nodes/{first.json()['nodeId']}")).json()["labels"]
    update = await admin_client.post("/v1/nodes/hello", json=hello_body(pool, labels=_labels(257)))
    assert update.status_code == 422, update.text
    assert update.json()["error"]["details"]["path"] == "labels"
    assert (await admin_client.get(f"/v1/nodes/{first.json()['nodeId']}")).json()["labels"] == before


async def test_hello_update_never_takes_a_node_past_the_label_limit(
    admin_client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    """Operator labels stay through a Hello, so a Hello's free labels that fit alone (200 of 256) can
    overflow a node whose operator set 256 minus its system labels: refused, nothing changed."""
    pool = await make_pool(admin_client)
    node = (await admin_client.post("/v1/nodes/hello", json=hello_body(pool))).json()
    system = len(node["labels"])
    operator = _labels(MAX_LABELS - system, "op")
    put = await admin_client.put(f"/v1/nodes/{node['nodeId']}/labels", json={"labels": operator})
    assert put.status_code == 200, put.text
    full = (await admin_client.get(f"/v1/nodes/{node['nodeId']}")).json()["labels"]
    assert len(full) == MAX_LABELS
    r = await admin_client.post("/v1/nodes/hello", json=hello_body(pool, labels=_labels(200)))
    assert r.status_code == 422, r.text[:500]
    error = r.json()["error"]
    assert error["details"]["path"] == "labels"
    assert f"at most {MAX_LABELS} labels" in error["message"]
    assert (await admin_client.get(f"/v1/nodes/{node['nodeId']}")).json()["labels"] == full
    # a Hello that only rewrites labels the node has already stays within the limit and is accepted
    same = await admin_client.post("/v1/nodes/hello", json=hello_body(pool, labels={"op.0": "y"}))
    assert same.status_code == 200, same.text
    assert len(same.json()["labels"]) == MAX_LABELS
    assert await _most_labels_on_a_node(engine) <= MAX_LABELS


def _topo(gpus: int) -> str:
    """``nvidia-smi topo -m`` text of ``gpus`` GPUs, every pair joined by NV1."""
    header = "\t" + "\t".join(f"GPU{i}" for i in range(gpus)) + "\tCPU Affinity\tNUMA Affinity"
    rows = [
        f"GPU{i}\t" + "\t".join(" X " if i == j else "NV1" for j in range(gpus)) + "\t0-15\t0"
        for i in range(gpus)
    ]
    return "\n".join([header, *rows]) + "\n"


async def test_hello_with_more_links_than_a_node_holds_is_422(
    admin_client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    pool = await make_pool(admin_client)
    gpus = 363  # 363 x 362 / 2 = 65,703 links, over MAX_LINKS, in under 1,000,000 characters of topo
    assert gpus * (gpus - 1) // 2 > MAX_LINKS
    body = hello_body(pool, topo=_topo(gpus), nvidiaSmiXml=None)
    r = await admin_client.post("/v1/nodes/hello", json=body)
    assert r.status_code == 422, r.text[:500]
    assert r.json()["error"]["details"]["path"] == "topo"
    async with engine.connect() as conn:
        assert (await conn.execute(sa.select(sa.func.count()).select_from(nodes))).scalar_one() == 0

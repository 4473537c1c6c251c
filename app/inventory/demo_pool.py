"""``better-compute serve --demo``: load the demo pool from the shipped nvidia-smi outputs.

Idempotent: a pool named ``demo`` that exists already is kept as it is. Tenant ``demo`` gets a quota of
every GPU in the pool and its cpu/memory; an admin key is created and returned unless
``BC_BOOTSTRAP_ADMIN_KEY`` is set.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import sqlalchemy as sa

from app.db.engine import create_engine
from app.db.tables import pools
from app.iam.authorize import Grant
from app.iam.service import create_api_key
from app.inventory import service as inventory
from app.inventory.demo import load_demo_manifest
from app.inventory.schemas import NodeImport, ResourceBody
from app.quota import service as quota

DEMO_POOL = "demo"
DEMO_TENANT = "demo"


async def install_demo(database_url: str, bootstrap_key: str | None) -> dict[str, Any]:
    """Create (once) the demo pool and tenant quota; returns ``{poolId, nodes, gpus, quota, adminKey?}``."""
    engine = create_engine(database_url, pool_size=1)
    try:
        async with engine.begin() as conn:
            pool_id = (await conn.execute(sa.select(pools.c.id).where(pools.c.name == DEMO_POOL))).scalar()
            if pool_id is None:
                pool_id = (await inventory.create_pool(conn, DEMO_POOL))["id"]
                totals: dict[str, Decimal] = {}
                for node in load_demo_manifest():
                    body = NodeImport(
                        name=node.name,
                        topo=node.topo_text,
                        nvidiaSmiXml=node.xml_text,
                        labels=node.labels,
                        resources={
                            k: ResourceBody(allocatable=v["allocatable"], ratio=v.get("ratio", Decimal(1)))
                            for k, v in node.resources.items()
                        },
                    )
                    view = await inventory.import_node(conn, pool_id, body)
                    totals["gpu"] = totals.get("gpu", Decimal(0)) + len(view["devices"])
                    for k, v in node.resources.items():
                        totals[k] = totals.get(k, Decimal(0)) + inventory.scalar_capacity(
                            v["allocatable"], v.get("ratio", Decimal(1))
                        )
                await quota.set_limits(conn, DEMO_TENANT, pool_id, totals)
            summary = await inventory.get_pool(conn, pool_id)
            limits = await quota.get_quota(conn, DEMO_TENANT, pool_id)
            key = None
            if not bootstrap_key:
                _, key = await create_api_key(conn, "demo-admin", None, [Grant("*", "*")])
        return {
            "poolId": pool_id,
            "nodes": summary["nodeCount"],
            "gpus": summary["capacity"].get("gpu", {}).get("total", 0),
            "quota": {r: str(v["limit"]) for r, v in limits.items() if v["limit"] is not None},
            "adminKey": key,
        }
    finally:
        await engine.dispose()

"""``better-compute serve --demo``: load the demo pool from the shipped nvidia-smi outputs.

The demo's nodes enter the way a real fleet's do: through Hello (:func:`app.inventory.hello.hello`, in
process), so they carry real system labels (``bc.dev/driver.nvidia`` where the XML names the driver,
``bc.dev/driver-kind.nvidia.gpu``, ``bc.dev/cap.devices.limits``, ``bc.dev/cap.binding.kubernetes``) and a
heartbeat; :func:`run_demo_heartbeats` keeps heartbeating them from the service process while it serves.
Idempotent: a second start sends the same Hellos, which change nothing. Tenant ``demo`` gets a quota of
every GPU in the pool and its cpu/memory (set once, when the pool is created); an admin key is created and
returned unless ``BC_BOOTSTRAP_ADMIN_KEY`` is set.
"""

from __future__ import annotations

import asyncio
import logging
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.engine import create_engine
from app.db.tables import nodes, pools
from app.iam.authorize import Grant
from app.iam.service import create_api_key
from app.inventory import service as inventory
from app.inventory.demo import load_demo_manifest
from app.inventory.hello import heartbeat, hello
from app.inventory.nvsmi_xml import parse_nvidia_smi_log
from app.inventory.schemas import DriverBody, HeartbeatBody, HelloBody, ResourceBody
from app.placement.scalar_capacity import scalar_capacity
from app.placement.system_labels import CAP_BINDING_KUBERNETES, CAP_DEVICES_LIMITS
from app.quota.limits import set_limits
from app.quota.view import get_quota

DEMO_POOL = "demo"
DEMO_TENANT = "demo"
DEMO_INTERVAL_SECONDS = 10
DEMO_CAPABILITIES = (CAP_DEVICES_LIMITS, CAP_BINDING_KUBERNETES)

log = logging.getLogger("better_compute.demo")


def _drivers(xml_text: str | None) -> list[DriverBody]:
    """The NVIDIA driver an agent would advertise: its version from the XML; nothing without XML."""
    version = parse_nvidia_smi_log(xml_text).driver_version if xml_text is not None else None
    return [DriverBody(id="nvidia", version=version, kinds=["gpu"])] if version else []


async def install_demo(database_url: str, bootstrap_key: str | None) -> dict[str, Any]:
    """Create (once) the demo pool and tenant quota and say Hello for each node; returns ``{poolId, nodes,
    gpus, quota, adminKey?}``."""
    engine = create_engine(database_url, pool_size=1)
    try:
        async with engine.begin() as conn:
            pool_id = (await conn.execute(sa.select(pools.c.id).where(pools.c.name == DEMO_POOL))).scalar()
            created = pool_id is None
            if created:
                pool_id = (await inventory.create_pool(conn, DEMO_POOL)).id
        totals: dict[str, Decimal] = {}
        for node in load_demo_manifest():
            body = HelloBody(
                poolId=pool_id,
                name=node.name,
                topo=node.topo_text,
                nvidiaSmiXml=node.xml_text,
                drivers=_drivers(node.xml_text),
                capabilities=list(DEMO_CAPABILITIES),
                labels=node.labels,
                resources={
                    k: ResourceBody(allocatable=v["allocatable"], ratio=v.get("ratio", Decimal(1)))
                    for k, v in node.resources.items()
                },
                intervalSeconds=DEMO_INTERVAL_SECONDS,
            )
            view = (await hello(engine, body)).view
            await heartbeat(engine, view.id, HeartbeatBody(devices=[]), lambda _pool: None)
            totals["gpu"] = totals.get("gpu", Decimal(0)) + len(view.devices)
            for k, v in node.resources.items():
                totals[k] = totals.get(k, Decimal(0)) + scalar_capacity(
                    v["allocatable"], v.get("ratio", Decimal(1))
                )
        async with engine.begin() as conn:
            if created:
                await set_limits(conn, DEMO_TENANT, pool_id, totals)
            summary = await inventory.get_pool(conn, pool_id)
            limits = await get_quota(conn, DEMO_TENANT, pool_id)
            key = None
            if not bootstrap_key:
                key = (await create_api_key(conn, "demo-admin", None, [Grant("*", "*")])).key
        return {
            "poolId": pool_id,
            "nodes": summary.nodeCount,
            "gpus": summary.capacity["gpu"].total if "gpu" in summary.capacity else 0,
            "quota": {r: str(v["limit"]) for r, v in limits.items() if v["limit"] is not None},
            "adminKey": key,
        }
    finally:
        await engine.dispose()


async def demo_heartbeat_once(engine: AsyncEngine) -> int:
    """One heartbeat (liveness only, no device report) for every agent node of the demo pool; returns how
    many were sent."""
    async with engine.connect() as conn:
        ids = (
            (
                await conn.execute(
                    sa.select(nodes.c.id)
                    .join(pools, pools.c.id == nodes.c.pool_id)
                    .where(pools.c.name == DEMO_POOL, nodes.c.agent_interval_seconds.is_not(None))
                    .order_by(nodes.c.id)
                )
            )
            .scalars()
            .all()
        )
    for node_id in ids:
        await heartbeat(engine, node_id, HeartbeatBody(devices=[]), lambda _pool: None)
    return len(ids)


async def run_demo_heartbeats(engine: AsyncEngine, interval: float = DEMO_INTERVAL_SECONDS) -> None:
    """Heartbeat the demo pool's nodes every ``interval`` seconds until cancelled (``serve --demo``)."""
    while True:
        try:
            await demo_heartbeat_once(engine)
        except asyncio.CancelledError:
            raise
        except Exception:  # the database may be restarting: try again next interval
            log.exception("demo heartbeats failed")
        await asyncio.sleep(interval)

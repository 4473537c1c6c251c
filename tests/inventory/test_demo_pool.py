"""``serve --demo``'s pool enters through Hello (in process) on real PostgreSQL."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.tables import node_labels, nodes, pools
from app.inventory.demo_pool import demo_heartbeat_once, install_demo


async def test_demo_pool_nodes_carry_system_labels_and_heartbeats(
    database_url: str, clean_db: AsyncEngine
) -> None:
    summary = await install_demo(database_url, "bootstrap")
    assert summary["nodes"] == 8 and summary["gpus"] == 52 and summary["adminKey"] is None
    async with clean_db.connect() as conn:
        agents = (
            await conn.execute(
                sa.select(nodes.c.name, nodes.c.agent_interval_seconds, nodes.c.last_heartbeat_at)
            )
        ).all()
        labels = (await conn.execute(sa.select(node_labels).where(node_labels.c.key.like("bc.dev/%")))).all()
        version = (await conn.execute(sa.select(pools.c.inventory_version))).scalar_one()
    assert len(agents) == 8 and all(a.agent_interval_seconds == 10 and a.last_heartbeat_at for a in agents)
    assert {r.source for r in labels} == {"system"}
    keys = {(r.key, r.value) for r in labels}
    assert ("bc.dev/driver.nvidia", "580.159.04") in keys  # the H200 host's XML names its driver
    assert ("bc.dev/cap.binding.kubernetes", "1") in keys and ("bc.dev/cap.devices.limits", "1") in keys

    again = await install_demo(database_url, "bootstrap")  # the same Hellos again change nothing
    assert again["poolId"] == summary["poolId"] and again["quota"] == summary["quota"]
    async with clean_db.connect() as conn:
        assert (await conn.execute(sa.select(pools.c.inventory_version))).scalar_one() == version
    assert await demo_heartbeat_once(clean_db) == 8

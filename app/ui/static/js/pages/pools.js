// Pools: each pool with its node count, GPUs free / booked / unhealthy now, and pending count.
import { all, get, q } from "../api.js";
import { h, link, table } from "../dom.js";
import { tally } from "../grid.js";

async function summary(pool) {
  const from = new Date();
  const to = new Date(from.getTime() + 60_000);
  const [occupancy, pending] = await Promise.all([
    get(`/v1/pools/${encodeURIComponent(pool.id)}/occupancy${q({ from: from.toISOString(), to: to.toISOString() })}`),
    all(`/v1/reservations${q({ poolId: pool.id, status: "pending" })}`),
  ]);
  const c = tally(occupancy, Date.parse(occupancy.now));
  return { free: c.free, booked: c.booked + c.spot, unhealthy: c.unhealthy, pending: pending.filter((r) => r.poolId === pool.id).length };
}

export async function poolsPage() {
  const pools = (await all("/v1/pools")).filter((p) => !p.archivedAt);
  const rows = await Promise.all(pools.map(async (pool) => {
    const n = await summary(pool);
    return [link(`#/pools/${encodeURIComponent(pool.id)}`, pool.name), String(pool.nodeCount),
      String(n.free), String(n.booked), String(n.unhealthy), String(n.pending)];
  }));
  return h("section", { "aria-labelledby": "pools-title" },
    h("h1", { id: "pools-title" }, "Pools"),
    pools.length
      ? table(["Pool", "Nodes", "GPUs free", "GPUs booked", "GPUs unhealthy", "Pending"], rows, { "data-testid": "pools" })
      : h("p", {}, "No pool this key can read."));
}

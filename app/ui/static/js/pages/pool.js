// Pool: the occupancy grid now, the 48 h timeline, the pending queue and "Would it fit?".
import { all, get, q } from "../api.js";
import { h, link, table, when } from "../dom.js";
import { grid, legend } from "../grid.js";
import { bookingsTimeline } from "../timeline.js";
import { previewForm } from "../preview.js";

export function unschedulableMessage(reservation) {
  const c = reservation.conditions.find((x) => x.type === "Unschedulable" && x.status === "True");
  return c ? c.message : "—";
}

export async function loadOccupancy(poolId) {
  return get(`/v1/pools/${encodeURIComponent(poolId)}/occupancy`);
}

export async function poolPage(poolId) {
  const [occupancy, pending] = await Promise.all([
    loadOccupancy(poolId),
    all(`/v1/reservations${q({ poolId, status: "pending" })}`),
  ]);
  const gridHolder = h("div", { id: "grid-holder" });
  const timelineHolder = h("div", {});
  const show = (occ) => {
    gridHolder.replaceChildren(grid(occ.nodes, Date.parse(occ.now)));
    timelineHolder.replaceChildren(bookingsTimeline(occ));
  };
  show(occupancy);
  const refresh = async () => show(await loadOccupancy(poolId));
  const queue = pending.filter((r) => r.poolId === poolId).map((r) => [
    link(`#/reservations/${encodeURIComponent(r.id)}`, r.id), r.tenantId, when(r.createdAt),
    r.spec.devices.map((d) => `${d.count} ${d.class}`).join(", ") || "—", unschedulableMessage(r)]);
  return h("section", { "aria-labelledby": "pool-title" },
    h("h1", { id: "pool-title" }, `Pool ${occupancy.poolName}`),
    h("p", { class: "muted" }, `Now ${when(occupancy.now)} · ${occupancy.nodes.length} nodes`),
    h("h2", {}, "GPUs now"), legend(), gridHolder,
    h("h2", {}, "Next 48 hours"), h("div", { class: "scroll" }, timelineHolder),
    h("h2", { id: "pending-title" }, `Pending (${queue.length})`),
    queue.length ? table(["Reservation", "Tenant", "Since", "Asks", "Why it waits"], queue, { "data-testid": "pending", "aria-labelledby": "pending-title" }) : h("p", {}, "Nothing waits."),
    previewForm(poolId, gridHolder, refresh));
}

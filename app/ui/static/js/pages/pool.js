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
  const [occupancy, pending] = await Promise.all([loadOccupancy(poolId), loadPending(poolId)]);
  const gridHolder = h("div", { id: "grid-holder" });
  const timelineHolder = h("div", {});
  const nowLine = h("p", { class: "muted" });
  const pendingHolder = h("div", {});
  const show = (occ, waiting) => {
    nowLine.textContent = `Now ${when(occ.now)} · ${occ.nodes.length} nodes`;
    gridHolder.replaceChildren(grid(occ.nodes, Date.parse(occ.now)));
    timelineHolder.replaceChildren(bookingsTimeline(occ));
    pendingHolder.replaceChildren(...pendingQueue(poolId, waiting));
  };
  show(occupancy, pending);
  // after a reserve: the grid, the timeline, the clock and the queue, all read again
  const refresh = async () => {
    const [occ, waiting] = await Promise.all([loadOccupancy(poolId), loadPending(poolId)]);
    show(occ, waiting);
  };
  return h("section", { "aria-labelledby": "pool-title" },
    h("h1", { id: "pool-title" }, `Pool ${occupancy.poolName}`),
    nowLine,
    h("h2", {}, "GPUs now"), legend(), gridHolder,
    h("h2", {}, "Next 48 hours"), h("div", { class: "scroll" }, timelineHolder),
    pendingHolder,
    previewForm(poolId, gridHolder, refresh));
}

function loadPending(poolId) {
  return all(`/v1/reservations${q({ poolId, status: "pending" })}`);
}

function asks(r) {
  return r.spec.devices.map((d) => `${d.count} ${d.class}${d.topology ? ` (${d.topology})` : ""}`).join(", ") || "—";
}

function pendingQueue(poolId, pending) {
  const queue = pending.filter((r) => r.poolId === poolId).map((r) => [
    link(`#/reservations/${encodeURIComponent(r.id)}`, r.id), r.tenantId, when(r.createdAt),
    asks(r), r.plannedStart ? when(r.plannedStart) : "—", unschedulableMessage(r)]);
  return [
    h("h2", { id: "pending-title" }, `Pending (${queue.length})`),
    queue.length
      ? table(["Reservation", "Tenant", "Since", "Asks", "Planned start", "Why it waits"], queue, { "data-testid": "pending", "aria-labelledby": "pending-title" })
      : h("p", {}, "Nothing waits."),
  ];
}

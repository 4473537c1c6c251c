// Reservation: its allocations on the grid, its conditions as a timeline, and Release.
import { get, post } from "../api.js";
import { errorBox, h, link, table, when } from "../dom.js";
import { grid, legend } from "../grid.js";
import { pointsTimeline } from "../timeline.js";

export async function reservationPage(reservationId) {
  const path = `/v1/reservations/${encodeURIComponent(reservationId)}`;
  const r = await get(path);
  const occupancy = await get(`/v1/pools/${encodeURIComponent(r.poolId)}/occupancy`);
  const held = new Map();
  for (const a of r.allocations) {
    if (!held.has(a.nodeId)) held.set(a.nodeId, new Set());
    for (const atom of a.atoms) held.get(a.nodeId).add(atom);
  }
  const nodes = occupancy.nodes.filter((n) => held.has(n.nodeId));
  const allocations = r.allocations.map((a) => {
    const node = occupancy.nodes.find((n) => n.nodeId === a.nodeId);
    return [link(`#/nodes/${encodeURIComponent(a.nodeId)}`, node ? node.nodeName : a.nodeId), a.atoms.join(", ") || "—",
      Object.entries(a.resources).map(([k, v]) => `${k} ${v}`).join(", ") || "—", when(a.start), when(a.end), when(a.releasedAt)];
  });
  const conditions = r.conditions.map((c) => [c.type, c.status, c.reason, c.message, when(c.at)]);
  const status = h("p", { "data-testid": "status" }, `Status: ${r.status} · tenant ${r.tenantId} · pool `,
    link(`#/pools/${encodeURIComponent(r.poolId)}`, occupancy.poolName));
  const out = h("div", { role: "status", "aria-live": "polite" });
  const release = h("button", { type: "button", id: "release", disabled: ["released", "ended", "preempted"].includes(r.status) }, "Release");
  release.addEventListener("click", async () => {
    release.disabled = true;
    try {
      const after = await post(`${path}/release`);
      out.replaceChildren(h("p", { class: "ok" }, `Released: ${after.status} at ${when(after.releasedAt)}`));
      window.dispatchEvent(new HashChangeEvent("hashchange"));
    } catch (err) {
      release.disabled = false;
      out.replaceChildren(errorBox(err));
    }
  });
  return h("section", { "aria-labelledby": "res-title" },
    h("h1", { id: "res-title" }, `Reservation ${r.id}`), status,
    h("div", { class: "actions" }, release), out,
    h("h2", {}, "Allocations"),
    allocations.length ? table(["Node", "GPUs", "Resources", "Start", "End", "Released"], allocations) : h("p", {}, "None (not placed)."),
    nodes.length ? [legend(), grid(nodes, Date.parse(occupancy.now), held)] : null,
    h("h2", {}, "Conditions"),
    r.conditions.length ? [h("div", { class: "scroll" }, pointsTimeline(r.conditions, occupancy.now)),
      table(["Type", "Status", "Reason", "Message", "At"], conditions)] : h("p", {}, "None."));
}

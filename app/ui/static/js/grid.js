// The occupancy grid (one row per node, one cell per GPU) and the state of a GPU at an instant.
import { h, link } from "./dom.js";

export const STATES = {
  free: { label: "free", mark: "·" },
  booked: { label: "booked", mark: "B" },
  spot: { label: "spot", mark: "S" },
  planned: { label: "planned", mark: "P" },
  unhealthy: { label: "unhealthy", mark: "!" },
  unschedulable: { label: "unschedulable", mark: "×" },
};

const covers = (b, t) => Date.parse(b.start) <= t && t < Date.parse(b.end);

// The booking holding an atom at instant t (ms), preferring a placed one over a planned one.
export function bookingAt(atom, t) {
  const now = atom.bookings.filter((b) => covers(b, t));
  return now.find((b) => !b.planned) || now[0] || null;
}

export function atomState(node, atom, t) {
  if (!atom.healthy) return "unhealthy";
  const b = bookingAt(atom, t);
  if (b && !b.planned) return b.spot ? "spot" : "booked";
  if (!node.schedulable || !atom.bookable) return "unschedulable";
  if (b) return "planned";
  return "free";
}

// Counts of GPU states at instant t over every node.
export function tally(occupancy, t) {
  const counts = { free: 0, booked: 0, spot: 0, planned: 0, unhealthy: 0, unschedulable: 0 };
  for (const node of occupancy.nodes) {
    for (const atom of node.atoms) if (atom.class === "gpu") counts[atomState(node, atom, t)] += 1;
  }
  return counts;
}

export function legend() {
  return h("ul", { class: "legend", "aria-label": "Cell states" },
    Object.entries(STATES).map(([state, { label, mark }]) =>
      h("li", {}, h("span", { class: "cell", "data-state": state, "aria-hidden": "true" }, mark), ` ${label}`)));
}

// The grid of `nodes` (occupancy nodes) at instant t. `highlight` maps nodeId -> Set of atom ids
// (preview candidates or a reservation's allocations).
export function grid(nodes, t, highlight = new Map()) {
  const rows = document.createDocumentFragment();
  for (const node of nodes) {
    const lit = highlight.get(node.nodeId);
    const cells = h("div", { class: "cells", role: "list", "aria-label": `GPUs of ${node.nodeName}` });
    for (const atom of node.atoms) {
      if (atom.class !== "gpu") continue;
      const state = atomState(node, atom, t);
      const b = bookingAt(atom, t);
      const who = b && b.reservationId ? ` by ${b.reservationId}` : "";
      const cell = h("span", {
        class: "cell",
        role: "listitem",
        "data-atom": atom.atomId,
        "data-state": state,
        "data-highlight": lit && lit.has(atom.atomId) ? "true" : null,
        title: `${atom.atomId}: ${STATES[state].label}${who}`,
      }, STATES[state].mark);
      cells.append(cell);
    }
    const reasons = node.schedulable ? "" : ` — ${node.reasons.join("; ")}`;
    rows.append(h("div", { class: "grid-row", "data-node": node.nodeId },
      h("div", { class: "node-name" }, link(`#/nodes/${node.nodeId}`, node.nodeName),
        node.schedulable ? null : h("span", { class: "muted" }, reasons)),
      cells));
  }
  return h("div", { class: "grid", "data-testid": "occupancy-grid" }, rows);
}

// Marks the highlighted atoms of an existing grid (after a preview), clearing earlier marks.
export function highlightAtoms(root, highlight) {
  for (const el of root.querySelectorAll("[data-highlight]")) el.removeAttribute("data-highlight");
  for (const [nodeId, atoms] of highlight) {
    const row = root.querySelector(`.grid-row[data-node="${CSS.escape(nodeId)}"]`);
    if (!row) continue;
    for (const atom of atoms) {
      const cell = row.querySelector(`[data-atom="${CSS.escape(atom)}"]`);
      if (cell) cell.setAttribute("data-highlight", "true");
    }
  }
}

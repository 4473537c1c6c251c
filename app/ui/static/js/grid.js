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
  let first = null;
  for (const b of atom.bookings) {
    if (!covers(b, t)) continue;
    if (!b.planned) return b;
    first = first || b;
  }
  return first;
}

// The state of an atom holding booking b (bookingAt) at that instant.
function stateWith(node, atom, b) {
  if (!atom.healthy) return "unhealthy";
  if (b && !b.planned) return b.spot ? "spot" : "booked";
  if (!node.schedulable || !atom.bookable) return "unschedulable";
  if (b) return "planned";
  return "free";
}

export function atomState(node, atom, t) {
  return stateWith(node, atom, bookingAt(atom, t));
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

// A GPU cell without its atom (cloned per cell: 8,000 in a 1,000-node pool).
const CELL = h("span", { class: "cell", role: "listitem" });

// The grid of `nodes` (occupancy nodes) at instant t. `highlight` maps nodeId -> Set of atom ids
// (preview candidates or a reservation's allocations).
export function grid(nodes, t, highlight = new Map()) {
  const rows = document.createDocumentFragment();
  for (const node of nodes) {
    const lit = highlight.get(node.nodeId);
    const cells = h("div", { class: "cells", role: "list", "aria-label": `GPUs of ${node.nodeName}` });
    for (const atom of node.atoms) {
      if (atom.class !== "gpu") continue;
      const b = bookingAt(atom, t);
      const state = stateWith(node, atom, b);
      const who = b && b.reservationId ? ` by ${b.reservationId}` : "";
      const cell = CELL.cloneNode(false);
      cell.setAttribute("data-atom", atom.atomId);
      cell.setAttribute("data-state", state);
      if (lit && lit.has(atom.atomId)) cell.setAttribute("data-highlight", "true");
      cell.setAttribute("title", `${atom.atomId}: ${STATES[state].label}${who}`);
      cell.textContent = STATES[state].mark;
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

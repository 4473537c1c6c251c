// SVG timelines: bookings as bars per node over a window, and points in time (conditions).
import { s } from "./dom.js";

const SVG_NS = "http://www.w3.org/2000/svg";

const ROW = 18;
const LABEL = 160;
const WIDTH = 960;

function axis(from, to, x, height) {
  const out = [];
  const span = to - from;
  const step = span > 3 * 86400e3 ? 86400e3 : span > 12 * 3600e3 ? 6 * 3600e3 : 3600e3;
  for (let t = Math.ceil(from / step) * step; t <= to; t += step) {
    const px = x(t);
    out.push(s("line", { x1: px, x2: px, y1: 14, y2: height, class: "tick" }));
    out.push(s("text", { x: px + 2, y: 11, class: "tick-label" }, new Date(t).toISOString().slice(5, 16).replace("T", " ")));
  }
  return out;
}

// One SVG element, its attributes set directly (the bookings timeline draws tens of thousands).
function svgEl(tag, attrs, text) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const k in attrs) el.setAttribute(k, attrs[k]);
  if (text !== undefined) el.textContent = text;
  return el;
}

// The label and bars of one node's row at y: each booking of each atom, merged per reservation.
function drawRow(into, node, y, x) {
  into.append(svgEl("text", { x: 2, y: y + 12, class: "row-label" }, node.nodeName));
  const seen = new Map();
  for (const atom of node.atoms) {
    for (const b of atom.bookings) {
      const key = `${b.reservationId || "other"}|${b.start}|${b.end}|${b.planned}|${b.spot}`;
      const entry = seen.get(key);
      if (entry) entry.atoms += 1;
      else seen.set(key, { ...b, atoms: 1 });
    }
  }
  let lane = 0;
  for (const b of seen.values()) {
    const x1 = x(Date.parse(b.start));
    const x2 = Math.max(x(Date.parse(b.end)), x1 + 2);
    const kind = b.planned ? "planned" : b.spot ? "spot" : "booked";
    const who = b.reservationId ? `${b.reservationId} ` : "";
    const bar = svgEl("rect", { x: x1, y: y + 2 + (lane % 3) * 4, width: x2 - x1, height: 8, class: `bar ${kind}` });
    bar.append(svgEl("title", {}, `${who}${kind} ${b.atoms} GPU ${b.start} – ${b.end}`));
    into.append(bar);
    lane += 1;
  }
}

// Rows drawn at once; a longer timeline is drawn by blocks of BLOCK rows: those near the viewport
// first (when they come into view), the rest while the browser is idle (bench/ui_pool_page.py).
const EAGER_ROWS = 200;
const BLOCK = 50;

// Bars per node: each booking of each atom, merged per reservation (planned windows dashed).
export function bookingsTimeline(occupancy) {
  const from = Date.parse(occupancy.from);
  const to = Date.parse(occupancy.to);
  const now = Date.parse(occupancy.now);
  const x = (t) => LABEL + ((Math.min(Math.max(t, from), to) - from) / (to - from)) * (WIDTH - LABEL - 4);
  const nodes = occupancy.nodes;
  const height = 20 + nodes.length * ROW;
  const parts = axis(from, to, x, height);
  const svg = s("svg", {
    class: "timeline", viewBox: `0 0 ${WIDTH} ${height}`, width: WIDTH, height,
    role: "img", "aria-label": `Bookings per node from ${occupancy.from} to ${occupancy.to}; planned windows dashed`,
  }, parts);
  const lazy = nodes.length > EAGER_ROWS && typeof IntersectionObserver === "function";
  const blocks = [];
  for (let first = 0; first < nodes.length; first += lazy ? BLOCK : nodes.length) {
    const last = Math.min(nodes.length, first + (lazy ? BLOCK : nodes.length));
    const g = svgEl("g", {});
    const block = { g, drawn: false, draw() {
      if (this.drawn) return;
      this.drawn = true;
      g.replaceChildren();
      for (let i = first; i < last; i += 1) drawRow(g, nodes[i], 20 + i * ROW, x);
    } };
    if (lazy) {  // an invisible box the height of the block, watched until the block is drawn
      g.append(svgEl("rect", { x: 0, y: 20 + first * ROW, width: WIDTH, height: (last - first) * ROW, fill: "none" }));
    } else block.draw();
    blocks.push(block);
    svg.append(g);
  }
  if (now >= from && now <= to) svg.append(s("line", { x1: x(now), x2: x(now), y1: 14, y2: height, class: "now" }));
  if (lazy) drawLater(blocks);
  return svg;
}

function drawLater(blocks) {
  const watcher = new IntersectionObserver((entries) => {
    for (const e of entries) {
      if (!e.isIntersecting) continue;
      const block = blocks.find((b) => b.g === e.target.parentNode);
      watcher.unobserve(e.target);
      if (block) block.draw();
    }
  }, { rootMargin: "800px 0px" });
  for (const b of blocks) watcher.observe(b.g.firstChild);
  const idle = window.requestIdleCallback || ((fn) => setTimeout(fn, 50));
  let next = 0;
  let shown = false;
  const step = () => {
    while (next < blocks.length && blocks[next].drawn) next += 1;
    const gone = shown && !blocks[0].g.isConnected;  // replaced (a refresh) or the page left
    shown = shown || blocks[0].g.isConnected;
    if (next >= blocks.length || gone) {
      watcher.disconnect();
      return;
    }
    blocks[next].draw();
    idle(step);
  };
  idle(step);
}

// Horizontal interval bars: rows of {label, low, high, mid, dashed, note} in seconds.
export function intervalBars(rows, title) {
  const max = Math.max(1, ...rows.map((r) => r.high || r.low || 0));
  const x = (v) => LABEL + (v / max) * (WIDTH - LABEL - 170);
  const height = 24 + rows.length * 22;
  const parts = [s("text", { x: LABEL, y: 12, class: "tick-label" }, "0 s"),
    s("text", { x: WIDTH - 120, y: 12, class: "tick-label" }, `${Math.round(max)} s`)];
  rows.forEach((r, i) => {
    const y = 20 + i * 22;
    parts.push(s("text", { x: 2, y: y + 13, class: "row-label" }, r.label));
    const x1 = x(r.low || 0);
    const x2 = Math.max(x(r.high || r.low || 0), x1 + 2);
    parts.push(s("rect", { x: x1, y: y + 3, width: x2 - x1, height: 12, class: `bar ${r.dashed ? "planned" : "booked"}` },
      s("title", {}, `${r.label}: ${r.low} – ${r.high} s${r.note ? ` (${r.note})` : ""}`)));
    if (r.mid !== null && r.mid !== undefined) {
      parts.push(s("line", { x1: x(r.mid), x2: x(r.mid), y1: y + 1, y2: y + 17, class: "mid" }));
    }
    parts.push(s("text", { x: x2 + 4, y: y + 13, class: "tick-label" }, r.note || ""));
  });
  return s("svg", { class: "timeline", viewBox: `0 0 ${WIDTH} ${height}`, width: WIDTH, height, role: "img", "aria-label": title }, parts);
}

// Points in time (a reservation's conditions) on one axis, from the first to now.
export function pointsTimeline(points, nowIso) {
  const times = points.map((p) => Date.parse(p.at)).filter((t) => !Number.isNaN(t));
  const now = Date.parse(nowIso);
  const from = Math.min(now, ...times) - 1000;
  const to = Math.max(now, ...times) + 1000;
  const x = (t) => LABEL + ((t - from) / (to - from)) * (WIDTH - LABEL - 4);
  const height = 24 + points.length * ROW;
  const parts = axis(from, to, x, height);
  points.forEach((p, i) => {
    const y = 20 + i * ROW;
    parts.push(s("text", { x: 2, y: y + 12, class: "row-label" }, p.type));
    const t = Date.parse(p.at);
    if (!Number.isNaN(t)) {
      parts.push(s("circle", { cx: x(t), cy: y + 8, r: 5, class: `point ${p.status === "True" ? "on" : "off"}` },
        s("title", {}, `${p.type} ${p.reason}: ${p.message} (${p.at})`)));
    }
  });
  return s("svg", { class: "timeline", viewBox: `0 0 ${WIDTH} ${height}`, width: WIDTH, height, role: "img", "aria-label": "Conditions over time" }, parts);
}

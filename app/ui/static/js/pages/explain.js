// Explain: a placement fleet and a request -> POST /v1/placement/explain; ranking bars and rejections.
import { post } from "../api.js";
import { errorBox, h, table, when } from "../dom.js";
import { intervalBars } from "../timeline.js";

async function readJson(input, name) {
  const file = input.files[0];
  if (!file) throw new Error(`choose a ${name} JSON file`);
  try {
    return JSON.parse(await file.text());
  } catch (err) {
    throw new Error(`${name}: not JSON (${err.message})`);
  }
}

function bar(c) {
  const k = c.completion;
  if (k.complete) return { label: c.target, low: k.low, high: k.high, mid: k.midpoint, note: `${k.low}–${k.high} s` };
  return { label: c.target, low: k.known_low, high: k.known_high, mid: null, dashed: true, note: `known part; unknown: ${(k.unknown || []).join(", ")}` };
}

function result(x) {
  const parts = [h("p", { "data-testid": "selected" }, x.held
    ? `Held: ${x.held_reason}`
    : `Selected: ${x.selected ? x.selected.target || JSON.stringify(x.selected) : "—"} (evaluated at ${when(x.now)})`)];
  parts.push(h("h2", {}, "Ranking by predicted completion"));
  if (x.candidates.length) {
    parts.push(h("div", { class: "scroll" }, intervalBars(x.candidates.map(bar), "Completion interval per target, seconds")));
    parts.push(table(["Rank", "Target", "Kind", "Completion (s)", "Midpoint (s)"], x.candidates.map((c) => [String(c.rank), c.target, c.kind,
      c.completion.complete ? `${c.completion.low} – ${c.completion.high}` : `≥ ${c.completion.known_low} (unknown: ${(c.completion.unknown || []).join(", ")})`,
      c.completion.midpoint ?? "—"]), { "data-testid": "ranking" }));
  } else {
    parts.push(h("p", {}, "No eligible target."));
  }
  parts.push(h("h2", {}, "Rejected"));
  parts.push(x.rejected.length
    ? table(["Target", "Kind", "Reasons"], x.rejected.map((r) => [r.target, r.kind, h("ul", {}, r.reasons.map((m) => h("li", {}, m)))]), { "data-testid": "rejected" })
    : h("p", {}, "None."));
  return parts;
}

export async function explainPage() {
  const fleet = h("input", { id: "fleet", name: "fleet", type: "file", accept: ".json,application/json" });
  const request = h("input", { id: "request", name: "request", type: "file", accept: ".json,application/json" });
  const now = h("input", { id: "now", name: "now", placeholder: "2026-10-12T12:00:00+00:00" });
  const out = h("div", { "data-testid": "explain-result", role: "status", "aria-live": "polite" });
  const form = h("form", { class: "card", "aria-labelledby": "explain-title" },
    h("h1", { id: "explain-title" }, "Explain a placement"),
    h("div", { class: "fields" },
      h("div", { class: "field" }, h("label", { for: "fleet" }, "Fleet (vq.placement-fleet/1)"), fleet),
      h("div", { class: "field" }, h("label", { for: "request" }, "Request (vq.placement-request/1)"), request),
      h("div", { class: "field" }, h("label", { for: "now" }, "Now (optional, ISO 8601 with offset)"), now)),
    h("div", { class: "actions" }, h("button", { type: "submit" }, "Explain")));
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    out.replaceChildren(h("p", { class: "muted" }, "Explaining…"));
    try {
      const body = { fleet: await readJson(fleet, "fleet"), request: await readJson(request, "request") };
      if (now.value.trim()) body.now = now.value.trim();
      out.replaceChildren(...result(await post("/v1/placement/explain", body)));
    } catch (err) {
      out.replaceChildren(errorBox(err));
    }
  });
  return h("section", {}, form, out);
}

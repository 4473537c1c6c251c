// "Would it fit?": the preview form, its answer, and Reserve (POST /v1/reservations).
import { newIdempotencyKey, post } from "./api.js";
import { errorBox, h, link, when } from "./dom.js";
import { highlightAtoms } from "./grid.js";

const TENANT = "bc.tenant";

function field(label, input, hint) {
  return h("div", { class: "field" }, h("label", { for: input.id }, label), input, hint ? h("small", {}, hint) : null);
}

// Any JSON value as HTML (for fields whose shape may grow: rejections, nearestMisses).
export function anyValue(v) {
  if (Array.isArray(v)) {
    if (v.length && v.every((x) => x && typeof x === "object" && !Array.isArray(x))) {
      const keys = [...new Set(v.flatMap((x) => Object.keys(x)))];
      return h("table", {}, h("thead", {}, h("tr", {}, keys.map((k) => h("th", { scope: "col" }, k)))),
        h("tbody", {}, v.map((x) => h("tr", {}, keys.map((k) => h("td", {}, x[k] === undefined ? "" : anyValue(x[k])))))));
    }
    return h("ul", {}, v.map((x) => h("li", {}, anyValue(x))));
  }
  if (v && typeof v === "object") {
    return h("dl", {}, Object.entries(v).map(([k, x]) => [h("dt", {}, k), h("dd", {}, anyValue(x))]));
  }
  return v === null || v === undefined ? "—" : String(v);
}

export function requestBody(form, poolId, idempotencyKey) {
  const v = (name) => form.elements[name].value.trim();
  const device = { class: "gpu", count: Number(v("gpus")) };
  if (v("topology")) device.topology = v("topology");
  if (v("selector")) device.selector = v("selector");
  const body = {
    tenantId: v("tenantId"), poolId, devices: device.count > 0 ? [device] : [],
    duration: v("duration") || "1h", spot: form.elements.spot.checked, binding: v("binding"), idempotencyKey,
  };
  if (v("cpu")) body.resources = { cpu: Number(v("cpu")) };
  if (v("start")) body.start = v("start");
  return body;
}

function answer(p) {
  const parts = [];
  if (p.fits) {
    parts.push(h("p", { class: "ok" }, `Fits: ${p.candidates.length} candidate node(s), best first (highlighted in the grid).`));
    parts.push(h("ol", { "data-testid": "candidates" }, p.candidates.map((c) =>
      h("li", {}, link(`#/nodes/${encodeURIComponent(c.nodeId)}`, c.nodeName), ` score ${c.score.toFixed(3)}: `, c.atoms.join(", ")))));
  } else {
    parts.push(h("p", { class: "error", "data-testid": "reason" }, `Does not fit: ${p.reason || "—"}`));
  }
  if (p.satisfiable === false && p.unsatisfiableReason) parts.push(h("p", {}, `Never: ${p.unsatisfiableReason}`));
  if (p.earliest) {
    parts.push(h("p", { "data-testid": "earliest" }, `Earliest: ${when(p.earliest.start)} – ${when(p.earliest.end)} on `,
      link(`#/nodes/${encodeURIComponent(p.earliest.nodeId)}`, p.earliest.nodeName), ` (${p.earliest.atoms.join(", ")})`));
  }
  if (p.earliestReason) parts.push(h("p", { "data-testid": "earliest-reason" }, `Earliest: ${p.earliestReason}`));
  for (const [key, title] of [["rejections", "Rejections"], ["nearestMisses", "Nearest misses"]]) {
    if (p[key] !== undefined && p[key] !== null) {
      parts.push(h("h3", {}, title), h("div", { "data-testid": key }, anyValue(p[key])));
    }
  }
  if (p.warnings && p.warnings.length) parts.push(h("ul", { class: "warnings" }, p.warnings.map((w) => h("li", {}, w))));
  return parts;
}

export function previewForm(poolId, gridHolder, refresh) {
  const input = (id, attrs) => h("input", { id, name: id, ...attrs });
  const tenant = input("tenantId", { required: true, value: sessionStorage.getItem(TENANT) || "" });
  const form = h("form", { class: "card", "aria-labelledby": "preview-title", novalidate: true },
    h("h2", { id: "preview-title" }, "Would it fit?"),
    h("div", { class: "fields" },
      field("Tenant", tenant),
      field("GPUs", input("gpus", { type: "number", min: 0, value: 1 })),
      field("Topology", h("select", { id: "topology", name: "topology" }, h("option", { value: "" }, "any"), h("option", { value: "nvlink-all" }, "nvlink-all"))),
      field("Selector", input("selector", { placeholder: "gpu.model in (H100, A100)" })),
      field("CPU", input("cpu", { type: "number", min: 0, step: "any" })),
      field("Duration", input("duration", { value: "1h" }), "e.g. 90m, 1d"),
      field("Start", input("start", { placeholder: "now" }), "empty: now; earliest; or an ISO time"),
      field("Binding", h("select", { id: "binding", name: "binding" }, ["device", "node", "kubernetes"].map((b) => h("option", { value: b }, b)))),
      h("div", { class: "field check" }, input("spot", { type: "checkbox" }), h("label", { for: "spot" }, "Spot"))),
    h("p", { class: "muted" }, "Reserve places the request now: the service takes one of the best candidates at random (seeded), so it may land on a candidate other than the first."),
    h("div", { class: "actions" },
      h("button", { type: "submit" }, "Would it fit?"),
      h("button", { type: "button", id: "reserve", disabled: true }, "Reserve")));
  const result = h("div", { "data-testid": "preview-result", role: "status", "aria-live": "polite" });
  let key = null;
  form.addEventListener("input", () => { key = null; });
  const reserve = form.querySelector("#reserve");
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    sessionStorage.setItem(TENANT, tenant.value.trim());
    key = key || newIdempotencyKey("ui");
    result.replaceChildren(h("p", { class: "muted" }, "Asking…"));
    try {
      const p = await post("/v1/capacity/preview", requestBody(form, poolId, key));
      result.replaceChildren(...answer(p));
      highlightAtoms(gridHolder, new Map((p.candidates || []).map((c) => [c.nodeId, c.atoms])));
      reserve.disabled = false;
    } catch (err) {
      result.replaceChildren(errorBox(err));
    }
  });
  reserve.addEventListener("click", async () => {
    key = key || newIdempotencyKey("ui");
    result.replaceChildren(h("p", { class: "muted" }, "Reserving…"));
    try {
      const r = await post("/v1/reservations", requestBody(form, poolId, key));
      key = null;
      const why = r.status === "pending" ? ` — ${(r.conditions.find((c) => c.type === "Unschedulable") || {}).message || ""}` : "";
      await refresh();
      result.replaceChildren(h("p", { class: r.status === "placed" ? "ok" : "error", "data-testid": "reserved" },
        `Reservation `, link(`#/reservations/${encodeURIComponent(r.id)}`, r.id), ` is ${r.status}${why}`));
      reserve.disabled = true;
    } catch (err) {
      result.replaceChildren(errorBox(err));
    }
  });
  return h("section", {}, form, result);
}

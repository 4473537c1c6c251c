// Node: devices with health and attributes, the NVLink link matrix, labels, taints, heartbeat.
import { get } from "../api.js";
import { h, link, table, when } from "../dom.js";

function linkMatrix(node) {
  const gpus = node.devices.filter((d) => d.class === "gpu").map((d) => d.id);
  if (!gpus.length) return h("p", {}, "No GPU.");
  const between = new Map();
  for (const l of node.links) {
    between.set(`${l.a}|${l.b}`, l.link);
    between.set(`${l.b}|${l.a}`, l.link);
  }
  return h("table", { class: "matrix", "data-testid": "link-matrix" },
    h("caption", {}, "Links between GPUs (NV# is NVLink; others are PCIe paths)"),
    h("thead", {}, h("tr", {}, h("td", {}), gpus.map((g) => h("th", { scope: "col" }, g)))),
    h("tbody", {}, gpus.map((a) => h("tr", {}, h("th", { scope: "row" }, a),
      gpus.map((b) => {
        const kind = a === b ? "X" : between.get(`${a}|${b}`) || "—";
        return h("td", { "data-link": kind, class: /^NV/.test(kind) ? "nvlink" : null }, kind);
      })))));
}

export async function nodePage(nodeId) {
  const node = await get(`/v1/nodes/${encodeURIComponent(nodeId)}`);
  const devices = node.devices.map((d) => [d.id, d.class, d.healthy ? "healthy" : `unhealthy${d.healthReason ? `: ${d.healthReason}` : ""}`,
    d.bookable ? "yes" : "no", d.numaNode ?? "—",
    Object.entries(d.attributes || {}).map(([k, v]) => `${k}=${typeof v === "object" ? JSON.stringify(v) : v}`).join(", ")]);
  const labels = Object.entries(node.labels).map(([k, v]) => {
    const system = node.labelSources[k] === "system";
    return [h("code", {}, k), v, system ? h("span", { class: "badge" }, "system") : "operator"];
  });
  const resources = Object.entries(node.resources || {}).map(([k, r]) => [k, String(r.allocatable), String(r.allocated)]);
  const agent = node.agent;
  return h("section", { "aria-labelledby": "node-title" },
    h("p", {}, link(`#/pools/${encodeURIComponent(node.poolId)}`, "← pool")),
    h("h1", { id: "node-title" }, `Node ${node.name}`),
    h("dl", { class: "facts" },
      h("dt", {}, "Ready"), h("dd", {}, node.ready ? "yes" : "no"),
      h("dt", {}, "Cordoned"), h("dd", {}, node.cordoned ? "yes" : "no"),
      h("dt", {}, "Not schedulable because"), h("dd", {}, node.noScheduleReasons.join("; ") || "—"),
      h("dt", {}, "Heartbeat"), h("dd", { "data-testid": "heartbeat" }, agent
        ? `${node.heartbeatLost ? "lost; " : ""}last ${when(agent.lastHeartbeatAt)}, every ${agent.intervalSeconds} s${agent.error ? `; error: ${agent.error}` : ""}`
        : "no agent (registered by an operator)")),
    h("h2", {}, "Devices"), table(["Device", "Class", "Health", "Bookable", "NUMA", "Attributes"], devices),
    h("h2", {}, "NVLink matrix"), linkMatrix(node),
    h("h2", {}, "Resources"), table(["Resource", "Allocatable", "Allocated"], resources),
    h("h2", {}, "Labels"), labels.length ? table(["Key", "Value", "Source"], labels) : h("p", {}, "None."),
    h("h2", {}, "Taints"), node.taints.length ? table(["Key", "Value", "Effect"], node.taints.map((t) => [t.key, t.value, t.effect])) : h("p", {}, "None."));
}

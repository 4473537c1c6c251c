// The public API with the signed-in key (sessionStorage only: never a URL, never a cookie).
const KEY = "bc.apiKey";

export function apiKey() {
  return sessionStorage.getItem(KEY);
}

export function signIn(key) {
  sessionStorage.setItem(KEY, key.trim());
}

export function signOut() {
  sessionStorage.removeItem(KEY);
}

export class ApiError extends Error {
  constructor(status, body) {
    const e = (body && body.error) || {};
    const path = e.details && e.details.path ? ` (${[].concat(e.details.path).join(".")})` : "";
    super(`${e.code || status}: ${e.message || "request failed"}${path}`);
    this.status = status;
    this.code = e.code;
    this.body = body;
  }
}

export async function api(method, path, body) {
  const headers = { Authorization: `Bearer ${apiKey() || ""}` };
  const init = { method, headers };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const r = await fetch(path, init);
  const text = await r.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = { error: { message: text.slice(0, 200) } };
  }
  if (!r.ok) throw new ApiError(r.status, data);
  return data;
}

export const get = (path) => api("GET", path);
export const post = (path, body) => api("POST", path, body);

// Every item of a paged list (follows nextCursor up to `max` items).
export async function all(path, max = 5000) {
  const items = [];
  let cursor = null;
  do {
    const sep = path.includes("?") ? "&" : "?";
    const page = await get(`${path}${sep}limit=1000${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""}`);
    items.push(...page.items);
    cursor = page.nextCursor;
  } while (cursor && items.length < max);
  return items;
}

export function q(params) {
  const u = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== "") u.set(k, v);
  const s = u.toString();
  return s ? `?${s}` : "";
}

export function newIdempotencyKey(prefix = "ui") {
  const rand = crypto.getRandomValues(new Uint32Array(3));
  return `${prefix}-${Date.now().toString(36)}-${[...rand].map((n) => n.toString(36)).join("")}`;
}

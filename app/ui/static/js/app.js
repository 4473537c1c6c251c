// The dashboard's shell: sign-in, navigation and hash routing (#/pools/<poolId>, ...).
import { apiKey, signIn, signOut } from "./api.js";
import { h, link, errorBox } from "./dom.js";
import { poolsPage } from "./pages/pools.js";
import { poolPage } from "./pages/pool.js";
import { reservationPage } from "./pages/reservation.js";
import { nodePage } from "./pages/node.js";
import { explainPage } from "./pages/explain.js";

const ROUTES = [
  [/^#\/pools\/([^/]+)$/, (m) => poolPage(decodeURIComponent(m[1])), "Pool"],
  [/^#\/reservations\/([^/]+)$/, (m) => reservationPage(decodeURIComponent(m[1])), "Reservation"],
  [/^#\/nodes\/([^/]+)$/, (m) => nodePage(decodeURIComponent(m[1])), "Node"],
  [/^#\/explain$/, () => explainPage(), "Explain"],
  [/^(#\/?(pools)?)?$/, () => poolsPage(), "Pools"],
];

const main = document.getElementById("main");
const nav = document.getElementById("nav");

let signInError = null; // why the last key was refused (the service's own words), shown on the sign-in form

function signInPage() {
  const input = h("input", { id: "api-key", name: "apiKey", type: "password", autocomplete: "off", required: true });
  const form = h("form", { class: "card", "aria-labelledby": "signin-title" },
    h("h1", { id: "signin-title" }, "Sign in"),
    h("p", {}, "Your API key stays in this tab (session storage) and is sent as ", h("code", {}, "Authorization: Bearer"), "."),
    h("label", { for: "api-key" }, "API key"), input,
    signInError ? h("p", { class: "error", role: "alert", "data-testid": "signin-error" }, `Not signed in: ${signInError}`) : null,
    h("button", { type: "submit" }, "Sign in"));
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    signInError = null;
    signIn(input.value);
    render();
  });
  return form;
}

function renderNav() {
  nav.replaceChildren();
  if (!apiKey()) return;
  const out = h("button", { type: "button", class: "link-button" }, "Sign out");
  out.addEventListener("click", () => {
    signOut();
    location.hash = "#/";
    render();
  });
  nav.append(h("ul", {}, h("li", {}, link("#/pools", "Pools")), h("li", {}, link("#/explain", "Explain")),
    h("li", {}, link("/docs", "API docs")), h("li", {}, out)));
}

let generation = 0;

export async function render() {
  const mine = ++generation;
  renderNav();
  if (!apiKey()) {
    document.title = "Sign in — better-compute";
    main.replaceChildren(signInPage());
    document.getElementById("api-key").focus();
    return;
  }
  const route = ROUTES.find(([re]) => re.test(location.hash));
  if (!route) {
    main.replaceChildren(h("h1", {}, "Not found"), link("#/pools", "Pools"));
    return;
  }
  const [re, page, title] = route;
  document.title = `${title} — better-compute`;
  main.setAttribute("aria-busy", "true");
  main.replaceChildren(h("p", { class: "muted" }, "Loading…"));
  try {
    const content = await page(location.hash.match(re));
    if (mine !== generation) return;
    main.replaceChildren(content);
  } catch (err) {
    if (mine !== generation) return;
    if (err.status === 401) {
      signInError = err.message || "the service refused the key";
      signOut();
      render();
      return;
    }
    main.replaceChildren(h("h1", {}, title), errorBox(err));
  } finally {
    if (mine === generation) main.removeAttribute("aria-busy");
  }
}

window.addEventListener("hashchange", render);
render();

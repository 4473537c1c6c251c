"""The dashboard in a real browser against a real service (docs/dashboard.md): sign in, pools, a pool's
grid, timeline and pending queue, "Would it fit?" and Reserve, a reservation and its release, a node,
Explain and the offline /docs, each driven with the keyboard, with no console error, and a tenant key
that never shows another tenant's reservation ids. A screenshot of every page lands in the test's tmp
folder.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest
from playwright.async_api import Page, Route, expect

from tests.conftest import ADMIN_KEY
from tests.factories import gpu_node
from tests.servers import Server
from tests.ui.conftest import Watched, sign_in

ROOT = Path(__file__).resolve().parents[2]
A, B = "tenant-a", "tenant-b"


@dataclass
class World:
    base: str
    pool: str
    nodes: dict[str, str]
    key_a: str
    res_b: str  # tenant B's placed reservation
    pending_b: str  # tenant B's pending reservation
    res_a: str  # tenant A's placed reservation


def _ok(r: httpx.Response) -> dict:
    assert r.status_code in (200, 201), r.text
    return r.json()


def _tenant_key(admin: httpx.Client, tenant: str, pool: str) -> str:
    pairs = [
        ("compute:capacity:read", f"pool:{pool}"),
        ("compute:reservations:*", f"pool:{pool}"),
        ("compute:reservations:*", f"tenant:{tenant}"),
        ("compute:inventory:read", f"pool:{pool}"),
        ("compute:placement:explain", "*"),
    ]
    body = {
        "principal": f"ui-{tenant}",
        "tenantId": tenant,
        "grants": [{"action": a, "resource": r} for a, r in pairs],
    }
    return _ok(admin.post("/v1/api-keys", json=body))["key"]


def _reserve(admin: httpx.Client, pool: str, tenant: str, gpus: int, key: str, **extra: object) -> dict:
    body = {
        "tenantId": tenant,
        "poolId": pool,
        "devices": [{"class": "gpu", "count": gpus}],
        "duration": "6h",
    }
    return _ok(admin.post("/v1/reservations", json={**body, "idempotencyKey": key, **extra}))


@pytest.fixture(scope="module")
def world(server: Server) -> World:
    with httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=30
    ) as admin:
        pool = _ok(admin.post("/v1/pools", json={"name": "ui-pool"}))["id"]
        nodes = {}
        for body in (
            gpu_node("big", 8, labels={"size": "big"}),
            gpu_node("small", 4, link="PIX"),
            gpu_node("off", 2, cordoned=True),
        ):
            nodes[body["name"]] = _ok(admin.post(f"/v1/pools/{pool}/nodes", json=body))["id"]
        for tenant in (A, B):
            _ok(admin.put(f"/v1/tenants/{tenant}/quotas/{pool}", json={"limits": {"gpu": 64}}))
        on_big = [{"class": "gpu", "count": 4, "selector": "size = big"}]
        res_b = _reserve(admin, pool, B, 4, "b-1", devices=on_big)
        all_big = [{"class": "gpu", "count": 8, "topology": "nvlink-all"}]
        pending_b = _reserve(admin, pool, B, 8, "b-2", devices=all_big)
        res_a = _reserve(admin, pool, A, 1, "a-1")
        assert (res_b["status"], pending_b["status"], res_a["status"]) == ("placed", "pending", "placed")
        key_a = _tenant_key(admin, A, pool)
    return World(server.url, pool, nodes, key_a, res_b["id"], pending_b["id"], res_a["id"])


async def cells(page: Page, node_id: str) -> dict[str, str]:
    """``{atom: data-state}`` of one node's row of the grid."""
    row = page.locator(f'.grid-row[data-node="{node_id}"] [data-atom]')
    await row.first.wait_for()
    return {await c.get_attribute("data-atom"): await c.get_attribute("data-state") for c in await row.all()}


async def tab_to(page: Page, name: str, limit: int = 60) -> None:
    """Press Tab until the focused element's accessible text is ``name``."""
    for _ in range(limit):
        await page.keyboard.press("Tab")
        text = await page.evaluate(
            "(document.activeElement.innerText || document.activeElement.value || '').trim()"
        )
        if text == name:
            return
    raise AssertionError(f"Tab never reached {name!r}")


async def test_sign_in_then_pools_with_the_keyboard(world: World, watched: Watched) -> None:
    page = watched.page
    await page.goto(f"{world.base}/ui")
    await expect(page.locator("input[name=apiKey]")).to_be_focused()
    await watched.shot("sign-in")
    await page.keyboard.type(ADMIN_KEY)
    await page.keyboard.press("Enter")
    table = page.get_by_test_id("pools")
    await expect(table).to_contain_text("ui-pool")
    row = table.locator("tr", has_text="ui-pool").locator("td")
    # 3 nodes; free now: 8 + 4 - 4 (B) - 1 (A) = 7 (the cordoned node's 2 are unschedulable); 5 booked
    assert await row.all_inner_texts() == ["ui-pool", "3", "7", "5", "0", "1"]
    # the key lives in sessionStorage only: not in the URL, not in a cookie
    assert ADMIN_KEY not in page.url
    assert await page.evaluate("document.cookie") == ""
    assert await page.evaluate("sessionStorage.getItem('bc.apiKey')") == ADMIN_KEY
    await watched.shot("pools")
    await tab_to(page, "ui-pool")
    await page.keyboard.press("Enter")
    await expect(page.get_by_role("heading", name="Pool ui-pool")).to_be_visible()
    assert page.url.endswith(f"#/pools/{world.pool}")


async def test_a_refused_key_says_why_on_the_sign_in_form(world: World, watched: Watched) -> None:
    page = watched.page
    watched.allow("status of 401")  # the browser logs the refused call as a failed load, nothing else
    await page.goto(f"{world.base}/ui")
    await page.locator("input[name=apiKey]").fill("not-a-key")
    await page.keyboard.press("Enter")
    error = page.get_by_test_id("signin-error")
    await expect(error).to_contain_text("Not signed in: UNAUTHENTICATED")
    await expect(page.locator("input[name=apiKey]")).to_be_visible()
    await watched.shot("sign-in-refused")


async def test_pool_page_grid_timeline_and_pending_reason(world: World, watched: Watched) -> None:
    page = watched.page
    await sign_in(page, world.base, ADMIN_KEY, f"#/pools/{world.pool}")
    await expect(page.locator("[data-atom]")).to_have_count(14)
    big = await cells(page, world.nodes["big"])
    assert sorted(big.values()).count("booked") >= 4
    assert set((await cells(page, world.nodes["off"])).values()) == {"unschedulable"}
    # every cell says its state in text too (colour is never the only signal)
    assert all([await c.inner_text() for c in await page.locator("[data-atom]").all()])
    await expect(page.locator("svg.timeline rect.bar.booked").first).to_be_attached()
    pending = page.get_by_test_id("pending")
    await expect(pending).to_contain_text(world.pending_b)
    await expect(pending).to_contain_text("no node fits")
    await watched.shot("pool")


async def fill_preview(page: Page, tenant: str, gpus: int) -> None:
    """Type into the preview form with the keyboard: Tenant, then GPUs (focus moves by Tab)."""
    await page.get_by_label("Tenant").focus()
    await page.keyboard.press("Control+A")
    await page.keyboard.type(tenant)
    await page.keyboard.press("Tab")
    await page.keyboard.press("Control+A")
    await page.keyboard.type(str(gpus))


async def test_reserve_through_the_form_books_the_cells(world: World, watched: Watched) -> None:
    page = watched.page
    await sign_in(page, world.base, world.key_a, f"#/pools/{world.pool}")
    await fill_preview(page, A, 2)
    await page.keyboard.press("Enter")  # submits the form: Would it fit?
    result = page.get_by_test_id("preview-result")
    await expect(result.get_by_test_id("candidates")).to_be_visible()
    await expect(page.locator("[data-highlight]")).to_have_count(
        await page.locator("[data-highlight]").count()
    )
    assert await page.locator("[data-highlight]").count() >= 2
    await watched.shot("preview-fits")
    await tab_to(page, "Reserve")
    await page.keyboard.press("Space")
    reserved = result.get_by_test_id("reserved")
    await expect(reserved).to_contain_text("placed")
    res_id = await reserved.locator("a").inner_text()
    async with httpx.AsyncClient(
        base_url=world.base, headers={"Authorization": f"Bearer {ADMIN_KEY}"}
    ) as admin:
        allocations = _ok(await admin.get(f"/v1/reservations/{res_id}"))["allocations"]
    assert sum(len(a["atoms"]) for a in allocations) == 2
    for a in allocations:
        states = await cells(page, a["nodeId"])
        assert {states[atom] for atom in a["atoms"]} == {"booked"}
    await watched.shot("reserved")


async def test_a_preview_that_does_not_fit_shows_its_reason(world: World, watched: Watched) -> None:
    page = watched.page
    await sign_in(page, world.base, ADMIN_KEY, f"#/pools/{world.pool}")
    await fill_preview(page, A, 8)
    await page.get_by_label("Topology").select_option("nvlink-all")
    await page.get_by_role("button", name="Would it fit?").press("Enter")
    reason = page.get_by_test_id("preview-result").get_by_test_id("reason")
    await expect(reason).to_contain_text("Does not fit: no node fits")
    await expect(page.locator("[data-highlight]")).to_have_count(0)
    # why not: the rejection rows (one per reason, with the filter) and the nearest misses, as tables
    result = page.get_by_test_id("preview-result")
    rows = result.get_by_test_id("rejections").locator("tbody tr")
    await expect(rows.first).to_be_visible()
    assert await rows.count() >= 1
    await expect(result.get_by_test_id("rejections")).to_contain_text("filter")
    misses = result.get_by_test_id("nearestMisses")
    await expect(misses).to_contain_text("shortfall")
    await expect(misses.locator("tbody tr").first).to_be_visible()
    await watched.shot("preview-no-fit")
    # reserving it anyway: it waits, and the page's pending queue shows it at once (no reload)
    await page.get_by_role("button", name="Reserve").click()
    reserved = result.get_by_test_id("reserved")
    await expect(reserved).to_contain_text("pending")
    waiting = await reserved.locator("a").inner_text()
    await expect(page.get_by_test_id("pending")).to_contain_text(waiting)
    await expect(page.get_by_test_id("pending")).to_contain_text("nvlink-all")


async def test_a_tenant_key_never_shows_another_tenants_reservation_ids(
    world: World, watched: Watched
) -> None:
    page = watched.page
    await sign_in(page, world.base, world.key_a)
    hidden = (world.res_b, world.pending_b)
    visits = [
        ("pools", ""),
        ("pool", f"#/pools/{world.pool}"),
        ("node", f"#/nodes/{world.nodes['big']}"),
        ("reservation", f"#/reservations/{world.res_a}"),
    ]
    for name, hash_ in visits:
        await page.goto(f"{world.base}/ui/{hash_}")
        await expect(page.locator("main")).not_to_have_attribute("aria-busy", "true")
        await expect(page.locator("main h1")).to_be_visible()
        html = await page.content()
        titles = " ".join(await page.locator("title").all_text_contents())
        for rid in hidden:
            assert rid not in html and rid not in titles, (name, rid)
        await watched.shot(f"tenant-{name}")
    # B's booking still shows as booked on the grid, only without its id
    await page.goto(f"{world.base}/ui/#/pools/{world.pool}")
    assert list((await cells(page, world.nodes["big"])).values()).count("booked") >= 4


async def test_reservation_page_and_release_with_the_keyboard(world: World, watched: Watched) -> None:
    page = watched.page
    body = {"tenantId": A, "poolId": world.pool, "devices": [{"class": "gpu", "count": 1}], "duration": "1h"}
    async with httpx.AsyncClient(
        base_url=world.base, headers={"Authorization": f"Bearer {ADMIN_KEY}"}
    ) as admin:
        r = _ok(await admin.post("/v1/reservations", json={**body, "idempotencyKey": "a-release"}))
    await sign_in(page, world.base, ADMIN_KEY, f"#/reservations/{r['id']}")
    await expect(page.get_by_test_id("status")).to_contain_text("placed")
    atom = r["allocations"][0]["atoms"][0]
    await expect(page.locator(f'[data-atom="{atom}"]')).to_have_attribute("data-highlight", "true")
    await watched.shot("reservation")
    await tab_to(page, "Release")
    await page.keyboard.press("Enter")
    await expect(page.get_by_test_id("status")).to_contain_text("released")
    await expect(page.locator("svg.timeline circle").first).to_be_attached()  # the Released condition
    await watched.shot("reservation-released")


async def test_node_page(world: World, watched: Watched) -> None:
    page = watched.page
    await sign_in(page, world.base, ADMIN_KEY, f"#/nodes/{world.nodes['big']}")
    await expect(page.get_by_role("heading", name="Node big")).to_be_visible()
    matrix = page.get_by_test_id("link-matrix")
    await expect(matrix.locator("td[data-link=NV12]")).to_have_count(56)
    await expect(page.get_by_test_id("heartbeat")).to_contain_text("no agent")
    await expect(page.locator("main")).to_contain_text("size")
    await watched.shot("node")
    await tab_to(page, "← pool")
    await page.keyboard.press("Enter")
    await expect(page.get_by_role("heading", name="Pool ui-pool")).to_be_visible()


async def test_explain_ranks_and_rejects(world: World, watched: Watched) -> None:
    page = watched.page
    await sign_in(page, world.base, world.key_a, "#/explain")
    examples = ROOT / "examples" / "placement"
    await page.get_by_label("Fleet").set_input_files(examples / "fleet.json")
    await page.get_by_label("Request").set_input_files(examples / "request.json")
    await page.get_by_label("Now").focus()
    await page.keyboard.type("2026-10-12T12:00:00+00:00")
    await page.keyboard.press("Enter")
    out = page.get_by_test_id("explain-result")
    await expect(out.get_by_test_id("selected")).to_be_visible()
    fleet = json.loads((examples / "fleet.json").read_text())
    shown = await out.inner_text()
    assert all(t["name"] in shown for t in fleet["targets"])
    await expect(out.locator("svg.timeline rect.bar").first).to_be_attached()
    await watched.shot("explain")


async def test_docs_render_with_the_network_blocked(world: World, watched: Watched) -> None:
    page = watched.page
    outside: list[str] = []

    async def only_local(route: Route) -> None:
        host = urlparse(route.request.url).hostname
        if host in ("127.0.0.1", "localhost"):
            await route.continue_()
        else:
            outside.append(route.request.url)
            await route.abort()

    await page.route("**/*", only_local)
    await page.goto(f"{world.base}/docs")
    # Swagger UI parses the whole document before it draws: give a loaded 2-core machine time
    await expect(page.locator(".swagger-ui .information-container")).to_be_visible(timeout=30_000)
    await expect(page.locator(".swagger-ui")).to_contain_text("better-compute")
    assert outside == []
    await watched.shot("docs")

"""Browser tests of the dashboard (docs/dashboard.md): Debian's chromium driven by Playwright against one
real ``better-compute serve`` process per module, on the test database.

``/usr/bin/chromium`` is required (``.ci/run`` installs it; no ``playwright install``). One browser per
module; each test gets a fresh context (so a fresh ``sessionStorage``) and fails on any console error or
page error the browser saw.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.async_api import Browser, Page, async_playwright

CHROMIUM = os.environ.get("BC_TEST_CHROMIUM", "/usr/bin/chromium")


@pytest.fixture(scope="module")
def chromium() -> str:
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: apt-get install -y chromium (.ci/run does)"
    return CHROMIUM


@pytest.fixture(scope="module")
async def browser(chromium: str) -> AsyncIterator[Browser]:
    async with async_playwright() as p:
        launched = await p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        yield launched
        await launched.close()


class Watched:
    """A page and the console errors and page errors it logged."""

    def __init__(self, page: Page, shots: Path) -> None:
        self.page = page
        self.errors: list[str] = []
        self.allowed: list[str] = []  # console errors a test provokes on purpose (substrings)
        self.shots = shots
        page.on("console", lambda m: m.type == "error" and self.errors.append(f"console: {m.text}"))
        page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))

    def allow(self, text: str) -> None:
        """Console errors containing ``text`` are expected by this test (e.g. a refused key's 401)."""
        self.allowed.append(text)

    def unexpected(self) -> list[str]:
        return [e for e in self.errors if not any(a in e for a in self.allowed)]

    async def shot(self, name: str) -> Path:
        """A full-page screenshot under the test's tmp folder."""
        path = self.shots / f"{name}.png"
        await self.page.screenshot(path=str(path), full_page=True)
        return path


@pytest.fixture
async def watched(browser: Browser, tmp_path: Path) -> AsyncIterator[Watched]:
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    page = await context.new_page()
    page.set_default_timeout(10_000)
    w = Watched(page, tmp_path)
    try:
        yield w
    finally:
        await context.close()
    assert w.unexpected() == [], w.errors


async def sign_in(page: Page, base: str, key: str, hash_: str = "") -> None:
    """Open the dashboard and sign in with ``key`` using the keyboard only."""
    await page.goto(f"{base}/ui/{hash_}")
    field = page.get_by_label("API key")
    await field.wait_for()
    await page.keyboard.type(key)  # the field has the focus on arrival
    await page.keyboard.press("Enter")
    await page.locator("#nav a", has_text="Pools").wait_for()

"""The web chat page on a phone-sized screen in a real browser: a reply shown while it is
written and then in its place, Markdown rendered without any of it able to run, the
conversation back after a reload (from the browser's copy or the server's log), and
nothing of it in another browser.

Headless Debian Chromium driven by Playwright (as in test_browser.py); assertions use
Playwright's auto-waiting ``expect``, never sleeps. The provider is held open mid-stream
by an event the test sets.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from parley.core.messages import TextBlock, Usage
from parley.core.providers.base import STOP_END, ProviderRequest, ProviderResponse, TextCallback
from tests.gateway.admin.conftest import admin_world, seed_session
from tests.gateway.admin.test_browser import CHROMIUM, CHROMIUM_ARGS, TIMEOUT_MS, Tab
from tests.gateway.media_support import picture
from tests.gateway.memory_helpers import use_hashing_embedder

playwright_api = pytest.importorskip("playwright.async_api", reason="needs playwright")
async_playwright = playwright_api.async_playwright
expect = playwright_api.expect

PHONE = {"width": 375, "height": 720}
HOSTILE = (
    "**bold** and `code` <script>window.pwned = 1</script> "
    "<img src=x onerror='window.pwned = 2'> [click](javascript:window.pwned=3) "
    "[docs](https://example.com/docs)"
)


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    async with async_playwright() as pw:
        chromium = await pw.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield chromium
        finally:
            await chromium.close()


async def phone_tab(browser: Any) -> Tab:
    context = await browser.new_context(viewport=PHONE)
    context.set_default_timeout(TIMEOUT_MS)
    return Tab(await context.new_page())


async def open_chat(tab: Tab, server: Any) -> None:
    await tab.page.goto(f"{server.base_url}/chat#token={server.token}")
    await expect(tab.page.locator("#chat-status")).to_have_attribute(
        "data-state", "connected", timeout=TIMEOUT_MS
    )


async def say(page: Any, text: str) -> None:
    await page.locator("#chat-input").fill(text)
    await page.locator("#chat-input").press("Enter")


async def test_a_reply_streams_then_takes_the_drafts_place(
    admin_server: Any, browser: Any, tmp_path: Path
) -> None:
    server, release = admin_server, asyncio.Event()

    async def complete(request: ProviderRequest, on_text: TextCallback | None = None) -> Any:
        assert on_text is not None  # the web chat shows drafts
        await on_text("Thinking about **bo")
        await release.wait()  # held mid-stream until the page has shown the draft
        await on_text("ld** things.")
        text = "Thinking about **bold** things."
        return ProviderResponse((TextBlock(text),), STOP_END, Usage(5, 5), "scripted-model")

    server.provider.complete = complete
    tab = await phone_tab(browser)
    page = tab.page
    await open_chat(tab, server)
    await say(page, "stream please")
    draft = page.locator("#messages .message.bot.draft")
    await expect(draft).to_contain_text("Thinking about", timeout=TIMEOUT_MS)
    await expect(draft.locator(".meta")).to_contain_text("writing")
    await page.screenshot(path=tmp_path / "draft.png")
    release.set()
    bot = page.locator("#messages .message.bot")
    await expect(page.locator("#messages .message.bot.draft")).to_have_count(0, timeout=TIMEOUT_MS)
    await expect(bot).to_have_count(1)  # the draft became the reply: not two bubbles
    await expect(bot.locator("strong")).to_have_text("bold")
    await expect(page.locator("#typing")).to_be_hidden()
    assert tab.problems == []


async def test_markdown_is_safe_and_fits_a_phone(
    admin_server: Any, browser: Any, tmp_path: Path
) -> None:
    tab = await phone_tab(browser)
    page = tab.page
    await open_chat(tab, admin_server)
    await say(page, HOSTILE)
    bot = page.locator("#messages .message.bot")
    await expect(bot).to_have_count(1, timeout=TIMEOUT_MS)
    await expect(bot.locator("strong")).to_have_text("bold")
    await expect(bot.locator("code")).to_have_text("code")
    await expect(bot).to_contain_text("<script>window.pwned = 1</script>")  # as text
    links = bot.locator("a")
    await expect(links).to_have_count(1)  # the javascript: one is words only
    assert await links.get_attribute("href") == "https://example.com/docs"
    assert "noopener" in (await links.get_attribute("rel") or "")
    assert await page.locator("#messages script, #messages img, #messages iframe").count() == 0
    assert await page.evaluate("window.pwned") is None

    await say(page, "/help")
    await expect(bot).to_have_count(2, timeout=TIMEOUT_MS)
    aligned = bot.nth(1).locator(".aligned")
    await expect(aligned).to_contain_text("/compact [focus]")
    await page.screenshot(path=tmp_path / "phone.png", full_page=True)
    # Nothing is wider than the screen: no sideways scrolling, no clipped header.
    fits = await page.evaluate(
        """() => {
            const width = document.documentElement.clientWidth;
            const clipped = [...document.querySelectorAll('.topbar > *, .topbar nav > *')]
                .filter((el) => el.getBoundingClientRect().right > width + 0.5)
                .map((el) => el.textContent);
            return { scroll: document.documentElement.scrollWidth <= width, clipped };
        }"""
    )
    assert fits == {"scroll": True, "clipped": []}
    assert tab.problems == []


async def test_a_reload_restores_the_conversation_for_this_browser_only(
    admin_server: Any, browser: Any
) -> None:
    tab = await phone_tab(browser)
    page = tab.page
    await open_chat(tab, admin_server)
    await say(page, "remember the lighthouse")
    bot = page.locator("#messages .message.bot")
    await expect(bot).to_contain_text("echo: remember the lighthouse", timeout=TIMEOUT_MS)

    await page.reload()  # the browser's copy
    await expect(page.locator("#messages .message.user .body")).to_have_text(
        ["remember the lighthouse"], timeout=TIMEOUT_MS
    )
    await expect(bot).to_have_count(1)

    # Without the browser's copy (another device's storage is not shared; a cleared
    # one), the server's log brings it back.
    await page.evaluate(
        "Object.keys(localStorage).filter((k) => k.startsWith('parley.chat.log.'))"
        ".forEach((k) => localStorage.removeItem(k))"
    )
    await page.reload()
    await expect(bot).to_contain_text("echo: remember the lighthouse", timeout=TIMEOUT_MS)
    await expect(page.locator("#messages .message.user")).to_have_count(1)

    # Another browser (another client id): none of it.
    other = await phone_tab(browser)
    await open_chat(other, admin_server)
    await expect(other.page.locator("#chat-empty")).to_be_visible()
    assert await other.page.locator("#messages .message").count() == 0
    assert "lighthouse" not in await other.page.content()
    assert tab.problems == [] and other.problems == []


@pytest.fixture
async def uploads_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Any]:
    use_hashing_embedder(monkeypatch)
    async with admin_world(tmp_path / "home", seed_session, uploads=True) as world:
        yield world


async def test_a_file_attached_in_the_page_reaches_the_model(
    uploads_server: Any, browser: Any, tmp_path: Path
) -> None:
    """The 📎 button: the picture rides in the message frame, is kept by the gateway and
    reaches the model (a model without vision: a placeholder naming it, with the words)."""
    server = uploads_server
    tab = await phone_tab(browser)
    page = tab.page
    await open_chat(tab, server)
    before = len(server.provider.requests)
    png = picture(64, 48, fmt="PNG")
    await page.locator("#chat-file").set_input_files(
        files=[{"name": "cat.png", "mimeType": "image/png", "buffer": png}]
    )
    await expect(page.locator("#chat-files")).to_have_text("cat.png")
    await say(page, "what is this?")
    await expect(page.locator("#messages .message.bot")).to_have_count(1, timeout=TIMEOUT_MS)
    await expect(page.locator("#messages .message.user").last).to_contain_text("[cat.png]")
    await expect(page.locator("#chat-files")).to_have_text("")  # cleared for the next one
    [request] = server.provider.requests[before:]
    said = "\n".join(b.text for b in request.messages[-1].content if isinstance(b, TextBlock))
    assert "what is this?" in said
    assert "[image cat.png, 64×48: the current model cannot see images" in said
    assert tab.problems == []

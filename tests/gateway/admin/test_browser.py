"""The inspector (GET /) and web chat (GET /chat) pages in a real browser.

Headless Debian Chromium driven by Playwright's async API, against the `admin_server`
fixture (a real gateway on a loopback port, served from this test's event loop; the
Playwright calls await a driver subprocess, so the loop stays free to answer the
browser). Assertions use Playwright's auto-waiting `expect`, never sleeps. Screenshots
land in each test's `tmp_path` for a human to look at.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

playwright_api = pytest.importorskip("playwright.async_api", reason="needs playwright")
async_playwright = playwright_api.async_playwright
expect = playwright_api.expect

CHROMIUM = Path("/usr/bin/chromium")
if not CHROMIUM.exists():
    pytest.skip(
        "needs Debian Chromium at /usr/bin/chromium (apt-get install chromium)",
        allow_module_level=True,
    )

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# Generous: the box running the suite may be busy; expect() returns as soon as it holds.
AUDIENCE_RE = re.compile(r"^(person .+|conversation .+|agent-wide)$")
TIMEOUT_MS = 15_000
EXPECTED_NOISE = ("Failed to load resource", "WebSocket connection to")
# The figures as /status and /context word them: the window and its source, the next
# request's estimate, the last call as the model reported it.
FIGURES_RE = [
    re.compile(r"^Context window: [\d,]+ tokens, .+$"),
    re.compile(r"^Next request \(estimated\): ~[\d,]+ / [\d,]+ tokens \(\d+\.\d%\)$"),
    re.compile(r"^Last call \(reported by the model\): .+$"),
]


class Tab:
    """A page plus what went wrong in it: uncaught errors and CSP violations."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.problems: list[str] = []
        page.on("pageerror", lambda exc: self.problems.append(f"uncaught: {exc}"))
        page.on("console", self._on_console)

    def _on_console(self, message: Any) -> None:
        # A refused request or websocket is the wrong-token tests doing their job (and
        # is asserted on directly); a CSP refusal or a script error is a bug in the page.
        if message.type == "error" and not message.text.startswith(EXPECTED_NOISE):
            self.problems.append(f"console: {message.text}")


@pytest.fixture
async def tab() -> AsyncIterator[Tab]:
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        try:
            context = await browser.new_context(viewport={"width": 1360, "height": 900})
            context.set_default_timeout(TIMEOUT_MS)
            tab = Tab(await context.new_page())
            yield tab
            # A script error or CSP refusal fails the test even when every assertion held.
            assert tab.problems == []
        finally:
            await browser.close()


async def say(server: Any, text: str) -> str:
    """A message from the seeded session's own chat; the reply's text."""
    channel = server.channel
    before = len(channel.sent)
    await server.gateway.handle_inbound(channel.inbound(text, sender="alice"))
    return str((await channel.wait_sent(before + 1))[before].text)


async def enter_token(page: Any, token: str) -> None:
    await expect(page.locator("#token-form")).to_be_visible(timeout=TIMEOUT_MS)
    await page.locator("#token-input").fill(token)
    await page.locator("#token-submit").click()


async def test_inspector_shows_a_session(admin_server: Any, tab: Tab, tmp_path: Path) -> None:
    page, server = tab.page, admin_server
    await page.goto(f"{server.base_url}/")

    # No token yet: the prompt. A wrong token is refused and asked for again.
    await enter_token(page, "not-the-token-at-all")
    await expect(page.locator("#token-form")).to_be_visible(timeout=TIMEOUT_MS)
    await expect(page.locator("#token-hint")).to_be_visible(timeout=TIMEOUT_MS)
    await enter_token(page, server.token)

    row = page.locator(f'#sessions-table tr.session-row[data-session-id="{server.session_id}"]')
    await expect(row).to_be_visible(timeout=TIMEOUT_MS)
    await expect(page.locator("#token-form")).to_be_hidden()
    await page.screenshot(path=tmp_path / "sessions.png", full_page=True)

    await row.click()
    await expect(page).to_have_url(re.compile(rf"#/session/{server.session_id}$"))
    view = page.locator("#session-view")
    await expect(view).to_be_visible(timeout=TIMEOUT_MS)

    # The transcript: a user message, a collapsed tool call that opens, its result, and
    # the compaction marker.
    transcript = page.locator("#transcript")
    user = transcript.locator('.entry[data-type="message"][data-role="user"]').first
    await expect(user).to_be_visible(timeout=TIMEOUT_MS)
    call = transcript.locator("details.tool-call").first
    await expect(call).to_be_visible(timeout=TIMEOUT_MS)
    await expect(call).not_to_have_attribute("open", "")
    await call.locator("summary").click()
    await expect(call).to_have_attribute("open", "")
    await expect(call.locator("pre")).to_be_visible()
    await expect(transcript.locator("details.tool-result").first).to_be_visible()
    marker = transcript.locator('.entry.compaction[data-type="compaction"]').first
    await expect(marker).to_be_visible()
    await expect(marker).to_contain_text("Compacted")
    await expect(marker).to_contain_text("→")

    # The context bar: one segment per section, sized against the window, and the total.
    segments = page.locator("#context-bar .context-segment")
    await expect(segments.first).to_be_visible(timeout=TIMEOUT_MS)
    widths = await segments.evaluate_all(
        "els => els.map(e => [e.dataset.kind, Number(e.dataset.tokens), e.style.width])"
    )
    assert widths, "no context segments"
    for kind, tokens, width in widths:
        assert kind in {"system", "file", "tools", "summary", "history"}
        assert tokens >= 0
        assert width.endswith("%")
    figures = page.locator("#context-total .figure")
    await expect(figures).to_have_text(FIGURES_RE, timeout=TIMEOUT_MS)
    # Word for word what /status says in the session's own chat (one report serves both).
    status = await say(server, "/status")
    labels = ("Context window:", "Next request (estimated):", "Last call (reported")
    assert await figures.all_text_contents() == [
        line for line in status.splitlines() if line.startswith(labels)
    ]
    await expect(page.locator("#context-legend li")).to_have_count(len(widths))
    await expect(page.locator("#compactions .compaction-item").first).to_be_visible()

    # A memory search answers with a result list (the summary line is there even for none).
    await page.locator("#memory-query").fill("teapot")
    await page.locator("#memory-form button[type=submit]").click()
    await expect(page.locator("#memory-results .memory-summary")).to_contain_text(
        "result", timeout=TIMEOUT_MS
    )
    # Each hit says whose it is (the operator sees every audience, labelled).
    audience = page.locator("#memory-results .memory-hit .badge.audience").first
    await expect(audience).to_have_text(AUDIENCE_RE, timeout=TIMEOUT_MS)
    await expect(page.locator("#error-banner")).to_be_hidden()
    await page.screenshot(path=tmp_path / "session.png", full_page=True)

    # A reload keeps both the view (the fragment) and the token (sessionStorage).
    await page.reload()
    await expect(page.locator("#transcript .entry").first).to_be_visible(timeout=TIMEOUT_MS)
    await expect(page.locator("#token-form")).to_be_hidden()


async def test_token_in_the_fragment_is_taken_and_dropped(admin_server: Any, tab: Tab) -> None:
    page, server = tab.page, admin_server
    await page.goto(f"{server.base_url}/#token={server.token}")
    await expect(page.locator("#sessions-table tr.session-row").first).to_be_visible(
        timeout=TIMEOUT_MS
    )
    assert server.token not in page.url
    stored = await page.evaluate("sessionStorage.getItem('parley.token')")
    assert stored == server.token


async def test_web_chat_round_trip(admin_server: Any, tab: Tab, tmp_path: Path) -> None:
    page, server = tab.page, admin_server
    await page.goto(f"{server.base_url}/chat")
    await enter_token(page, server.token)
    status = page.locator("#chat-status")
    await expect(status).to_have_attribute("data-state", "connected", timeout=TIMEOUT_MS)
    await expect(page.locator('a[href="/"]')).to_be_visible()

    await page.locator("#chat-input").fill("hello from the browser")
    await page.locator("#chat-input").press("Enter")
    mine = page.locator("#messages .message.user")
    await expect(mine).to_have_count(1)
    await expect(mine).to_contain_text("hello from the browser")
    await expect(mine).to_have_attribute("data-state", "acked", timeout=TIMEOUT_MS)
    reply = page.locator("#messages .message.bot")
    await expect(reply).to_have_count(1, timeout=TIMEOUT_MS)
    await expect(reply).to_contain_text("echo: hello from the browser")
    await expect(page.locator("#typing")).to_be_hidden()
    await expect(page.locator("#chat-input")).to_have_value("")
    client_id = await page.evaluate("localStorage.getItem('parley.chat.client')")
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,64}", client_id or "")
    await page.screenshot(path=tmp_path / "chat.png", full_page=True)


async def test_web_chat_with_a_wrong_token_asks_again(admin_server: Any, tab: Tab) -> None:
    page, server = tab.page, admin_server
    await page.goto(f"{server.base_url}/chat#token=wrong-token-wrong-token")
    await expect(page.locator("#token-hint")).to_be_visible(timeout=TIMEOUT_MS)
    await expect(page.locator("#chat")).to_be_hidden()
    assert await page.evaluate("sessionStorage.getItem('parley.token')") is None
    await enter_token(page, server.token)
    await expect(page.locator("#chat-status")).to_have_attribute(
        "data-state", "connected", timeout=TIMEOUT_MS
    )


async def test_compact_then_reset_from_the_inspector(
    admin_server: Any, tab: Tab, tmp_path: Path
) -> None:
    page, server = tab.page, admin_server
    await page.goto(f"{server.base_url}/#token={server.token}")
    await page.goto(f"{server.base_url}/#/session/{server.session_id}")
    badge = page.locator("#session-status")
    await expect(badge).to_have_text("active", timeout=TIMEOUT_MS)

    await page.locator("#compact-focus").fill("the file list")
    await page.locator("#compact-btn").click()
    notice = page.locator("#action-result")
    await expect(notice).to_have_attribute(
        "data-outcome", re.compile(r"^(compacted|skipped|failed)$"), timeout=TIMEOUT_MS
    )
    await expect(page.locator("#compact-focus")).to_have_value("")

    # Reset asks first: dismissing changes nothing, accepting archives the session.
    page.once("dialog", lambda dialog: dialog.dismiss())
    await page.locator("#reset-btn").click()
    await expect(badge).to_have_text("active")
    page.once("dialog", lambda dialog: dialog.accept())
    await page.locator("#reset-btn").click()
    await expect(badge).to_have_text("archived", timeout=TIMEOUT_MS)
    await expect(page.locator("#reset-btn")).to_be_disabled()
    await expect(page.locator("#compact-btn")).to_be_disabled()
    await expect(page.locator("#error-banner")).to_be_hidden()
    await page.screenshot(path=tmp_path / "after-reset.png", full_page=True)

"""Debian's Chromium driven by Playwright (never a downloaded browser), and the viewer served on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from llmtap.view import ViewerSettings, create_app, discover
from tests.support.servers import ServerThread, free_port

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]  # fmt: skip


@contextmanager
def viewer_serving(paths: list[Path], *, poll_seconds: float = 0.2) -> Iterator[str]:
    """Serve `llmtap view` over `paths` on a free loopback port; yield its base URL."""
    port = free_port()
    app = create_app(discover([str(path) for path in paths]), ViewerSettings(port=port, poll_seconds=poll_seconds))
    server = ServerThread(app, port=port, lifespan="on", graceful_timeout=1)
    with server.start():
        yield server.base_url


@contextmanager
def chromium_page(**context: Any) -> Iterator[Any]:
    """A page in headless Chromium at 1400x900 (what the screenshots show)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900}, **context)
            yield page
        finally:
            browser.close()

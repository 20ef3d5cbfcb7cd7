"""Debian's Chromium driven by Playwright, as the page's tests use it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
]


@contextmanager
def chromium_browser() -> Iterator[object]:
    """A headless Chromium for one test or module, closed after it."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        instance = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield instance
        finally:
            instance.close()

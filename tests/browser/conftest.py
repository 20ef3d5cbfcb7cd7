"""What the page's and the console's browser tests share."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from testkit.browser import CHROMIUM, chromium_browser


@pytest.fixture
def browser() -> Iterator[object]:
    """A headless Chromium (Debian's, which `make test` installs) for one test."""
    if not shutil.which(CHROMIUM):
        pytest.fail("Debian's chromium is not installed: run `make test`, which installs it")
    with chromium_browser() as instance:
        yield instance

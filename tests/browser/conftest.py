"""What the browser tests share: the built site and one headless Chromium driven by Playwright.

The tests read the book that `make html` built (`_build/html`, or the folder `BOOK_HTML` names) in Debian's
`chromium` (`CHROMIUM` names another binary), so that they check what a reader's browser shows, not the notebooks'
JSON. `make test-browser` builds the book and runs them; `.ci/run` installs the browser.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SITE = Path(os.environ.get("BOOK_HTML", ROOT / "_build" / "html")).resolve()
# Flags for a headless browser on a machine without a screen or a network (and, as root, without a sandbox).
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]


def chromium_path() -> str:
    """The Chromium binary: `CHROMIUM`, else Debian's `chromium` on the PATH."""
    found = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        raise RuntimeError("no Chromium found: install Debian's `chromium` (apt-get install chromium) "
                           "or name a binary with CHROMIUM=/path/to/chromium")
    return found


@pytest.fixture(scope="session")
def site() -> Path:
    """The built book's folder; the tests fail, rather than skip, when it was not built."""
    if not (SITE / "index.html").is_file():
        raise RuntimeError(f"no built book in {SITE}: run `make html` first (or `make test-browser`)")
    return SITE


@pytest.fixture(scope="session")
def browser():
    """One headless Chromium for the whole session."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=chromium_path(), headless=True, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page_at(browser):
    """`page_at(url, width, height=900)`: a fresh page of that viewport, loaded from a file:// address."""
    contexts = []

    def open_page(url: str, width: int = 1280, height: int = 900):
        context = browser.new_context(viewport={"width": width, "height": height}, device_scale_factor=1)
        contexts.append(context)
        page = context.new_page()
        page.goto(url, wait_until="load")
        return page

    yield open_page
    for context in contexts:
        context.close()

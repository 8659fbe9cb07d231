"""Drive ``vlp serve``'s page in headless Chromium (Selenium, Debian's ``chromium`` and
``chromedriver``): search, read the grid, open a hit's Grad-CAM panel, save a screenshot.

    python scripts/serve_page.py runs/index "a red circle" --out docs/img/serve_page.png

serves the index in this process (:func:`vlp.serve.open_server`, a free port, the model loaded
once), types the query into the page's box and presses Enter, waits for the grid, clicks the hit
``--open`` (default the first) and waits for its heat map, then saves the browser's window as PNG.
The browser test (``tests/serve/test_browser.py``) drives the page with the same :class:`Page`.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any, Optional

#: where Debian's packages put the browser and its driver (``apt-get install chromium chromium-driver``)
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
#: how long the page may take to answer one step (a loaded 2-core machine, a Grad-CAM on CPU)
WAIT_S = 60


def browser_paths() -> tuple[Optional[str], Optional[str]]:
    """The Chromium binary and its driver: Debian's paths, else found on ``PATH``; None for one missing."""
    chromium = CHROMIUM if os.path.isfile(CHROMIUM) else shutil.which("chromium")
    driver = CHROMEDRIVER if os.path.isfile(CHROMEDRIVER) else shutil.which("chromedriver")
    return chromium, driver


def browser_missing() -> Optional[str]:
    """Why the page cannot be driven here (no selenium, no chromium, no chromedriver), or None."""
    if importlib.util.find_spec("selenium") is None:
        return "selenium is not installed (the dev extra: pip install -e '.[dev]')"
    chromium, driver = browser_paths()
    if chromium is None or driver is None:
        return f"no {'chromium' if chromium is None else 'chromedriver'} (apt-get install -y chromium chromium-driver)"
    return None


def chromium(width: int = 1280, height: int = 1000) -> Any:
    """A headless Chromium of Debian's packages driven by Selenium, its window ``width`` x ``height``;
    it fetches nothing by itself (no background networking, no component updates), and its profile
    is a temporary folder that ``quit()`` removes."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver = browser_paths()
    options = webdriver.ChromeOptions()
    options.binary_location = str(binary)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the page's console: driver.get_log
    for flag in (
        "--headless=new",
        "--no-sandbox",  # root in a container has no user namespace for the sandbox
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
        "--force-device-scale-factor=1",
        f"--window-size={width},{height}",
    ):
        options.add_argument(flag)
    profile = tempfile.mkdtemp(prefix="vlp_chromium_")  # without it each run left a profile in /tmp
    options.add_argument(f"--user-data-dir={profile}")
    try:
        browser = webdriver.Chrome(options=options, service=Service(str(driver)))
    except BaseException:
        shutil.rmtree(profile, ignore_errors=True)
        raise
    quit_browser = browser.quit

    def quit_and_remove_profile() -> None:
        try:
            quit_browser()
        finally:
            shutil.rmtree(profile, ignore_errors=True)

    browser.quit = quit_and_remove_profile
    browser.vlp_profile = profile
    return browser


class Page:
    """``vlp serve``'s page at ``url`` in the Selenium ``driver``: what a person does on it, each step
    waiting until the page has answered (the ``data-state`` of the grid and of the heat-map panel)."""

    def __init__(self, driver: Any, url: str) -> None:
        self.driver, self.url = driver, url

    def wait(self, test: Any, what: str) -> Any:
        from selenium.webdriver.support.ui import WebDriverWait

        return WebDriverWait(self.driver, WAIT_S, poll_frequency=0.1).until(lambda d: test(), message=what)

    def _by_id(self, name: str) -> Any:
        from selenium.webdriver.common.by import By

        return self.driver.find_element(By.ID, name)

    def open(self, query: str = "") -> None:
        """Load the page (``query``: the address's ``?...``) and wait until it has read the index and
        run the search the address holds, if any."""
        self.driver.get(self.url + query)
        self._ready(bool(query))

    def back(self) -> str:
        """The browser's Back button; wait for the grid of the address it returns to."""
        self.driver.execute_script("document.getElementById('grid').dataset.state = ''")
        self.driver.back()
        return self._ready(True)

    def _ready(self, searched: bool) -> str:
        self.wait(lambda: self.driver.find_element("tag name", "body").get_attribute("data-ready"), "page ready")
        return self.wait_grid() if searched else ""

    def wait_grid(self) -> str:
        """Wait for the grid's answer: ``done`` or ``error``."""
        grid = self._by_id("grid")
        return str(
            self.wait(
                lambda: grid.get_attribute("data-state") in ("done", "error") and grid.get_attribute("data-state"),
                "the grid",
            )
        )

    def search(self, text: str, top: Optional[int] = None, rerank: int = 0) -> str:
        """Type ``text`` into the query box (``top`` chosen, ``rerank`` > 0 ticks the ITM re-rank of
        that many), press Enter, wait for the grid; its state."""
        from selenium.webdriver.common.keys import Keys
        from selenium.webdriver.support.ui import Select

        if top is not None:
            Select(self._by_id("top")).select_by_visible_text(str(top))
        box = self._by_id("rerank")
        if box.is_selected() != (rerank > 0):
            box.click()
        if rerank:
            self._by_id("rerank-k").clear()
            self._by_id("rerank-k").send_keys(str(rerank))
        self.driver.execute_script("document.getElementById('grid').dataset.state = ''")
        q = self._by_id("q")
        q.clear()
        q.send_keys(text, Keys.ENTER)
        return self.wait_grid()

    def hits(self) -> list[dict[str, Any]]:
        """The grid's hits, in order: ``rank``, ``row``, ``itc``, ``itm`` (None: not re-ranked) and
        the ``name`` shown under the image."""
        tiles = self.driver.find_elements("css selector", "#grid .hit")
        out = []
        for t in tiles:
            itm = t.get_attribute("data-itm")
            out.append(
                {
                    "rank": int(t.get_attribute("data-rank")),
                    "row": int(t.get_attribute("data-row")),
                    "itc": float(t.get_attribute("data-itc")),
                    "itm": float(itm) if itm else None,
                    "name": t.find_element("css selector", ".name").text,
                }
            )
        return out

    def open_hit(self, rank: int = 1) -> str:
        """Click the image of hit ``rank``; wait for its panel (``done``: the heat map shows;
        ``image``: the image, no text query; ``error``: the message)."""
        self.driver.find_elements("css selector", "#grid .hit .thumb")[rank - 1].click()
        panel = self._by_id("detail")
        return str(
            self.wait(
                lambda: (
                    panel.get_attribute("data-state") in ("done", "image", "error")
                    and panel.get_attribute("data-state")
                ),
                "the heat map",
            )
        )

    def more_like(self, rank: int) -> str:
        """Click "more like this" under hit ``rank``; wait for the grid."""
        self.driver.execute_script("document.getElementById('grid').dataset.state = ''")
        self.driver.find_elements("css selector", "#grid .hit .like")[rank - 1].click()
        return self.wait_grid()

    def text(self, element_id: str) -> str:
        """The shown text of the element ``element_id`` (``error``, ``status``, ``heat-msg``...)."""
        return str(self._by_id(element_id).text)

    def fetched(self) -> list[str]:
        """Every URL the page has loaded (the browser's resource timing entries and the page itself)."""
        script = "return [location.href, ...performance.getEntriesByType('resource').map(e => e.name)]"
        return list(self.driver.execute_script(script))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("index", help="the index folder (of `vlp index`)")
    p.add_argument("query", help="the text to type into the page")
    p.add_argument("--out", required=True, help="the screenshot (PNG)")
    p.add_argument("--top", type=int, default=10, help="the page's top-k choice")
    p.add_argument("--open", type=int, default=1, help="the rank of the hit whose heat map to open")
    p.add_argument("--checkpoint", default=None)
    p.add_argument("--device", default="cpu")
    p.add_argument("--width", type=int, default=1280)
    p.add_argument("--height", type=int, default=1150)
    a = p.parse_args()
    missing = browser_missing()
    if missing:
        raise SystemExit(f"serve_page.py: {missing}")
    from vlp.serve import open_server

    server = open_server(a.index, a.checkpoint, a.device, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    driver = chromium(a.width, a.height)
    try:
        page = Page(driver, server.url)
        page.open()
        page.search(a.query, a.top)
        print(f"{page.text('status')}; hit {a.open}'s panel: {page.open_hit(a.open)}")
        driver.execute_script("window.scrollTo(0, 0)")
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(a.out)
        print(f"wrote {a.out}")
    finally:
        driver.quit()
        server.shutdown()
        server.server_close()


if __name__ == "__main__":
    main()

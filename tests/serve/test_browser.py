"""``vlp serve``'s page in a real browser: headless Chromium of Debian's packages driven by Selenium
(:class:`Page` of scripts/serve_page.py). One browser session types queries and presses Enter,
checks the grid's hits and their order against ``vlp search --json`` on the same index, opens a
hit's heat map and saves a screenshot, searches "more like this", reloads the address, and reads
the errors the page shows (an empty query, an image file deleted since indexing).

Without selenium, chromium or chromedriver the test is skipped with the reason; with
``VLP_REQUIRE_BROWSER=1`` (``.ci/run`` sets it after installing them) it fails instead."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.helpers import load_script
from tests.search.conftest import GOOD
from tests.serve.conftest import cli_hits, index_of_copy, served
from vlp.serve import SearchServer

browser = load_script("scripts/serve_page.py", "serve_page")
QUERY = "a red circle"


def no_browser(missing: str) -> None:
    """Skip for the reason ``missing``, or fail under ``VLP_REQUIRE_BROWSER=1`` (CI)."""
    if os.environ.get("VLP_REQUIRE_BROWSER") == "1":
        pytest.fail(f"VLP_REQUIRE_BROWSER=1 but the browser test cannot run: {missing}")
    pytest.skip(f"no browser to drive vlp serve's page: {missing}")


def test_a_missing_browser_skips_with_its_reason_or_fails_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLP_REQUIRE_BROWSER", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no browser to drive vlp serve's page: no chromedriver"):
        no_browser("no chromedriver")
    monkeypatch.setenv("VLP_REQUIRE_BROWSER", "1")
    with pytest.raises(pytest.fail.Exception, match="VLP_REQUIRE_BROWSER=1 but .*: no chromedriver"):
        no_browser("no chromedriver")
    monkeypatch.setattr(browser, "CHROMIUM", sys.executable)  # a file that is there
    monkeypatch.setattr(browser, "CHROMEDRIVER", "/nonexistent/chromedriver")
    monkeypatch.setenv("PATH", "/nonexistent")
    assert browser.browser_paths() == (sys.executable, None)


@pytest.fixture(scope="module")
def page(run: Path, photos: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The page of an index of a copy of the photos (the test deletes one), in one browser session."""
    missing = browser.browser_missing()
    if missing:
        no_browser(missing)
    folder = tmp_path_factory.mktemp("browsed")
    for server in served(index_of_copy(photos, run, folder)):
        driver = browser.chromium(1100, 900)
        try:
            yield browser.Page(driver, server.url), server, folder
        finally:
            driver.quit()


def _as_cli(hits: list[dict[str, Any]], folder: Path) -> list[dict[str, Any]]:
    """The grid's hits as ``vlp search --json`` lists them (the path from the name shown)."""
    return [
        {**{k: h[k] for k in ("rank", "row", "itc", "itm")}, "path": str(folder / "photos" / h["name"])} for h in hits
    ]


def test_the_page_in_chromium(page: tuple[Any, SearchServer, Path], capsys: pytest.CaptureFixture[str]) -> None:
    p, server, folder = page
    idx = folder / "idx"
    p.open()
    assert p.search(QUERY, top=5) == "done"
    shown = p.hits()
    assert _as_cli(shown, folder) == cli_hits(capsys, idx, QUERY, "--top", "5")
    assert p.driver.current_url == server.url + "?q=a+red+circle&top=5"
    assert p.text("status").startswith(f"5 hits for “{QUERY}”, of {len(GOOD)} images")

    assert p.open_hit(2) == "done"  # the Grad-CAM picture of the query over hit 2
    heat = p.driver.find_element("id", "heat")
    assert heat.is_displayed() and p.driver.execute_script("return arguments[0].naturalWidth", heat) > 400
    assert p.text("detail-title") == f"#2 {shown[1]['name']}"
    shot = folder / "serve_page.png"
    assert p.driver.save_screenshot(str(shot)) and shot.read_bytes().startswith(b"\x89PNG")

    assert p.search(QUERY, top=5, rerank=3) == "done"  # the ITM re-rank of the ITC top 3
    assert _as_cli(p.hits(), folder) == cli_hits(capsys, idx, QUERY, "--top", "5", "--rerank-itm", "3")
    assert "rerank=3" in p.driver.current_url

    assert p.more_like(3) == "done"  # by the image of hit 3
    row = p.hits()[0]["row"]
    like = cli_hits(capsys, idx, "--image", str(folder / "photos" / GOOD[row]), "--top", "5")
    assert _as_cli(p.hits(), folder) == like and p.driver.current_url.endswith(f"?like={row}&top=5")
    assert p.open_hit(1) == "image"  # no text query: the image, and why there is no heat map
    assert "search by text" in p.text("heat-msg")

    p.open("?q=a+red+circle&top=10")  # a shared address runs its search
    assert [h["row"] for h in p.hits()] == [h["row"] for h in cli_hits(capsys, idx, QUERY, "--top", "10")]
    assert p.back() == "done" and p.driver.current_url.endswith(f"?like={row}&top=5")  # "more like this" again

    assert p.search("  ", top=5) == "error"  # an empty query: the server's message on the page
    assert "the query is empty" in p.text("error") and not p.hits()

    (folder / "photos" / GOOD[4]).unlink()  # an image file gone since indexing: its tile says so
    assert p.search(QUERY, top=10) == "done"
    tile = p.driver.find_element("css selector", '#grid .hit[data-row="4"]')
    p.wait(lambda: tile.find_elements("css selector", ".missing"), "the missing image's message")
    assert "d/3.png (row 4 of the index) is missing" in tile.find_element("css selector", ".missing").text
    assert p.open_hit(int(tile.get_attribute("data-rank"))) == "error"
    assert "is missing" in p.text("heat-msg")

    assert all(url.startswith(server.url) or url.startswith("blob:" + server.url) for url in p.fetched())
    logs = [e for e in p.driver.get_log("browser") if e["level"] == "SEVERE" and "/image?row=4" not in e["message"]]
    assert not [e for e in logs if "/api/" not in e["message"]], logs


def test_the_browser_leaves_no_profile_in_tmp() -> None:
    """Each browser run left a Chromium profile folder in /tmp (one per run of the suite): the profile
    is a temporary folder of ours that ``quit()`` removes, and Chromium makes none of its own."""
    missing = browser.browser_missing()
    if missing:
        no_browser(missing)
    tmp = Path(tempfile.gettempdir())
    before = set(tmp.glob("org.chromium.Chromium.*"))
    driver = browser.chromium()
    profile = Path(driver.vlp_profile)
    assert profile.is_dir()
    driver.quit()
    assert not profile.exists()
    assert set(tmp.glob("org.chromium.Chromium.*")) == before

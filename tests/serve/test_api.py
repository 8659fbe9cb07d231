"""``vlp serve``'s HTTP API without a browser (vlp.serve): the hits are ``vlp search --json``'s, in
its order; the heat map is ``vlp explain``'s picture; only the index's images are served (no path
reaches another file); errors are one JSON line, never a traceback; the page's files are package
data; the command's own errors are one line, and Ctrl-C stops it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile
from importlib import resources
from pathlib import Path

import pytest

from tests.helpers import ROOT, dual_checkpoint
from tests.search.conftest import GOOD, index_argv
from tests.serve.conftest import cli_hits, get, get_json, index_of_copy, served
from vlp.cli import main
from vlp.errors import ConfigError
from vlp.serve import SearchServer, open_server, static_files

QUERY = "a red circle"
PAGE_FILES = {"index.html", "app.js", "style.css"}


def _api(hits: list[dict]) -> list[dict]:
    """The API's hits as ``vlp search --json`` has them (without the ``name`` the page shows)."""
    return [{k: v for k, v in h.items() if k != "name"} for h in hits]


@pytest.mark.parametrize("args", [("--top", "3"), ("--top", "50"), ("--top", "5", "--rerank-itm", "3")])
def test_a_search_answers_the_hits_of_vlp_search_in_its_order(
    server: SearchServer, index: Path, capsys: pytest.CaptureFixture[str], args: tuple[str, ...]
) -> None:
    top, rerank = args[1], args[3] if len(args) > 2 else "0"
    status, res = get_json(server, f"/api/search?q=a%20red%20circle&top={top}&rerank={rerank}")
    assert status == 200
    assert _api(res["hits"]) == cli_hits(capsys, index, QUERY, *args)
    assert [h["name"] for h in res["hits"]] == [GOOD[h["row"]] for h in res["hits"]]
    assert res["count"] == len(GOOD) and res["q"] == QUERY
    assert (res["hits"][0]["itm"] is not None) == (rerank != "0")


def test_more_like_this_answers_the_hits_of_vlp_search_image(
    server: SearchServer, index: Path, photos: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, res = get_json(server, "/api/similar?row=2&top=4")
    assert status == 200 and res["name"] == GOOD[2]
    assert _api(res["hits"]) == cli_hits(capsys, index, "--image", str(photos / GOOD[2]), "--top", "4")
    assert res["hits"][0]["row"] == 2


def test_the_heat_map_is_the_picture_of_vlp_explain(
    server: SearchServer, run: Path, photos: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, kind, png = get(server, "/api/heatmap?row=3&q=a%20red%20circle")
    assert status == 200 and kind == "image/png" and png.startswith(b"\x89PNG")
    assert (
        main(
            [
                "explain",
                "--checkpoint",
                str(run),
                "--image",
                str(photos / GOOD[3]),
                "--text",
                QUERY,
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    assert png == (tmp_path / "explain.png").read_bytes()
    assert get(server, "/api/heatmap?row=3&q=a%20red%20circle")[2] == png  # the second time from memory


def test_an_image_of_the_index_is_served_and_no_other_file(server: SearchServer, photos: Path) -> None:
    for row in (0, 2, 5):  # a PNG, a .JPG, a .jpeg
        status, kind, body = get(server, f"/image?row={row}")
        assert status == 200 and body == (photos / GOOD[row]).read_bytes()
        assert kind == ("image/png" if GOOD[row].endswith(".png") else "image/jpeg")
    secret = (ROOT / "pyproject.toml").read_bytes()
    for path in [
        "/image?path=/etc/passwd",
        "/image?row=../../pyproject.toml",
        "/image?row=-1",
        f"/image?row={len(GOOD)}",
        "/image?row=0&row=99",
        "/static/../../pyproject.toml",
        "/static/%2e%2e/%2e%2e/pyproject.toml",
        "/static/..%2f..%2fpyproject.toml",
        "/static/",
        "/../pyproject.toml",
        "/pyproject.toml",
        "/etc/passwd",
    ]:
        status, kind, body = get(server, path)
        assert status in (400, 404) and kind == "application/json", path
        assert body != secret and "error" in json.loads(body), path


@pytest.mark.parametrize(
    "path, status, says",
    [
        ("/api/search?q=", 400, "the query is empty"),
        ("/api/search?q=%20%20", 400, "the query is empty"),
        ("/api/search?top=5", 400, "the query is empty"),
        ("/api/search?q=x&top=0", 400, "top=0: expected an integer from 1 to 500"),
        ("/api/search?q=x&top=ten", 400, "top='ten': expected an integer"),
        ("/api/search?q=x&rerank=-2", 400, "rerank=-2"),
        ("/api/similar?top=3", 400, "row: missing"),
        ("/api/similar?row=7", 400, "row=7: expected an integer from 0 to 6"),
        ("/api/heatmap?row=1&q=", 400, "the query is empty"),
        ("/api/nothing", 404, "/api/nothing: no such page"),
    ],
)
def test_a_bad_request_is_one_json_line(server: SearchServer, path: str, status: int, says: str) -> None:
    got, res = get_json(server, path)
    assert got == status and says in res["error"] and "Traceback" not in res["error"]
    assert set(res) == {"error"} and "\n" not in res["error"]


def test_another_host_name_is_refused_on_loopback(server: SearchServer) -> None:
    status, _, body = get(server, "/api/info", host="evil.example:80")
    assert status == 403 and "loopback" in json.loads(body)["error"]
    assert get(server, "/api/info", host="localhost")[0] == 200


def test_the_page_and_info(server: SearchServer, index: Path, run: Path) -> None:
    status, kind, html = get(server, "/")
    assert status == 200 and kind.startswith("text/html") and b'src="/static/app.js"' in html
    for name in ("app.js", "style.css"):
        assert get(server, f"/static/{name}")[0] == 200
    with urllib.request.urlopen(server.url, timeout=60) as r:  # the page may load nothing from elsewhere
        assert r.headers["Content-Security-Policy"].startswith("default-src 'none'; script-src 'self';")
    status, info = get_json(server, "/api/info")
    assert info["count"] == len(GOOD) and info["index"] == str(index) and info["heatmap"] is True
    assert info["checkpoint"] == str(run / "checkpoints" / "step_0000002")


def test_the_page_files_are_package_data_and_fetch_nothing_from_outside() -> None:
    folder = resources.files("vlp.serve").joinpath("static")
    assert {f.name for f in folder.iterdir()} >= PAGE_FILES
    assert set(static_files()) == PAGE_FILES
    for name, (body, _) in static_files().items():
        text = body.decode()
        assert "http://" not in text and "https://" not in text and "//cdn" not in text, name


def test_the_wheel_holds_the_page_files(tmp_path: Path) -> None:
    """``pip wheel`` of a copy of the checkout (no build isolation: setuptools of this environment)."""
    try:
        import setuptools  # noqa: F401
        import wheel  # noqa: F401
    except ImportError as e:
        pytest.skip(f"no offline wheel build here: {e}")
    src = tmp_path / "src"
    shutil.copytree(ROOT / "vlp", src / "vlp", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        (src / name).write_bytes((ROOT / name).read_bytes())
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "--no-index",
        "-q",
        "-w",
        str(tmp_path),
        str(src),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    (whl,) = tmp_path.glob("vlp-*.whl")
    names = set(zipfile.ZipFile(whl).namelist())
    assert {f"vlp/serve/static/{n}" for n in PAGE_FILES} <= names


def test_a_missing_image_file_is_a_message(run: Path, photos: Path, tmp_path: Path) -> None:
    idx = index_of_copy(photos, run, tmp_path)
    (tmp_path / "photos" / GOOD[4]).unlink()
    for server in served(idx):
        for path in ("/image?row=4", "/api/similar?row=4", "/api/heatmap?row=4&q=x"):
            status, res = get_json(server, path)
            assert status == 404 and "d/3.png (row 4 of the index) is missing" in res["error"], path
        status, res = get_json(server, "/api/search?q=x&top=7")
        assert status == 200 and 4 in [h["row"] for h in res["hits"]]  # the search still lists it


def test_an_unknown_index_or_a_busy_port_is_one_line(
    tmp_path: Path, index: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", str(tmp_path / "nope"), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vlp: error: ") and "nope" in err and err.count("\n") == 1
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", str(index), "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"vlp: error: --host 127.0.0.1 --port {port}: cannot listen there") and err.count("\n") == 1


def test_a_fusion_layer_the_model_lacks_is_refused(index: Path) -> None:
    with pytest.raises(ConfigError, match="--layer 5"):
        open_server(index, device="cpu", port=0, layer=5)


def _as_a_terminal_starts_it() -> None:
    """Ctrl-C's default disposition in the child, as a terminal gives it: a suite started in the
    background by a non-interactive shell inherits SIGINT ignored (CI failed on that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_vlp_serve_prints_its_address_and_stops_on_ctrl_c_or_sigterm(index: Path, sig: signal.Signals) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "vlp", "serve", str(index), "--port", "0", "--device", "cpu"]
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_as_a_terminal_starts_it,
    )
    try:
        line = proc.stdout.readline()  # the model loads first
        assert line.startswith(f"serving {index} ({len(GOOD)} images) at http://127.0.0.1:"), line + proc.stderr.read()
        url = line.split(" at ")[1].split()[0]
        with urllib.request.urlopen(url + "api/info", timeout=60) as r:
            assert json.loads(r.read())["count"] == len(GOOD)
        time.sleep(0.2)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "vlp serve: stopped" in out


def test_a_model_without_fusion_encoder_serves_searches_and_says_why_no_heat_map(photos: Path, tmp_path: Path) -> None:
    dual = dual_checkpoint(tmp_path / "dual").parent.parent
    assert main(index_argv(photos, dual, tmp_path / "idx")) == 0
    for server in served(tmp_path / "idx"):
        status, info = get_json(server, "/api/info")
        assert info["heatmap"] is False and "no Grad-CAM heat maps with this checkpoint" in info["heatmap_note"]
        status, res = get_json(server, "/api/heatmap?row=0&q=a%20red%20circle")
        assert status == 400 and res["error"] == info["heatmap_note"] and "model.arch=dual" in res["error"]
        status, res = get_json(server, "/api/search?q=a%20red%20circle&rerank=2")
        assert status == 400 and "needs the ITM head" in res["error"]
        assert get_json(server, "/api/search?q=a%20red%20circle&top=3")[0] == 200


def test_a_fault_of_vlp_is_a_500_line_and_its_traceback_stays_in_the_log(
    server: SearchServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(params: dict) -> dict:
        raise RuntimeError("boom")

    monkeypatch.setattr(server.app, "search", broken)
    status, res = get_json(server, "/api/search?q=x")
    assert status == 500 and res == {"error": "internal error (RuntimeError: boom); the server's log has the details"}
    assert any(r.exc_info and "boom" in str(r.exc_info[1]) for r in caplog.records)

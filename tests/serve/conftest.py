"""The serve tests' fixtures: the search tests' tiny run and photo folder (tests/search/conftest.py),
an index of them, and that index served on a free port of 127.0.0.1 in a thread of the test process;
:func:`get` for a request and :func:`cli_hits` for what ``vlp search --json`` prints."""

from __future__ import annotations

import json
import shutil
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest

from tests.search.conftest import index, index_argv, photos, run  # noqa: F401 (fixtures of this package too)
from vlp.cli import main
from vlp.serve import SearchServer, open_server


def get(server: SearchServer, path: str, host: Optional[str] = None) -> tuple[int, str, bytes]:
    """GET ``path`` of ``server``: (status, content type, body), an error status as any other
    (``host``: another ``Host`` header)."""
    req = urllib.request.Request(server.url + path.lstrip("/"), headers={"Host": host} if host else {})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read()


def get_json(server: SearchServer, path: str) -> tuple[int, Any]:
    """GET ``path``: (status, the JSON body)."""
    status, kind, body = get(server, path)
    assert kind == "application/json", (path, status, kind, body[:200])
    return status, json.loads(body)


def cli_hits(capsys: pytest.CaptureFixture[str], folder: Path, *args: str) -> list[dict[str, Any]]:
    """The hits ``vlp search FOLDER ARGS --json --device cpu`` prints."""
    capsys.readouterr()
    assert main(["search", str(folder), *args, "--json", "--device", "cpu"]) == 0
    return json.loads(capsys.readouterr().out)


def served(folder: Path) -> Iterator[SearchServer]:
    """The index ``folder`` served on a free port of 127.0.0.1 (CPU) in a thread until the generator closes."""
    server = open_server(folder, device="cpu", port=0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def index_of_copy(images: Path, checkpoint: Path, folder: Path) -> Path:
    """An index (with ``checkpoint``) of a copy of the folder ``images`` in ``folder / "photos"`` (files a
    test may delete): the index folder ``folder / "idx"``."""
    shutil.copytree(images, folder / "photos")
    assert main(index_argv(folder / "photos", checkpoint, folder / "idx")) == 0
    return folder / "idx"


@pytest.fixture(scope="package")
def server(index: Path) -> Iterator[SearchServer]:  # noqa: F811
    """The package's index, served."""
    yield from served(index)

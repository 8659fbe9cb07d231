"""The model zoo: tag -> download (from an http.server on 127.0.0.1, or a file:// mirror) -> convert ->
verify -> reuse, and its failures (checksum, unreachable URL, interrupted conversion, unknown tag; an
HTML page or a cut-off body served with status 200, a stalled or trickling server, two fetches into
one cache at once); a download cut off, stopped or killed continues from the byte it reached."""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import os
import pickle
import re
import shlex
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
import zipfile
from dataclasses import replace
from pathlib import Path
from typing import Callable

import pytest
import torch

from tests.albef_fakes import IMG, albef_state, stride0_bomb
from vlp import VLPModel, list_pretrained
from vlp.checkpoint import load_model
from vlp.cli import main
from vlp.errors import CheckpointError, ConfigError, DownloadError
from vlp.interop import zoo
from vlp.interop.albef import convert_albef_file

TAG, FILE = "albef-4m", "ALBEF_4M.pth"
CPU = torch.device("cpu")
REPO = Path(__file__).resolve().parents[2]
HTML = b"<!DOCTYPE html>\n<html><head><title>Sign in</title></head><body>Please sign in</body></html>\n"
#: path -> what the served handler does instead of serving the file (set by a test, cleared by ``cache``)
ROUTES: dict[str, Callable[[http.server.BaseHTTPRequestHandler], None]] = {}


def _reply(handler: http.server.BaseHTTPRequestHandler, body: bytes, length: bool = True) -> None:
    """Status 200 with ``body``; without ``length`` no Content-Length: the body ends when the connection closes."""
    handler.send_response(200)
    handler.send_header("Content-Type", "text/html" if body.startswith(b"<") else "application/octet-stream")
    if length:
        handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A fake official ``ALBEF_4M.pth`` served over HTTP on 127.0.0.1: (folder, base URL, requested paths)."""
    root = tmp_path_factory.mktemp("served")
    torch.save({"model": albef_state("pretrain", seed=5), "optimizer": {}, "epoch": 29}, root / FILE)
    requests: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(root), **kwargs)

        def do_GET(self):
            requests.append(self.path)
            if (route := ROUTES.get(self.path)) is not None:
                route(self)
            else:
                super().do_GET()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield root, f"http://127.0.0.1:{server.server_port}", requests
    server.shutdown()
    server.server_close()


@pytest.fixture
def cache(tmp_path, monkeypatch, served):
    """``$VLP_CACHE`` in tmp_path, ``albef-4m`` pointed at the local server, the request log emptied,
    the retrying reader's backoff short."""
    _, base, requests = served
    requests.clear()
    ROUTES.clear()
    monkeypatch.setattr("vlp.remote.shard_urls.BACKOFF_S", 0.01)
    for name in (zoo.MIRROR_ENV, "VLP_ZOO_TIMEOUT_S", "VLP_ZOO_DEADLINE_S"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(zoo.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv(zoo.url_env(TAG), f"{base}/{FILE}")
    yield tmp_path / "cache"
    ROUTES.clear()


def test_table_and_url_overrides(monkeypatch):
    pairs = list_pretrained()  # open_clip's (architecture, tag) pairs
    tags = [tag for _, tag in pairs]
    assert tags[:2] == ["albef-14m", "albef-4m"] and "albef-grounding-refcoco" in tags and len(tags) == 7
    assert {arch for arch, _ in pairs} == {"albef-base"} and tags == zoo.pretrained_tags()
    for e in zoo.PRETRAINED.values():
        assert e.url == zoo.OFFICIAL + e.filename and e.sha256 is None and e.image_size in (256, 384)
    assert zoo.PRETRAINED["albef-grounding-refcoco"].kind == "retrieval"  # Grounding.py trains the retrieval model
    with pytest.raises(ConfigError, match="kind 'grounding', expected one of"):
        zoo.Pretrained("x", "http://x/x.pth", "grounding", 384, "a layout the converter does not read")
    assert zoo.PRETRAINED["albef-retrieval-coco"].kind == "retrieval" and zoo.PRETRAINED["albef-vqa"].kind == "vqa"
    assert zoo.url_env("albef-14m") == "VLP_ZOO_URL_ALBEF_14M"
    e = zoo.pretrained_entry("albef-14m")
    monkeypatch.delenv(zoo.MIRROR_ENV, raising=False)
    monkeypatch.delenv(zoo.url_env(e.tag), raising=False)
    assert zoo.source_url(e) == "https://storage.googleapis.com/sfr-pcl-data-research/ALBEF/ALBEF.pth"
    monkeypatch.setenv(zoo.MIRROR_ENV, "http://mirror.local/albef/")
    assert zoo.source_url(e) == "http://mirror.local/albef/ALBEF.pth"
    monkeypatch.setenv(zoo.url_env(e.tag), "file:///data/ALBEF.pth")  # one tag's URL wins over the mirror
    assert zoo.source_url(e) == "file:///data/ALBEF.pth"
    monkeypatch.setenv(zoo.CACHE_ENV, "/somewhere/cache")
    assert zoo.cache_dir() == Path("/somewhere/cache")


def test_download_convert_load_then_reuse(cache, served, tmp_path):
    root, _, requests = served
    m = VLPModel.from_pretrained(TAG, device="cpu")
    assert requests == [f"/{FILE}"] and m.kind == "pretrain"
    out = cache / "converted" / TAG
    assert sorted(p.name for p in (cache / "converted").iterdir()) == [TAG]  # no staging folder left
    assert (out / "key_report.json").is_file() and (cache / "downloads" / FILE).is_file()
    assert not (cache / "downloads" / f"{FILE}.part").exists()
    assert json.loads((out / "state.json").read_text())["converted_from"] == str(cache / "downloads" / FILE)
    convert_albef_file(root / FILE, tmp_path / "by_hand", kind="pretrain")
    by_hand = load_model(tmp_path / "by_hand", CPU)[0].state_dict()
    zoo_state = m.model.state_dict()
    assert zoo_state.keys() == by_hand.keys()
    assert all(torch.equal(zoo_state[k], by_hand[k]) for k in by_hand)
    assert m.model_config.vision.img_size == IMG
    again = VLPModel.from_pretrained(TAG, device="cpu")
    assert requests == [f"/{FILE}"]  # reused: the server was not asked again
    assert torch.equal(again.model.state_dict()["vision.pos_embed"], by_hand["vision.pos_embed"])


def test_corrupted_converted_folder_is_converted_again(cache, served, caplog):
    _, _, requests = served
    out = zoo.fetch(TAG, progress=False)
    with open(out / "model.safetensors", "r+b") as f:  # flip a byte: same size, wrong SHA-256
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert zoo.fetch(TAG, progress=True) == out
    assert any("does not match its SHA-256" in r.getMessage() and r.levelname == "WARNING" for r in caplog.records)
    assert requests == [f"/{FILE}"]  # the download was reused, only the conversion redone
    zoo.find_checkpoint(out, zoo.REQUIRED)


@pytest.mark.parametrize("wrong", [{"sha256": "0" * 64}, {"size": 123}])
def test_wrong_checksum_or_size_is_refused_and_removed(cache, served, monkeypatch, wrong):
    root, base, requests = served
    good = replace(zoo.PRETRAINED[TAG], tag="test-zoo", sha256=hashlib.sha256((root / FILE).read_bytes()).hexdigest())
    monkeypatch.setenv(zoo.url_env("test-zoo"), f"{base}/{FILE}")
    monkeypatch.setitem(zoo.PRETRAINED, "test-zoo", replace(good, **wrong))
    with pytest.raises(
        DownloadError, match="refused and removed: " + ("SHA-256" if "sha256" in wrong else r"\d+ bytes, expected 123")
    ):
        zoo.fetch("test-zoo", progress=False)
    assert not (cache / "downloads").exists() and not (cache / "converted").exists()
    monkeypatch.setitem(zoo.PRETRAINED, "test-zoo", replace(good, size=(root / FILE).stat().st_size))
    assert zoo.fetch("test-zoo", progress=False) == cache / "converted" / "test-zoo"  # the right ones pass
    assert requests == [f"/{FILE}"] * 2


def test_unreachable_url_gives_one_error_with_the_manual_commands(cache, served, monkeypatch):
    root, _, _ = served
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/{FILE}"
    monkeypatch.setenv(zoo.url_env(TAG), url)
    with pytest.raises(DownloadError) as err:
        VLPModel.from_pretrained(TAG, device="cpu")
    msg, dest = str(err.value), cache / "downloads" / FILE
    assert url in msg and str(dest) in msg and f"curl -L --create-dirs -o {dest} {url}" in msg
    assert not dest.parent.exists()  # no .part left, nor the empty downloads/ made for it
    # the manual steps of the message work, and the zoo then reuses their result without the network
    dest.parent.mkdir()  # what curl --create-dirs does
    shutil.copy(root / FILE, dest)
    command = re.search(r"`(vlp convert albef [^`]+)`", msg)
    assert command is not None and command.group(1).endswith("--kind pretrain")
    assert main(shlex.split(command.group(1))[1:]) == 0
    assert VLPModel.from_pretrained(TAG, device="cpu").kind == "pretrain"


def test_interrupted_conversion_leaves_nothing_reused(cache, served, monkeypatch):
    """The download converted; writing its folder is interrupted: no folder is kept, the download is
    (it converted), and the next fetch converts it again without asking the server."""
    _, _, requests = served
    real = zoo.save_converted

    def killed(converted, out_dir):
        real(converted, out_dir)  # the folder is complete, then the process "dies" before the rename
        raise KeyboardInterrupt

    monkeypatch.setattr(zoo, "save_converted", killed)
    with pytest.raises(KeyboardInterrupt):
        zoo.fetch(TAG, progress=False)
    assert list((cache / "converted").iterdir()) == []
    assert sorted(p.name for p in (cache / "downloads").iterdir()) == [FILE]
    monkeypatch.setattr(zoo, "save_converted", real)
    out = zoo.fetch(TAG, progress=False)
    assert (out / "key_report.json").is_file() and requests == [f"/{FILE}"]


def test_file_mirror(cache, served, monkeypatch):
    root, _, requests = served
    monkeypatch.delenv(zoo.url_env(TAG))
    monkeypatch.setenv(zoo.MIRROR_ENV, root.as_uri())
    assert zoo.fetch(TAG, progress=False) == cache / "converted" / TAG and requests == []


def test_unknown_tag(cache, served):
    _, _, requests = served
    with pytest.raises(CheckpointError, match=r"albef-nope: no such file or folder.*known: albef-14m, albef-4m"):
        VLPModel.from_pretrained("albef-nope")
    with pytest.raises(CheckpointError, match="unknown pretrained model 'albef-nope'"):
        zoo.fetch("albef-nope")
    assert requests == [] and not cache.exists()


def test_cli_zoo_list_and_fetch(cache, served, capsys):
    from vlp.cli import main

    assert main(["zoo", "list"]) == 0
    listed = capsys.readouterr().out
    assert all(tag in listed for _, tag in list_pretrained()) and "the retrieval layout" in listed
    assert main(["zoo", "fetch", TAG, "--cache", str(cache)]) == 0
    folder = Path(capsys.readouterr().out.strip().splitlines()[-1])
    assert folder == cache / "converted" / TAG and (folder / "key_report.json").is_file()
    assert main(["zoo", "fetch", "no-such-tag"]) == 2
    assert "albef-4m" in capsys.readouterr().err  # the error lists the known tags


# ----------------------------------------------------------------------------- a bad file is never kept


def _checkpoints(root: Path) -> dict[str, bytes]:
    """Files the download check must pass (True) or refuse (the message it must give)."""
    good = (root / FILE).read_bytes()
    legacy, legacy4 = io.BytesIO(), io.BytesIO()
    torch.save({"model": {"w": torch.ones(3)}}, legacy, _use_new_zipfile_serialization=False)
    torch.save({"model": {"w": torch.ones(3)}}, legacy4, _use_new_zipfile_serialization=False, pickle_protocol=4)
    magic = torch.serialization.MAGIC_NUMBER
    flipped = bytearray(good)  # one byte of the largest tensor flipped: same size, the CRC-32 fails
    with zipfile.ZipFile(io.BytesIO(good)) as z:
        info = max(z.infolist(), key=lambda i: i.file_size)
    name_len, extra_len = struct.unpack("<HH", flipped[info.header_offset + 26 : info.header_offset + 30])
    flipped[info.header_offset + 30 + name_len + extra_len + info.file_size // 2] ^= 0xFF
    other_zip = io.BytesIO()
    with zipfile.ZipFile(other_zip, "w") as z:
        z.writestr("notes/readme.txt", "not a checkpoint")
    return {
        "zip": good,
        "legacy": legacy.getvalue(),
        "legacy4": legacy4.getvalue(),  # pickle protocol 4: a FRAME opcode before the magic number
        "not a PyTorch checkpoint \\(starts with '<!DOCTYPE html": HTML,
        "empty file": b"",
        "truncated zip": good[: len(good) // 2],
        "damaged zip: .*data/\\d+ fails its CRC-32": bytes(flipped),
        "not a torch.save archive \\(no <folder>/data.pkl": other_zip.getvalue(),
        "a pickle but not a legacy torch.save file \\(another pickle": pickle.dumps({"model": {}}, protocol=2),
        "a pickle but not a legacy torch.save file \\(magic number 0x3039": pickle.dumps(12345, protocol=2),
        "protocol version 1000, expected 1001": pickle.dumps(magic, protocol=2) + pickle.dumps(1000, protocol=2),
    }


def test_download_check_reads_the_container_without_unpickling(served, tmp_path, monkeypatch):
    root, _, _ = served
    cases = _checkpoints(root)

    def never(*args, **kwargs):
        raise AssertionError("the download check unpickled the file")

    for module, name in ((torch, "load"), (pickle, "load"), (pickle, "loads"), (pickle, "Unpickler")):
        monkeypatch.setattr(module, name, never)
    entry = zoo.PRETRAINED[TAG]  # no size, no SHA-256 published
    for expected, body in cases.items():
        path = tmp_path / "file.pth"
        path.write_bytes(body)
        problem = zoo._problem(entry, path)
        if expected in ("zip", "legacy", "legacy4"):
            assert problem is None, (expected, problem)
        else:
            assert problem is not None and re.search(expected, problem), (expected, problem)


@pytest.mark.parametrize("body", ["html", "cut"])
def test_bad_body_is_refused_removed_and_asked_for_again(cache, served, body):
    """An HTML page with status 200, or half the zip with no Content-Length (the connection closed)."""
    root, base, requests = served
    good = (root / FILE).read_bytes()
    if body == "html":
        ROUTES[f"/{FILE}"] = lambda h: _reply(h, HTML)
    else:
        ROUTES[f"/{FILE}"] = lambda h: _reply(h, good[: len(good) * 2 // 3], length=False)
    dest = cache / "downloads" / FILE
    with pytest.raises(DownloadError) as err:
        zoo.fetch(TAG, progress=False)
    msg = str(err.value)
    expected = "not a PyTorch checkpoint (starts with '<!DOCTYPE html" if body == "html" else "truncated zip"
    assert expected in msg and TAG in msg and f"{base}/{FILE}" in msg and str(dest) in msg, msg
    assert not dest.exists() and not dest.with_name(FILE + ".part").exists()
    assert not (cache / "converted" / TAG).exists()
    ROUTES.clear()  # the server serves the real file now: the next fetch asks again and keeps it
    out = zoo.fetch(TAG, progress=False)
    assert out == cache / "converted" / TAG and dest.read_bytes() == good
    assert requests == [f"/{FILE}"] * 2


class _System:
    """Unpickling this runs ``os.system(command)`` (pickled as a call of ``posix.system``)."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def _torch_zip(pickled: bytes) -> bytes:
    """A zip laid out like a ``torch.save`` archive whose ``data.pkl`` is ``pickled``."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        z.writestr("archive/data.pkl", pickled)
        z.writestr("archive/byteorder", "little")
        z.writestr("archive/version", "3\n")
    return out.getvalue()


def _saved(obj: object, **kwargs) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf, **kwargs)
    return buf.getvalue()


def _unconvertible(marker: Path) -> dict[str, tuple[bytes, str]]:
    """Files that pass the download's container check but do not convert: name -> (body, a regex of
    what the error says about it). ``marker``: the file the ``posix.system`` pickle would create."""
    legacy = _saved({"model": albef_state("pretrain", seed=5)}, _use_new_zipfile_serialization=False)
    bomb = albef_state("pretrain", seed=5)
    stride0_bomb(bomb)  # image_queue [16, 10**10]: 640 GB once transposed
    return {
        "cut legacy": (legacy[: len(legacy) * 2 // 3], "not a readable PyTorch weights file"),
        "system zip": (_torch_zip(pickle.dumps(_System(f"touch {marker}"), protocol=2)), "refused"),
        "garbage zip": (_torch_zip(b"\x80\x02" + bytes(range(256)) * 8), "not a readable PyTorch weights file"),
        "not albef": (_saved({"model": {"w": torch.ones(3)}}), "not an ALBEF checkpoint"),
        "stride-0 bomb": (_saved({"model": bomb}), r"image_queue.*\(16, 10000000000\).*640000000000 bytes"),
    }


@pytest.mark.parametrize("attack", ["cut legacy", "system zip", "garbage zip", "not albef", "stride-0 bomb"])
def test_a_download_that_does_not_convert_is_removed_and_asked_for_again(cache, served, capsys, tmp_path, attack):
    """A file that passes the container check (a cut legacy file has a good header, a zip its CRCs)
    and then fails to read or convert: one error line naming the URL, nothing kept under
    downloads/, and the next fetch asks the server again."""
    _, base, requests = served
    marker = tmp_path / "pwned"
    body, expected = _unconvertible(marker)[attack]
    (tmp_path / "body").write_bytes(body)
    assert zoo._problem(zoo.PRETRAINED[TAG], tmp_path / "body") is None  # it gets past the container check
    ROUTES[f"/{FILE}"] = lambda h: _reply(h, body, length=attack != "cut legacy")
    assert main(["zoo", "fetch", TAG]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "vlp: error: " in line]
    assert len(errors) == 1 and "Traceback" not in err, err
    assert f"{base}/{FILE}" in errors[0] and re.search(expected, errors[0]), errors[0]
    assert not marker.exists()
    assert not (cache / "downloads").exists() or list((cache / "downloads").iterdir()) == []
    assert not (cache / "converted" / TAG).exists()
    ROUTES.clear()  # the server serves the real file now
    assert main(["zoo", "fetch", TAG]) == 0
    assert requests == [f"/{FILE}"] * 2
    assert sorted(p.name for p in (cache / "downloads").iterdir()) == [FILE]


@pytest.mark.parametrize("attack", ["not albef", "stride-0 bomb"])
def test_a_cached_download_that_does_not_convert_is_removed_and_downloaded_again(cache, served, caplog, attack):
    """What an older vlp kept: a file that passes the container check but does not convert. It is
    named on stderr, removed, and downloaded again."""
    root, _, requests = served
    dest = cache / "downloads" / FILE
    dest.parent.mkdir(parents=True)
    dest.write_bytes(_unconvertible(cache / "pwned")[attack][0])
    assert zoo.fetch(TAG, progress=False) == cache / "converted" / TAG and requests == [f"/{FILE}"]
    assert dest.read_bytes() == (root / FILE).read_bytes()
    err = caplog.text
    assert f"warning: {dest}" in err and "does not convert" in err and "downloading again" in err, err


def test_bad_file_already_in_the_cache_is_removed_and_downloaded_again(cache, served, caplog):
    """What an older vlp kept: an HTML page as the download. It is not reused."""
    root, _, requests = served
    dest = cache / "downloads" / FILE
    dest.parent.mkdir(parents=True)
    dest.write_bytes(HTML)
    out = zoo.fetch(TAG, progress=False)
    assert out == cache / "converted" / TAG and requests == [f"/{FILE}"]
    assert dest.read_bytes() == (root / FILE).read_bytes()
    err = caplog.text
    assert str(dest) in err and "not a PyTorch checkpoint" in err and "downloading again" in err


@pytest.mark.parametrize("server", ["trickle", "stall"])
def test_slow_server_gives_up_within_the_deadline_or_read_timeout(cache, served, monkeypatch, server):
    """trickle: 16 bytes every 0.2 s (each read succeeds), ended by the whole-download deadline;
    stall: 100 bytes then nothing, each try ended by the per-read timeout (here 2 tries: one retry,
    which the server, ignoring ``Range:``, answers with the file from its start again). Either
    server stops after 8 s. What arrived is kept in the ``.part`` for the next fetch to continue."""
    root, base, requests = served
    stop = threading.Event()

    def slow(h):
        h.send_response(200)
        h.send_header("Content-Length", str(10**8))
        h.end_headers()
        end = time.monotonic() + 8.0
        try:
            h.wfile.write(b"PK\x03\x04" + b"x" * 96)
            while not stop.wait(0.2 if server == "trickle" else 8.0) and time.monotonic() < end:
                if server == "trickle":
                    h.wfile.write(b"x" * 16)
        except OSError:  # the client gave up
            pass

    ROUTES[f"/{FILE}"] = slow
    monkeypatch.setenv("VLP_ZOO_DEADLINE_S", "1" if server == "trickle" else "600")
    monkeypatch.setenv("VLP_ZOO_TIMEOUT_S", "5" if server == "trickle" else "0.5")
    monkeypatch.setattr("vlp.remote.shard_urls.RETRIES", 1)
    start = time.monotonic()
    try:
        with pytest.raises(DownloadError) as err:
            zoo.fetch(TAG, progress=False)
        elapsed = time.monotonic() - start
    finally:
        stop.set()
    msg, part = str(err.value), cache / "downloads" / f"{FILE}.part"
    expected = (
        "deadline of 1 s (VLP_ZOO_DEADLINE_S)"
        if server == "trickle"
        else "no byte for 0.5 s (after 2 tries); 100 bytes received of 100000000; VLP_ZOO_TIMEOUT_S=0.5 s a read"
    )
    assert expected in msg and f"{base}/{FILE}" in msg and str(cache / "downloads" / FILE) in msg, msg
    assert elapsed < 3.0, elapsed
    assert f"kept in {part} for the next fetch to continue" in msg and part.stat().st_size >= 100
    assert requests == [f"/{FILE}"] * (1 if server == "trickle" else 2)


@pytest.mark.parametrize(
    "name, value",
    [
        ("VLP_ZOO_DEADLINE_S", "soon"),
        ("VLP_ZOO_TIMEOUT_S", "0"),
        ("VLP_ZOO_DEADLINE_S", "-3"),
        ("VLP_ZOO_TIMEOUT_S", "nan"),
        ("VLP_ZOO_DEADLINE_S", "inf"),
    ],
)
def test_time_limit_variables_are_checked(cache, served, monkeypatch, name, value):
    _, _, requests = served
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=f"{name}={value}: expected a positive number of seconds"):
        zoo.fetch(TAG, progress=False)
    assert requests == []


def _wait_for(condition: Callable[[], bool], what: str, limit: float = 60.0) -> None:
    end = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < end, f"waited {limit:g} s for {what}"
        time.sleep(0.05)


def test_two_processes_fetching_into_one_cache_wait_for_each_other(cache, served, tmp_path):
    """This process (a, in a thread) downloads while the server holds the second half of the file
    back; another process (b), started meanwhile, waits for a's lock instead of downloading too,
    then reuses a's converted folder. (a runs here: a fresh process would spend ~10 s importing
    what the conversion needs.)"""
    root, _, requests = served
    good = (root / FILE).read_bytes()
    release = threading.Event()

    def held(h):
        h.send_response(200)
        h.send_header("Content-Length", str(len(good)))
        h.end_headers()
        h.wfile.write(good[: len(good) // 2])
        release.wait(60)
        h.wfile.write(good[len(good) // 2 :])

    ROUTES[f"/{FILE}"] = held
    got: dict[str, object] = {}

    def fetch_a() -> None:
        try:
            got["a"] = zoo.fetch(TAG, progress=False)
        except BaseException as e:  # reported by the assert below
            got["a"] = e

    a = threading.Thread(target=fetch_a)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    b_err, b_out = tmp_path / "b.err", tmp_path / "b.out"
    b = None
    try:
        a.start()
        _wait_for(lambda: len(requests) == 1 or not a.is_alive(), "a's request")
        with open(b_err, "w") as err, open(b_out, "w") as out:
            code = f"from vlp.interop import zoo; print(zoo.fetch({TAG!r}))"  # progress=True: says it waits
            b = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=out, stderr=err, cwd=REPO)
        _wait_for(lambda: b.poll() is not None or "waiting for" in b_err.read_text() or len(requests) > 1, "b to wait")
    finally:
        release.set()
        a.join(60)
        b_code = b.wait(120) if b is not None else None
    out = cache / "converted" / TAG
    assert got == {"a": out} and b_code == 0, (got, b_err.read_text())
    assert requests == [f"/{FILE}"], b_err.read_text()  # b did not download again
    assert f"{TAG}: waiting for another fetch into {cache}" in b_err.read_text()
    assert b_out.read_text().split() == [str(out)]
    assert sorted(p.name for p in (cache / "downloads").iterdir()) == [FILE]
    assert sorted(p.name for p in (cache / "converted").iterdir()) == [TAG]
    zoo.find_checkpoint(out, zoo.REQUIRED)


# ----------------------------------------------------------------------------- a download continues


def _ranged(body: bytes, seen: list, cut_at: int = 0, honour: bool = True, shift: int = 0) -> Callable:
    """A route serving ``body`` that records each request's ``Range`` header (None: none) in ``seen``:
    ``honour``: a 206 from the byte asked for (``shift`` bytes later, labelled as such: an answer
    for other bytes), a 416 past the end; else the whole file (200). ``cut_at`` > 0: the first
    answer's body stops at that byte of the file and the connection closes."""
    cuts = [cut_at] if cut_at else []

    def route(h: http.server.BaseHTTPRequestHandler) -> None:
        rng = h.headers.get("Range")
        seen.append(rng)
        start = int(rng[len("bytes=") :].rstrip("-")) + shift if rng and honour else 0
        if start >= len(body) and rng and honour:
            h.send_response(416)
            h.send_header("Content-Range", f"bytes */{len(body)}")
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        h.send_response(206 if rng and honour else 200)
        h.send_header("Content-Length", str(len(body) - start))
        if rng and honour:
            h.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        h.end_headers()
        try:
            h.wfile.write(body[start : cuts.pop() if cuts else len(body)])
            h.wfile.flush()
        except OSError:  # the client refused the answer and closed the connection
            pass
        h.close_connection = True

    return route


def test_a_body_cut_mid_way_is_continued_from_the_byte_it_reached(cache, served):
    root, _, requests = served
    good, seen = (root / FILE).read_bytes(), []
    ROUTES[f"/{FILE}"] = _ranged(good, seen, cut_at=len(good) // 3)
    out = zoo.fetch(TAG, progress=False)
    assert seen == [None, f"bytes={len(good) // 3}-"] and requests == [f"/{FILE}"] * 2
    assert (cache / "downloads" / FILE).read_bytes() == good and (out / "key_report.json").is_file()


def _fetch_in_child() -> None:
    zoo.fetch(TAG, progress=False)


def test_a_killed_fetch_is_continued_by_the_next_from_its_part_file(cache, served):
    """A fetch (a forked process) killed with SIGKILL while the server holds the second half of the
    file back: the next fetch asks for the rest from the size of the ``.part`` it left."""
    import multiprocessing
    import signal

    root, _, requests = served
    good, seen, release = (root / FILE).read_bytes(), [], threading.Event()
    half = len(good) // 2

    def held(h):
        seen.append(h.headers.get("Range"))
        h.send_response(200)
        h.send_header("Content-Length", str(len(good)))
        h.end_headers()
        h.wfile.write(good[:half])
        h.wfile.flush()
        release.wait(60)

    ROUTES[f"/{FILE}"] = held
    part = cache / "downloads" / f"{FILE}.part"
    child = multiprocessing.get_context("fork").Process(target=_fetch_in_child)
    child.start()
    try:
        _wait_for(lambda: part.is_file() and part.stat().st_size == half or not child.is_alive(), "the first half")
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.join(30)
        release.set()
    assert child.exitcode == -signal.SIGKILL and part.stat().st_size == half
    ROUTES[f"/{FILE}"] = _ranged(good, seen)
    assert zoo.fetch(TAG, progress=False) == cache / "converted" / TAG
    assert seen == [None, f"bytes={half}-"] and requests == [f"/{FILE}"] * 2
    assert (cache / "downloads" / FILE).read_bytes() == good and not part.exists()


def test_an_interrupted_fetch_keeps_its_part_file_for_the_next(cache, served, monkeypatch):
    """Ctrl-C after the first bytes were written: the ``.part`` keeps them, the next fetch asks for the rest."""
    from vlp.interop import download

    root, _, _ = served
    good, seen, real = (root / FILE).read_bytes(), [], download.progress_bar

    def interrupted_bar(*args, **kwargs):
        bar = real(*args, **kwargs)
        bar.update = lambda n: (_ for _ in ()).throw(KeyboardInterrupt)  # after the first write
        return bar

    ROUTES[f"/{FILE}"] = _ranged(good, seen)
    monkeypatch.setattr(download, "progress_bar", interrupted_bar)
    with pytest.raises(KeyboardInterrupt):
        zoo.fetch(TAG, progress=False)
    kept = (cache / "downloads" / f"{FILE}.part").stat().st_size
    monkeypatch.setattr(download, "progress_bar", real)
    assert 0 < kept < len(good) and zoo.fetch(TAG, progress=False) == cache / "converted" / TAG
    assert seen == [None, f"bytes={kept}-"] and (cache / "downloads" / FILE).read_bytes() == good


@pytest.mark.parametrize("before", [0, 1000])
def test_a_server_that_ignores_ranges_gives_the_right_bytes_named_once(cache, served, caplog, before):
    """The first answer is cut after a third (and a stopped fetch left ``before`` bytes): each ranged
    request is answered with the whole file, whose bytes before the position are passed over."""
    root, _, requests = served
    good, seen = (root / FILE).read_bytes(), []
    part = cache / "downloads" / f"{FILE}.part"
    if before:
        part.parent.mkdir(parents=True)
        part.write_bytes(good[:before])
    ROUTES[f"/{FILE}"] = _ranged(good, seen, cut_at=len(good) // 3, honour=False)
    caplog.set_level("INFO", logger="vlp.interop.zoo")
    assert zoo.fetch(TAG) == cache / "converted" / TAG
    assert (cache / "downloads" / FILE).read_bytes() == good
    assert seen == ([f"bytes={before}-"] if before else [None]) + [f"bytes={len(good) // 3}-"]
    named = [r.getMessage() for r in caplog.records if "ignores Range requests" in r.getMessage()]
    assert len(named) == 1 and "is read from byte 0 again" in named[0], caplog.text
    continued = [r.getMessage() for r in caplog.records if "continuing the download" in r.getMessage()]
    assert continued == ([f"{TAG}: continuing the download in {part} from byte {before:,}"] if before else [])


def test_a_ranged_answer_for_other_bytes_is_refused_and_the_part_removed(cache, served):
    root, base, _ = served
    good, seen = (root / FILE).read_bytes(), []
    ROUTES[f"/{FILE}"] = _ranged(good, seen, cut_at=len(good) // 3, shift=512)
    with pytest.raises(DownloadError) as err:
        zoo.fetch(TAG, progress=False)
    start = len(good) // 3
    assert f"asked for bytes {start}- (to the end), the server answered 206 with Content-Range " in str(err.value)
    assert f"'bytes {start + 512}-{len(good) - 1}/{len(good)}'" in str(err.value) and f"{base}/{FILE}" in str(err.value)
    assert seen == [None, f"bytes={start}-"] and not (cache / "downloads").exists()


def test_a_complete_part_file_is_checked_and_converted_after_a_416(cache, served):
    """A ``.part`` that holds the whole file (a fetch stopped while converting): the request past its
    end is answered 416, and the file is checked and converted."""
    root, _, _ = served
    good, seen = (root / FILE).read_bytes(), []
    part = cache / "downloads" / f"{FILE}.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(good)
    ROUTES[f"/{FILE}"] = _ranged(good, seen)
    assert zoo.fetch(TAG, progress=False) == cache / "converted" / TAG
    assert seen == [f"bytes={len(good)}-"] and (cache / "downloads" / FILE).read_bytes() == good

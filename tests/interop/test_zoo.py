"""The model zoo: tag -> download (from an http.server on 127.0.0.1, or a file:// mirror) -> convert ->
verify -> reuse, and its failures (checksum, unreachable URL, interrupted conversion, unknown tag)."""

from __future__ import annotations

import hashlib
import http.server
import re
import shlex
import shutil
import socket
import threading
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from tests.albef_fakes import IMG, albef_state
from vlp import VLPModel, list_pretrained
from vlp.cli import main
from vlp.errors import CheckpointError, ConfigError, DownloadError
from vlp.interop import zoo
from vlp.interop.albef import convert_albef_file
from vlp.pretrained import load_model

TAG, FILE = "albef-4m", "ALBEF_4M.pth"
CPU = torch.device("cpu")


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
    """``$VLP_CACHE`` in tmp_path, ``albef-4m`` pointed at the local server, the request log emptied."""
    _, base, requests = served
    requests.clear()
    monkeypatch.delenv(zoo.MIRROR_ENV, raising=False)
    monkeypatch.setenv(zoo.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv(zoo.url_env(TAG), f"{base}/{FILE}")
    return tmp_path / "cache"


def test_table_and_url_overrides(monkeypatch):
    tags = list_pretrained()
    assert tags[:2] == ["albef-14m", "albef-4m"] and "albef-grounding-refcoco" in tags and len(tags) == 7
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
    convert_albef_file(root / FILE, tmp_path / "by_hand", kind="pretrain")
    by_hand = load_model(tmp_path / "by_hand", CPU)[0].state_dict()
    zoo_state = m.model.state_dict()
    assert zoo_state.keys() == by_hand.keys()
    assert all(torch.equal(zoo_state[k], by_hand[k]) for k in by_hand)
    assert m.model_config.vision.img_size == IMG
    again = VLPModel.from_pretrained(TAG, device="cpu")
    assert requests == [f"/{FILE}"]  # reused: the server was not asked again
    assert torch.equal(again.model.state_dict()["vision.pos_embed"], by_hand["vision.pos_embed"])


def test_corrupted_converted_folder_is_converted_again(cache, served, capsys):
    _, _, requests = served
    out = zoo.fetch(TAG, progress=False)
    with open(out / "model.safetensors", "r+b") as f:  # flip a byte: same size, wrong SHA-256
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert zoo.fetch(TAG, progress=True) == out
    assert "does not match its SHA-256" in capsys.readouterr().err
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
    assert list((cache / "downloads").iterdir()) == [] and not (cache / "converted").exists()
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
    assert url in msg and str(dest) in msg and f"curl -L -o {dest} {url}" in msg
    assert list(dest.parent.iterdir()) == []  # no .part left
    # the manual steps of the message work, and the zoo then reuses their result without the network
    shutil.copy(root / FILE, dest)
    command = re.search(r"`(vlp convert albef [^`]+)`", msg)
    assert command is not None and command.group(1).endswith("--kind pretrain")
    assert main(shlex.split(command.group(1))[1:]) == 0
    assert VLPModel.from_pretrained(TAG, device="cpu").kind == "pretrain"


def test_interrupted_conversion_leaves_nothing_reused(cache, served, monkeypatch):
    _, _, requests = served
    real = zoo.convert_albef_file

    def killed(src, out_dir, **kwargs):
        real(src, out_dir, **kwargs)  # the folder is complete, then the process "dies" before the rename
        raise KeyboardInterrupt

    monkeypatch.setattr(zoo, "convert_albef_file", killed)
    with pytest.raises(KeyboardInterrupt):
        zoo.fetch(TAG, progress=False)
    assert list((cache / "converted").iterdir()) == []
    monkeypatch.setattr(zoo, "convert_albef_file", real)
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
    assert all(tag in listed for tag in list_pretrained()) and "the retrieval layout" in listed
    assert main(["zoo", "fetch", TAG, "--cache", str(cache)]) == 0
    folder = Path(capsys.readouterr().out.strip().splitlines()[-1])
    assert folder == cache / "converted" / TAG and (folder / "key_report.json").is_file()
    assert main(["zoo", "fetch", "no-such-tag"]) == 2
    assert "albef-4m" in capsys.readouterr().err  # the error lists the known tags

"""vlp models on the Hugging Face Hub (issue 30, part 6), tested offline: downloads from a
pre-populated Hub cache under ``HF_HUB_OFFLINE=1``, uploads by checking the folder handed to the
upload call."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.test_api import TEXTS
from vlp.api import VLPModel, config_dict
from vlp.errors import CheckpointError
from vlp.interop.hub import is_repo_id, model_card

ROOT = Path(__file__).parents[2]


def cache_snapshot(cache: Path, repo_id: str, folder: Path, commit: str, ref: str | None = "main") -> Path:
    """Put ``folder`` into a Hub cache as ``huggingface_hub`` lays it out: content-addressed blobs,
    a snapshot of relative symlinks per commit, ``refs/<ref>`` naming the commit."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    (repo / "blobs").mkdir(exist_ok=True)
    for f in folder.iterdir():
        digest = hashlib.sha256(f.read_bytes()).hexdigest()
        shutil.copyfile(f, repo / "blobs" / digest)
        (snap / f.name).symlink_to(Path("..", "..", "blobs", digest))
    if ref:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return snap


LOAD = """
import json, sys
from vlp.api import VLPModel
from vlp.errors import CheckpointError
repo, revision, images, texts = sys.argv[1], sys.argv[2] or None, json.loads(sys.argv[3]), json.loads(sys.argv[4])
try:
    m = VLPModel.from_pretrained(repo, device="cpu", revision=revision)
except CheckpointError as e:
    print(json.dumps({"error": str(e)}))
else:
    print(json.dumps({"similarity": m.similarity(images, texts).tolist()}))
"""


def load_offline(cache: Path, repo: str, images: list[str], revision: str = "") -> dict:
    """``VLPModel.from_pretrained(repo)`` in a fresh process with ``HF_HUB_OFFLINE=1`` and ``cache``."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache), "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-c", LOAD, repo, revision, json.dumps(images), json.dumps(TEXTS)]
    done = subprocess.run(args, capture_output=True, text=True, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_an_id_is_downloaded_from_the_hub_cache_offline_at_a_revision(pretrained, images, tmp_path):
    m, _, saved = pretrained
    cache = tmp_path / "hub"
    cache_snapshot(cache, "vlp-org/tiny", saved, "a" * 40)
    other = tmp_path / "other"
    weight = m.model.text.embeddings.word_embeddings.weight
    noise = torch.randn(weight.shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # another revision: other weights
        weight.add_(noise)
    try:
        m.save_pretrained(other)
    finally:
        with torch.no_grad():
            weight.sub_(noise)
    cache_snapshot(cache, "vlp-org/tiny", other, "b" * 40, ref="v2")
    want = VLPModel.from_pretrained(saved, device="cpu").similarity(images, TEXTS)
    got = load_offline(cache, "vlp-org/tiny", images)
    torch.testing.assert_close(torch.tensor(got["similarity"]), want)
    v2 = load_offline(cache, "vlp-org/tiny", images, revision="v2")
    by_commit = load_offline(cache, "vlp-org/tiny", images, revision="b" * 40)
    assert v2 == by_commit and not torch.allclose(torch.tensor(v2["similarity"]), want)
    missing = load_offline(cache, "vlp-org/absent", images)
    assert "vlp-org/absent: not in the Hugging Face cache" in missing["error"]
    assert "HF_HUB_OFFLINE" in missing["error"]


def test_a_changed_file_in_the_cache_is_refused(pretrained, tmp_path, images):
    """The snapshot is checked against the folder's manifest like any saved folder."""
    _, _, saved = pretrained
    snap = cache_snapshot(tmp_path / "hub", "vlp-org/tiny", saved, "c" * 40)
    blob = (snap / "preprocessor.json").resolve()
    blob.write_text(blob.read_text().replace("bicubic", "bilinear"))
    got = load_offline(tmp_path / "hub", "vlp-org/tiny", images)
    assert "preprocessor.json" in got["error"]


def test_a_local_folder_named_like_an_id_wins(pretrained, tmp_path, monkeypatch):
    _, _, saved = pretrained
    monkeypatch.chdir(tmp_path)
    shutil.copytree(saved, tmp_path / "vlp-org" / "tiny")
    m = VLPModel.from_pretrained("vlp-org/tiny", device="cpu")
    assert m.kind == "pretrain"


def test_push_to_hub_uploads_a_folder_that_loads_back_with_its_card(pretrained, images, tmp_path, monkeypatch):
    import huggingface_hub

    m, _, _ = pretrained
    calls: dict = {}

    def create_repo(self, repo_id, **kw):
        calls["create"] = (repo_id, kw)

    class Info:
        commit_url = "https://huggingface.co/vlp-org/tiny/commit/0123"

    def upload_folder(self, repo_id, folder_path, **kw):
        calls["upload"] = (repo_id, kw)
        shutil.copytree(folder_path, tmp_path / "server")  # what the Hub would hold
        return Info()

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", create_repo)
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", upload_folder)
    url = m.push_to_hub("vlp-org/tiny", private=True, metrics={"rsum": 129.2}, data="the shapes world")
    assert url == Info.commit_url
    assert calls["create"] == ("vlp-org/tiny", {"private": True, "exist_ok": True, "repo_type": "model"})
    assert calls["upload"][0] == "vlp-org/tiny"
    back = VLPModel.from_pretrained(tmp_path / "server", device="cpu")
    torch.testing.assert_close(back.similarity(images, TEXTS), m.similarity(images, TEXTS))
    card = (tmp_path / "server" / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: vlp\n") and "# ALBEF (pretrain)" in card
    assert "| rsum | 129.2 |" in card and "the shapes world" in card and '"img_size": 32' in card


def test_the_card_states_the_run_data_when_not_given(pretrained):
    m, _, _ = pretrained
    config = config_dict(m)
    assert "## Data\n\nnot stated" in model_card(config)  # the tests' run names no data files
    config["source"]["data"] = ["worlds/w/pretrain.json", "cc3m.json"]
    card = model_card(config)
    assert "## Data\n\n- `worlds/w/pretrain.json`\n- `cc3m.json`\n" in card
    assert "## Metrics\n\nnot stated" in card and "step 2 of" in card


@pytest.mark.parametrize(
    "name, is_id",
    [("org/name", True), ("vlp-org/tiny.v2", True), ("runs/x/y", False), ("../x", False), ("name", False)],
)
def test_what_counts_as_a_hub_id(name, is_id):
    assert is_repo_id(name) == is_id


def test_a_bad_id_online_is_one_clear_error(monkeypatch):
    import huggingface_hub
    from huggingface_hub.errors import RepositoryNotFoundError

    def missing(*a, **kw):
        error = RepositoryNotFoundError.__new__(RepositoryNotFoundError)  # as the Hub's 404 raises it
        Exception.__init__(error, "404 Client Error: Repository Not Found")
        raise error

    monkeypatch.setattr(huggingface_hub, "snapshot_download", missing)
    with pytest.raises(CheckpointError, match=r"vlp-org/nope: no such model on the Hugging Face Hub"):
        VLPModel.from_pretrained("vlp-org/nope", device="cpu")

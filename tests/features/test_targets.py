"""LTD latent targets: the file, lookups, refusals of stale or mismatched files, and batches."""

import json

import pytest
import torch

from vlp.config import TextConfig
from vlp.data.datasets import Collator, ImageTextDataset
from vlp.data.formats import load_pairs
from vlp.errors import DataError
from vlp.features.targets import DEFAULT_ENCODER, LatentTargets, caption_key, content_hash, write_targets
from vlp.preprocess.transforms import load_tokenizer
from vlp.runs.training.features import run_make_targets


@pytest.fixture
def ann(tmp_path):
    from PIL import Image

    for i in range(3):
        Image.new("RGB", (8, 8), (40 * i, 0, 0)).save(tmp_path / f"{i}.png")
    entries = [
        {"image": "0.png", "caption": ["a red circle", "one circle", "a shape"]},
        {"image": "1.png", "caption": ["two squares", "a blue square"]},
        {"image": "2.png", "caption": "a small green triangle on the left"},
    ]
    path = tmp_path / "ann.json"
    path.write_text(json.dumps(entries))
    return path


def test_write_load_lookup_and_refusals(tmp_path, ann):
    caps = sorted({c for s in load_pairs([ann]) for c in s.captions})
    vecs = torch.randn(len(caps), 5)
    f = write_targets(tmp_path / "t.safetensors", caps, vecs, "my/encoder", [str(ann)])
    t = LatentTargets.load(f)
    assert t.dim == 5 and t.encoder == "my/encoder" and t.header["num_captions"] == len(caps)
    assert t.header["content_hash"] == content_hash(reversed(caps + caps)) and t.header["normalized"] is False
    for i, c in enumerate(caps):
        assert torch.equal(t.lookup(c), vecs[i])
    t.check_covers(load_pairs([ann]))
    with pytest.raises(DataError, match="already exists"):
        write_targets(f, caps, vecs, "my/encoder", [])
    with pytest.raises(DataError, match="'my/encoder' but config key 'loss.ltd.encoder' asks for"):
        LatentTargets.load(f, encoder="other/encoder")
    # a stale file: the annotations gained a caption
    entries = json.loads(ann.read_text())
    entries[1]["caption"].append("three big squares")
    ann.write_text(json.dumps(entries))
    with pytest.raises(DataError, match=r"stale: 1 training captions have no target.*three big squares"):
        t.check_covers(load_pairs([ann]))
    (tmp_path / "bad.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(DataError, match="bad.safetensors: not a readable vlp-latent-targets-v1 file"):
        LatentTargets.load(tmp_path / "bad.safetensors")
    with pytest.raises(DataError, match="missing.safetensors: file not found"):
        LatentTargets.load(tmp_path / "missing.safetensors")
    assert caption_key("a") != caption_key("a ") and caption_key("x") == caption_key("x")


def test_make_targets_with_the_offline_minilm_and_image_level_batches(tmp_path, ann):
    f = run_make_targets([str(ann)], "all-MiniLM-L6-v2", tmp_path / "targets.safetensors", show_progress=False)
    t = LatentTargets.load(f, encoder="minilm")
    assert t.encoder == DEFAULT_ENCODER and t.dim == 384 and t.header["normalized"] is True
    assert torch.allclose(t.vectors.norm(dim=1), torch.ones(len(t.vectors)), atol=1e-4)
    # a sentence encoder: paraphrases are closer than unrelated captions
    sim = lambda a, b: float(t.lookup(a) @ t.lookup(b))  # noqa: E731
    assert sim("two squares", "a blue square") > sim("two squares", "a small green triangle on the left")

    samples = load_pairs([ann])
    ds = ImageTextDataset(samples, lambda im: torch.zeros(3, 4, 4), targets=t, captions_per_image=4)
    item = ds[0]
    assert len(item["caption"]) == 4 and set(item["caption"]) == {"a red circle", "one circle", "a shape"}
    for j, c in enumerate(item["caption"]):
        assert torch.equal(item["ltd_target"][j], t.lookup(c))
    batch = Collator(load_tokenizer(TextConfig()), 16)([ds[0], ds[1], ds[2]])
    assert batch["input_ids"].shape[0] == 12 and batch["ltd_target"].shape == (12, 384)
    assert batch["text_image_ids"].tolist() == [ds.key_to_id[s.image_key] for s in samples for _ in range(4)]
    one = ImageTextDataset(samples, lambda im: torch.zeros(3, 4, 4), targets=t)[2]
    assert one["caption"] == "a small green triangle on the left" and one["ltd_target"].shape == (384,)

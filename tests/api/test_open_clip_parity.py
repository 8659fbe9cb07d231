"""open_clip parity (issue 54, item 1): open_clip's README usage example runs line for line with
``vlp`` in place of ``open_clip``; tensors in and out of ``encode_image`` / ``encode_text``;
``vlp.get_tokenizer``; ``hf-hub:`` ids; ``VLPModel.eval``."""

import shutil

import pytest
import torch
from PIL import Image

import vlp
from tests.helpers import RED_CIRCLE_PADDED, TINY_ALBEF, untrained_checkpoint
from tests.test_api import TEXTS
from vlp.api import Tokenizer, VLPModel
from vlp.checkpoint import Preprocessor
from vlp.config import TextConfig
from vlp.errors import CheckpointError
from vlp.preprocess.transforms import load_tokenizer


@pytest.fixture
def readme_files(tmp_path, monkeypatch):
    """A tiny untrained ALBEF checkpoint (the albef-tiny architecture) and ``docs/CLIP.png`` (RGBA,
    as a diagram PNG often is) in the working directory."""
    ckpt = untrained_checkpoint(tmp_path / "ckpt", TINY_ALBEF)
    (tmp_path / "docs").mkdir()
    pixels = torch.randint(0, 256, (48, 80, 4), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    Image.fromarray(pixels.numpy(), "RGBA").save(tmp_path / "docs" / "CLIP.png")
    monkeypatch.chdir(tmp_path)
    return ckpt


def test_open_clips_readme_example_line_for_line(readme_files):
    """open_clip_torch's README, "Usage" (3.3.0), with ``import vlp`` for ``import open_clip``, the
    architecture ``albef-tiny`` for ``ViT-B-32``, the test's checkpoint for ``laion2b_s34b_b79k`` and
    ``torch.autocast("cpu")`` for ``torch.autocast("cuda")``."""
    import torch
    from PIL import Image

    import vlp

    model, _, preprocess = vlp.create_model_and_transforms("albef-tiny", pretrained=str(readme_files))
    model.eval()  # model in train mode by default, impacts some models with BatchNorm or stochastic depth active
    tokenizer = vlp.get_tokenizer("albef-tiny")

    image = preprocess(Image.open("docs/CLIP.png")).unsqueeze(0)
    text = tokenizer(["a diagram", "a dog", "a cat"])

    with torch.no_grad(), torch.autocast("cpu"):
        image_features = model.encode_image(image)
        text_features = model.encode_text(text)
        image_features /= image_features.norm(dim=-1, keepdim=True)
        text_features /= text_features.norm(dim=-1, keepdim=True)

        text_probs = (100.0 * image_features @ text_features.T).softmax(dim=-1)

    print("Label probs:", text_probs)  # prints: [[1., 0., 0.]]

    embed_dim = model.model_config.embed_dim
    assert image_features.shape == (1, embed_dim) and text_features.shape == (3, embed_dim)
    assert text_probs.shape == (1, 3) and torch.allclose(text_probs.float().sum(-1), torch.ones(1), atol=1e-2)
    # the same scores through vlp's own conveniences: a path and strings (no autocast: float32)
    cosines = model.similarity("docs/CLIP.png", ["a diagram", "a dog", "a cat"])
    torch.testing.assert_close((100.0 * cosines).softmax(dim=-1), text_probs.float(), atol=2e-2, rtol=0)


def test_token_ids_and_pixel_tensors_give_the_features_of_strings_and_paths(pretrained, images):
    m = pretrained[1]
    ids = vlp.get_tokenizer(pretrained[2])(TEXTS)
    assert ids.dtype == torch.long and ids.shape == (len(TEXTS), m.preprocessor.max_len)
    torch.testing.assert_close(m.encode_text(ids), m.encode_text(TEXTS))
    torch.testing.assert_close(m.encode_text(ids[1]), m.encode_text(TEXTS[1]))  # one row [T]: one text
    paths = [images[0], images[1], images[3]]  # none below the minimum side (upscaled on load)
    pixels = torch.stack([m.transform(Image.open(p).convert("RGB")) for p in paths])
    torch.testing.assert_close(m.encode_image(pixels), m.encode_image(paths))
    raw_images, raw_texts = m.encode_image(pixels, normalize=False), m.encode_text(ids, normalize=False)
    assert not torch.allclose(raw_texts.norm(dim=-1), torch.ones(len(TEXTS)))  # open_clip's default
    torch.testing.assert_close(raw_images / raw_images.norm(dim=-1, keepdim=True), m.encode_image(pixels))
    torch.testing.assert_close(raw_texts / raw_texts.norm(dim=-1, keepdim=True), m.encode_text(ids))


def test_the_tokenizer_cleans_cuts_and_pads_as_the_model_was_trained():
    bert = load_tokenizer(TextConfig())
    pre = Preprocessor(64, [0.5] * 3, [0.5] * 3, max_len=6)
    tokens = Tokenizer(bert, pre)
    ids = tokens("A RED, circle!")  # one string: one row
    assert ids.shape == (1, 6) and bert.convert_ids_to_tokens(ids[0].tolist()) == RED_CIRCLE_PADDED
    long = tokens(["one two three four five six seven"])
    assert long.shape == (1, 6) and long[0, -1].item() == bert.sep_token_id  # cut at max_len
    assert tokens(["a b"], context_length=9).shape == (1, 9)
    questions = Tokenizer(bert, Preprocessor(64, [0.5] * 3, [0.5] * 3, max_len=8, caption_cleaning="pre_question"))
    # pre_question keeps a hyphen, pre_caption makes it a space
    assert bert.decode(questions(["What is left-most?"])[0], skip_special_tokens=True) == "what is left - most"
    assert bert.decode(tokens(["left-most?"])[0], skip_special_tokens=True) == "left most"


def test_eval_returns_the_model_in_eval_mode(pretrained, images):
    m = pretrained[0]
    m.model.train()
    try:
        assert m.eval() is m and not m.model.training
    finally:
        m.model.eval()


def test_hf_hub_always_means_the_hub_and_an_existing_path_is_a_path(pretrained, tmp_path, monkeypatch):
    """The rule for a name that is both: ``hf-hub:org/name`` is the Hub even with a local folder
    ``org/name``, which the bare name loads."""
    import huggingface_hub

    _, m2, saved = pretrained
    hub = tmp_path / "snapshot"
    shutil.copytree(saved, hub)
    asked = []

    def snapshot_download(repo_id, revision=None, cache_dir=None):
        asked.append((repo_id, revision))
        return str(hub)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.chdir(tmp_path)
    shutil.copytree(saved, tmp_path / "vlp-org" / "tiny")
    assert VLPModel.from_pretrained("vlp-org/tiny", device="cpu").kind == "pretrain" and asked == []
    model, _, _ = vlp.create_model_and_transforms("hf-hub:vlp-org/tiny", device="cpu")
    assert asked == [("vlp-org/tiny", None)] and model.model.state_dict().keys() == m2.model.state_dict().keys()
    assert vlp.get_tokenizer("hf-hub:vlp-org/tiny").context_length == m2.preprocessor.max_len
    assert asked[-1] == ("vlp-org/tiny", None) and len(asked) == 2
    with pytest.raises(CheckpointError, match=r"hf-hub:tiny: after 'hf-hub:' a Hugging Face Hub id is org/name"):
        VLPModel.from_pretrained("hf-hub:tiny", device="cpu")

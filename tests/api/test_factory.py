"""open_clip-style entry points (issue 30, part 6): ``vlp.list_models`` and
``vlp.create_model_and_transforms``."""

import pytest
import torch
from PIL import Image

import vlp
from tests.test_api import TEXTS
from vlp.api import VLPModel
from vlp.errors import CheckpointError, ConfigError
from vlp.models.albef import ALBEF
from vlp.models.dual import DualEncoder


def test_list_models_names_the_presets_and_the_zoo_stays_apart():
    assert vlp.list_models() == ["albef-base", "albef-small", "albef-tiny", "dual-resnet18"]
    assert not set(vlp.list_models()) & set(vlp.list_pretrained())


@pytest.mark.parametrize("name, cls, size", [("albef-tiny", ALBEF, 64), ("dual-resnet18", DualEncoder, 224)])
def test_a_preset_is_a_random_model_with_its_transform_and_tokenizer(name, cls, size):
    model, transform, tokenizer = vlp.create_model_and_transforms(name, device="cpu")
    assert isinstance(model, cls) and not model.training
    assert transform(Image.new("RGB", (90, 40), "red")).shape == (3, size, size)
    ids = tokenizer(["a red circle"])["input_ids"][0]
    assert tokenizer.convert_ids_to_tokens(ids) == ["[CLS]", "a", "red", "circle", "[SEP]"]


def test_a_path_gives_the_model_from_pretrained_loads(pretrained, images):
    m, _, saved = pretrained
    model, transform, tokenizer = vlp.create_model_and_transforms(saved, device="cpu")
    ref = VLPModel.from_pretrained(saved, device="cpu")
    assert model.state_dict().keys() == ref.model.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), ref.model.state_dict().values()))
    img = Image.open(images[0]).convert("RGB")
    assert torch.equal(transform(img), ref.transform(img))
    assert tokenizer(TEXTS)["input_ids"] == ref.tokenizer(TEXTS)["input_ids"]


def test_pretrained_weights_must_have_the_presets_architecture(pretrained):
    _, _, saved = pretrained  # the tests' tiny ALBEF: vision and text presets "tiny"
    model, _, _ = vlp.create_model_and_transforms("albef-tiny", pretrained=saved, device="cpu")
    assert isinstance(model, ALBEF)
    with pytest.raises(ConfigError, match=r"not a albef-base model: vision.preset: 'tiny' \(the preset has 'base'\)"):
        vlp.create_model_and_transforms("albef-base", pretrained=saved, device="cpu")


def test_an_unknown_name_lists_what_is_known():
    with pytest.raises(CheckpointError, match=r"albef-huge: .*vlp.list_models\(\)"):
        vlp.create_model_and_transforms("albef-huge", device="cpu")

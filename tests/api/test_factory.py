"""open_clip-style entry points (issue 30, part 6; issue 54): ``vlp.list_models``,
``vlp.create_model_and_transforms`` (``(model, preprocess_train, preprocess_val)``) and
``vlp.get_tokenizer``."""

import pytest
import torch
from PIL import Image

import vlp
from tests.helpers import RED_CIRCLE_PADDED
from tests.test_api import TEXTS
from vlp.api import VLPModel
from vlp.errors import CheckpointError, ConfigError
from vlp.models.albef import ALBEF
from vlp.models.dual import DualEncoder


def test_list_models_names_the_presets_and_the_zoo_stays_apart():
    assert vlp.list_models() == ["albef-base", "albef-small", "albef-tiny", "dual-resnet18"]
    assert not set(vlp.list_models()) & {tag for _, tag in vlp.list_pretrained()}
    assert {arch for arch, _ in vlp.list_pretrained()} <= set(vlp.list_models())


@pytest.mark.parametrize("name, cls, size", [("albef-tiny", ALBEF, 64), ("dual-resnet18", DualEncoder, 224)])
def test_a_preset_is_a_random_model_with_its_transforms_and_tokenizer(name, cls, size):
    model, preprocess_train, preprocess_val = vlp.create_model_and_transforms(name, device="cpu")
    assert isinstance(model, VLPModel) and isinstance(model.model, cls) and not model.model.training
    assert model.source == {"preset": name} and model.eval() is model
    for transform in (preprocess_train, preprocess_val):  # any PIL mode: RGB first, as the loaders do
        assert transform(Image.new("LA", (90, 40))).shape == (3, size, size)
    red = Image.new("RGB", (90, 40), "red")
    assert torch.equal(preprocess_val(red), model.transform(red))  # the evaluation transform
    noise = Image.fromarray(
        torch.randint(0, 256, (40, 90, 3), generator=torch.Generator().manual_seed(0)).byte().numpy()
    )
    torch.manual_seed(0)
    assert not torch.equal(preprocess_train(noise), preprocess_train(noise))  # random crops and RandAugment
    ids = model.tokenizer(["a red circle"])["input_ids"][0]
    assert model.tokenizer.convert_ids_to_tokens(ids) == ["[CLS]", "a", "red", "circle", "[SEP]"]
    tokens = vlp.get_tokenizer(name)(["A red circle!", "two squares"])
    assert tokens.dtype == torch.long and tokens.shape == (2, model.preprocessor.max_len)
    assert model.tokenizer.convert_ids_to_tokens(tokens[0, :6].tolist()) == RED_CIRCLE_PADDED


def test_a_path_gives_the_model_from_pretrained_loads(pretrained, images):
    m, _, saved = pretrained
    model, _, preprocess = vlp.create_model_and_transforms(saved, device="cpu")
    ref = VLPModel.from_pretrained(saved, device="cpu")
    assert model.model.state_dict().keys() == ref.model.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(model.model.state_dict().values(), ref.model.state_dict().values()))
    img = Image.open(images[0]).convert("RGB")
    assert torch.equal(preprocess(img), ref.transform(img))
    assert model.tokenizer(TEXTS)["input_ids"] == ref.tokenizer(TEXTS)["input_ids"]
    tokenizer = vlp.get_tokenizer(saved)  # read without building the model
    assert tokenizer.context_length == ref.preprocessor.max_len
    torch.testing.assert_close(model.encode_text(tokenizer(TEXTS)), ref.encode_text(TEXTS))


def test_pretrained_weights_must_have_the_presets_architecture(pretrained):
    _, _, saved = pretrained  # the tests' tiny ALBEF: vision and text presets "tiny"
    model, _, _ = vlp.create_model_and_transforms("albef-tiny", pretrained=saved, device="cpu")
    assert isinstance(model.model, ALBEF)
    with pytest.raises(ConfigError, match=r"not a albef-base model: vision.preset: 'tiny' \(the preset has 'base'\)"):
        vlp.create_model_and_transforms("albef-base", pretrained=saved, device="cpu")


def test_an_unknown_name_lists_what_is_known():
    with pytest.raises(CheckpointError, match=r"albef-huge: .*vlp.list_models\(\)"):
        vlp.create_model_and_transforms("albef-huge", device="cpu")
    with pytest.raises(CheckpointError, match=r"albef-huge: .*vlp.list_models\(\)"):
        vlp.get_tokenizer("albef-huge")

"""The model of each checkpoint kind, built from its model config (shared by the training jobs and
the inference API, which must not import the training code). Which builder a kind uses is its
:class:`vlp.kinds.Kind` entry's ``model``; the builders of the built-in kinds are below."""

from __future__ import annotations

from torch import nn

from vlp.config import VISION_PRESETS, ModelConfig, resolved
from vlp.config.model import ARCH_DUAL
from vlp.kinds import kind


def model_image_size(model: ModelConfig) -> int:
    """Input resolution of a model config."""
    return model.dual.img_size if model.arch == ARCH_DUAL else resolved(model.vision, VISION_PRESETS)["img_size"]


def without_init_sources(model: ModelConfig) -> None:
    """Turn every initialisation source of ``model`` off (in place): the weights come from a file."""
    model.text.init, model.vision.pretrained, model.dual.image_pretrained = "random", None, None


def build_model_of_kind(name: str, model: ModelConfig, vocab_size: int) -> nn.Module:
    """The model of a checkpoint kind (``state.json`` "task", :data:`vlp.weights.KIND_KEY`): the
    dual encoder for ``model.arch=dual``, else the kind's registered builder
    (:attr:`vlp.kinds.Kind.model`); an unknown kind raises :class:`vlp.kinds.UnknownKind`."""
    entry = kind(name)
    if model.arch == ARCH_DUAL:
        from vlp.models.dual import DualEncoder

        return DualEncoder(model, vocab_size)
    return entry.build_model(model, vocab_size)


def albef_with_mlm(model: ModelConfig, vocab_size: int) -> nn.Module:
    """Pretraining / helper ALBEF: ITC + ITM + MLM heads (``vocab_size``: the MLM head's from the config)."""
    from vlp.models.albef import ALBEF

    return ALBEF(model, mlm=True)


def albef_retrieval(model: ModelConfig, vocab_size: int) -> nn.Module:
    """Retrieval (and grounding) ALBEF: no MLM head."""
    from vlp.models.albef import ALBEF

    return ALBEF(model, mlm=False)


def vqa_model(model: ModelConfig, vocab_size: int) -> nn.Module:
    """The VQA model (answer decoder)."""
    from vlp.models.vqa import VQAModel

    return VQAModel(model)


def nlvr_model(model: ModelConfig, vocab_size: int) -> nn.Module:
    """The NLVR2 model: doubled fusion layers and the classifier head."""
    from vlp.models.nlvr import NLVRModel

    return NLVRModel(model, head="cls")


def nlvr_ta_model(model: ModelConfig, vocab_size: int) -> nn.Module:
    """The NLVR2 text-assignment pre-training model: doubled fusion layers and the TA head."""
    from vlp.models.nlvr import NLVRModel

    return NLVRModel(model, head="ta")


def ve_model(model: ModelConfig, vocab_size: int) -> nn.Module:
    """The SNLI-VE model (3-way classifier)."""
    from vlp.models.ve import VEModel

    return VEModel(model)

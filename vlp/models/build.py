"""The model of each checkpoint kind, built from its model config (shared by the training jobs and
the inference API, which must not import the training code): :func:`build_model_of_kind` calls the
builder registered under the kind's name in :data:`MODEL_BUILDERS`. The builders of the built-in
kinds are below, each registered where it is defined; outside code registers its own
(``MODEL_BUILDERS.register("toy", ToyModel)``)."""

from __future__ import annotations

from typing import Callable

from torch import nn

from vlp.config import VISION_PRESETS, ModelConfig, resolved
from vlp.config.model import ARCH_DUAL
from vlp.kinds import GROUNDING, HELPER, KINDS, NLVR2, NLVR_TA, PRETRAIN, RETRIEVAL, VE, VQA
from vlp.registry import Registry

#: ``(model config, tokenizer vocabulary size) -> the model`` of a kind
ModelBuilder = Callable[[ModelConfig, int], nn.Module]

#: the model builder of each kind, by kind name (one builder may serve several kinds)
MODEL_BUILDERS: Registry[ModelBuilder] = Registry("model builder")


def model_image_size(model: ModelConfig) -> int:
    """Input resolution of a model config."""
    return model.dual.img_size if model.arch == ARCH_DUAL else resolved(model.vision, VISION_PRESETS)["img_size"]


def without_init_sources(model: ModelConfig) -> None:
    """Turn every initialisation source of ``model`` off (in place): the weights come from a file."""
    model.text.init, model.vision.pretrained, model.dual.image_pretrained = "random", None, None


def build_model_of_kind(name: str, model: ModelConfig, vocab_size: int) -> nn.Module:
    """The model of a checkpoint kind (``state.json`` "task", :data:`vlp.weights.KIND_KEY`): the
    dual encoder for ``model.arch=dual``, else the kind's builder in :data:`MODEL_BUILDERS`; a kind
    not in :data:`vlp.kinds.KINDS`, or one without a builder, raises :class:`vlp.registry.UnknownName`."""
    KINDS.get(name)
    if model.arch == ARCH_DUAL:
        from vlp.models.dual import DualEncoder

        return DualEncoder(model, vocab_size)
    return MODEL_BUILDERS.get(name)(model, vocab_size)


@MODEL_BUILDERS.register(HELPER)
@MODEL_BUILDERS.register(PRETRAIN)
def albef_with_mlm(model: ModelConfig, vocab_size: int) -> nn.Module:
    """Pretraining / helper ALBEF: ITC + ITM + MLM heads (``vocab_size``: the MLM head's from the config)."""
    from vlp.models.albef import ALBEF

    return ALBEF(model, mlm=True)


@MODEL_BUILDERS.register(GROUNDING)
@MODEL_BUILDERS.register(RETRIEVAL)
def albef_retrieval(model: ModelConfig, vocab_size: int) -> nn.Module:
    """Retrieval (and grounding) ALBEF: no MLM head."""
    from vlp.models.albef import ALBEF

    return ALBEF(model, mlm=False)


@MODEL_BUILDERS.register(VQA)
def vqa_model(model: ModelConfig, vocab_size: int) -> nn.Module:
    """The VQA model (answer decoder)."""
    from vlp.models.vqa import VQAModel

    return VQAModel(model)


@MODEL_BUILDERS.register(NLVR2)
def nlvr_model(model: ModelConfig, vocab_size: int) -> nn.Module:
    """The NLVR2 model: doubled fusion layers and the classifier head."""
    from vlp.models.nlvr import NLVRModel

    return NLVRModel(model, head="cls")


@MODEL_BUILDERS.register(NLVR_TA)
def nlvr_ta_model(model: ModelConfig, vocab_size: int) -> nn.Module:
    """The NLVR2 text-assignment pre-training model: doubled fusion layers and the TA head."""
    from vlp.models.nlvr import NLVRModel

    return NLVRModel(model, head="ta")


@MODEL_BUILDERS.register(VE)
def ve_model(model: ModelConfig, vocab_size: int) -> nn.Module:
    """The SNLI-VE model (3-way classifier)."""
    from vlp.models.ve import VEModel

    return VEModel(model)

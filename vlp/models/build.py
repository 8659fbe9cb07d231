"""The model of each checkpoint kind, built from its model config (shared by the training jobs and
the inference API, which must not import the training code)."""

from __future__ import annotations

from torch import nn

from vlp.config import VISION_PRESETS, ModelConfig, resolved


def model_image_size(model: ModelConfig) -> int:
    """Input resolution of a model config."""
    return model.dual.img_size if model.arch == "dual" else resolved(model.vision, VISION_PRESETS)["img_size"]


def without_init_sources(model: ModelConfig) -> None:
    """Turn every initialisation source of ``model`` off (in place): the weights come from a file."""
    model.text.init, model.vision.pretrained, model.dual.image_pretrained = "random", None, None


def build_model_of_kind(kind: str, model: ModelConfig, vocab_size: int) -> nn.Module:
    """The model of a checkpoint kind (``state.json`` "task", :data:`vlp.weights.KIND_KEY`): pretraining / helper ALBEF or dual
    encoder, retrieval ALBEF (no MLM head), VQA (answer decoder), NLVR2 / NLVR TA (doubled fusion),
    SNLI-VE (3-way classifier)."""
    if model.arch == "dual":
        from vlp.models.dual import DualEncoder

        return DualEncoder(model, vocab_size)
    if kind == "vqa":
        from vlp.models.vqa import VQAModel

        return VQAModel(model)
    if kind in ("nlvr2", "nlvr-ta"):
        from vlp.models.nlvr import NLVRModel

        return NLVRModel(model, head="cls" if kind == "nlvr2" else "ta")
    if kind == "ve":
        from vlp.models.ve import VEModel

        return VEModel(model)
    from vlp.models.albef import ALBEF

    return ALBEF(model, mlm=kind != "retrieval")

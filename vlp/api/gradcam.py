"""Grad-CAM for the kinds with an ITM head and an ALBEF fusion encoder (pretrain, helper,
retrieval): :meth:`VLPModel.explain <vlp.api.VLPModel.explain>`, ``grounding_maps``, and
:func:`gradcam_layer` (the fusion layer they use). Each takes the :class:`~vlp.api.VLPModel`
first and checks its kind. They need gradients, so they run in eval mode but not under
``no_grad``; the model's parameters get no ``.grad``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator, NamedTuple, Optional

import torch

from vlp.api.capability import require
from vlp.api.inputs import ImageLike, Images, Texts, image_batches, image_list, tokenize
from vlp.eval.mode import evaluating
from vlp.models.gradcam import GradCAM, fusion_layer_index, gradcam, token_mean

if TYPE_CHECKING:
    from vlp.api import VLPModel


class Explanation(NamedTuple):
    """What :meth:`VLPModel.explain <vlp.api.VLPModel.explain>` returns: the text's tokens ([CLS] and
    [SEP] included), one Grad-CAM map per token [T, h, w] on the ViT's patch grid (not upsampled),
    the ITM match probability of the pair, and the fusion layer the maps come from."""

    tokens: list[str]
    maps: torch.Tensor
    itm_score: float
    layer: int


def gradcam_batches(
    vm: VLPModel, images: Images, texts: Texts, layer: Optional[int], batch_size: Optional[int], method: str
) -> Iterator[tuple[GradCAM, torch.Tensor, torch.Tensor]]:
    """(Grad-CAM, input ids [B, T], attention mask [B, T]) of the aligned pairs of VLPModel ``vm``,
    batch by batch, in eval mode with gradients on (:func:`vlp.models.gradcam.gradcam`); checks
    that ``vm``'s kind runs VLPModel method ``method``."""
    require(vm, method, "the ITM head", fusion=True)
    tok, bs = tokenize(vm, texts), batch_size or vm.batch_size
    n_img = len(image_list(images))
    if n_img != len(tok["input_ids"]):
        raise ValueError(f"{method} takes aligned pairs: got {n_img} images and {len(tok['input_ids'])} texts")
    ids, mask = tok["input_ids"].to(vm.device), tok["attention_mask"].to(vm.device)
    with evaluating(vm.model):
        for k, pixels in enumerate(image_batches(vm, images, bs)):
            rows = slice(k * bs, k * bs + len(pixels))
            yield gradcam(vm.model, pixels, ids[rows], mask[rows], layer), ids[rows], mask[rows]


def explain(vm: VLPModel, image: ImageLike, text: str, layer: Optional[int] = None) -> Explanation:
    """Grad-CAM of the ITM match logit over the cross-attention of fusion layer ``layer``
    (default: the middle one, :func:`vlp.models.gradcam.default_layer`) for one image and one
    text: a map [h, w] per token (ALBEF's visualisation notebook; docs in
    :mod:`vlp.models.gradcam`). Runs gradients internally, in eval mode."""
    ((cam, ids, mask),) = list(gradcam_batches(vm, [image], [text], layer, 1, "explain"))
    n = int(mask[0].sum())
    tokens = vm.tokenizer.convert_ids_to_tokens(ids[0, :n].tolist())
    score = float(cam.itm_logits.softmax(-1)[0, 1])
    return Explanation(tokens, cam.maps[0, :n].cpu(), score, cam.layer)


def grounding_maps(
    vm: VLPModel,
    images: Images,
    texts: Texts,
    layer: Optional[int] = None,
    batch_size: Optional[int] = None,
    words_only: bool = False,
) -> torch.Tensor:
    """The Grad-CAM grounding map [N, h, w] of each aligned pair (``images[i]``, ``texts[i]``):
    the per-token maps of :func:`explain` averaged over the text's tokens
    (:func:`vlp.models.gradcam.token_mean`; ``words_only`` leaves out [CLS] and [SEP])."""
    return torch.cat(
        [
            token_mean(cam.maps, mask, words_only).cpu()
            for cam, _, mask in gradcam_batches(vm, images, texts, layer, batch_size, "grounding_maps")
        ]
    )


def gradcam_layer(vm: VLPModel, layer: Optional[int] = None) -> int:
    """The fusion layer :func:`explain` and :func:`grounding_maps` use for ``layer`` (None: the
    middle one); one the model does not have raises ``ValueError``."""
    require(vm, "explain", "the ITM head", fusion=True, name="vlp.api.gradcam_layer")
    return fusion_layer_index(vm.model, layer)

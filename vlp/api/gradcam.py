"""The Grad-CAM actions of the kinds with an ITM head (:attr:`vlp.kinds.Kind.actions`):
:meth:`VLPModel.explain <vlp.api.VLPModel.explain>`, ``grounding_maps`` and ``gradcam_layer``.
Each takes the :class:`~vlp.api.VLPModel` first; the VLPModel method checks the kind before."""

from __future__ import annotations

from typing import Any, Iterator, NamedTuple, Optional

import torch

from vlp.api.inputs import ImageLike, Images, Texts
from vlp.eval.mode import evaluating
from vlp.models.gradcam import GradCAM, fusion_layer_index, gradcam, token_mean


class Explanation(NamedTuple):
    """What :meth:`VLPModel.explain <vlp.api.VLPModel.explain>` returns: the text's tokens ([CLS] and
    [SEP] included), one Grad-CAM map per token [T, h, w] on the ViT's patch grid (not upsampled),
    the ITM match probability of the pair, and the fusion layer the maps come from."""

    tokens: list[str]
    maps: torch.Tensor
    itm_score: float
    layer: int


def gradcam_batches(
    vm: Any, images: Images, texts: Texts, layer: Optional[int], batch_size: Optional[int], method: str
) -> Iterator[tuple[GradCAM, torch.Tensor, torch.Tensor]]:
    """(Grad-CAM, input ids [B, T], attention mask [B, T]) of the aligned pairs of VLPModel ``vm``,
    batch by batch, in eval mode with gradients on (:func:`vlp.models.gradcam.gradcam`)."""
    tok, bs = vm.tokenize(texts), batch_size or vm.batch_size
    n_img = len(vm.image_list(images))
    if n_img != len(tok["input_ids"]):
        raise ValueError(f"{method} takes aligned pairs: got {n_img} images and {len(tok['input_ids'])} texts")
    ids, mask = tok["input_ids"].to(vm.device), tok["attention_mask"].to(vm.device)
    with evaluating(vm.model):
        for k, pixels in enumerate(vm.image_batches(images, bs)):
            rows = slice(k * bs, k * bs + len(pixels))
            yield gradcam(vm.model, pixels, ids[rows], mask[rows], layer), ids[rows], mask[rows]


def explain(vm: Any, image: ImageLike, text: str, layer: Optional[int] = None) -> Explanation:
    """:meth:`vlp.api.VLPModel.explain`: the per-token Grad-CAM maps [T, h, w] of one pair."""
    ((cam, ids, mask),) = list(gradcam_batches(vm, [image], [text], layer, 1, "explain"))
    n = int(mask[0].sum())
    tokens = vm.tokenizer.convert_ids_to_tokens(ids[0, :n].tolist())
    score = float(cam.itm_logits.softmax(-1)[0, 1])
    return Explanation(tokens, cam.maps[0, :n].cpu(), score, cam.layer)


def grounding_maps(
    vm: Any,
    images: Images,
    texts: Texts,
    layer: Optional[int] = None,
    batch_size: Optional[int] = None,
    words_only: bool = False,
) -> torch.Tensor:
    """:meth:`vlp.api.VLPModel.grounding_maps`: the token-mean Grad-CAM map [N, h, w] of each pair."""
    return torch.cat(
        [
            token_mean(cam.maps, mask, words_only).cpu()
            for cam, _, mask in gradcam_batches(vm, images, texts, layer, batch_size, "grounding_maps")
        ]
    )


def gradcam_layer(vm: Any, layer: Optional[int] = None) -> int:
    """:meth:`vlp.api.VLPModel.gradcam_layer`: the fusion layer Grad-CAM uses for ``layer``."""
    return fusion_layer_index(vm.model, layer)

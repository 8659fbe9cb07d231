"""The encoding and scoring methods of the kinds with ITC projections (pretrain, helper, retrieval):
:meth:`VLPModel.encode_image <vlp.api.VLPModel.encode_image>`, ``encode_text``, ``similarity`` and
``itm_score`` (the last with an ALBEF fusion encoder). Each takes the :class:`~vlp.api.VLPModel`
first, checks its kind and runs without gradients in eval mode."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Union

import torch

from vlp.api.capability import require
from vlp.api.inputs import Images, Texts, image_batches, image_list, inference, tokenize
from vlp.api.tokenizer import attention_mask

if TYPE_CHECKING:
    from vlp.api import VLPModel


@inference
def encode_image(
    vm: VLPModel, images: Images, batch_size: Optional[int] = None, *, normalize: bool = True
) -> torch.Tensor:
    """ITC image features [N, D] (D = ``model.embed_dim``) of paths, PIL images or pixel tensors
    ([3, H, W] or [N, 3, H, W], preprocessed: open_clip's ``encode_image(image)``). ``normalize``:
    L2-normalised (vlp's default; open_clip's is False), else the projection before the norm."""
    require(vm, "encode_image", "ITC projections")
    model: Any = vm.model  # the kind's model class: what it offers depends on the kind
    return torch.cat([_feat(model.encode_image(b), normalize) for b in image_batches(vm, images, batch_size)])


@inference
def encode_text(
    vm: VLPModel, texts: Union[Texts, torch.Tensor], batch_size: Optional[int] = None, *, normalize: bool = True
) -> torch.Tensor:
    """ITC text features [N, D] of strings (cleaned and tokenized as the model was trained) or of
    token ids, a LongTensor [N, T] as :func:`vlp.get_tokenizer`'s tokenizer returns (open_clip's
    ``encode_text(text)``; attention mask: the ids that are not the pad id). ``normalize``: as
    :func:`encode_image`."""
    require(vm, "encode_text", "ITC projections")
    model: Any = vm.model
    if isinstance(texts, torch.Tensor):
        pad = vm.tokenizer.pad_token_id
        ids, mask = texts.reshape(-1, texts.shape[-1]).long(), attention_mask(texts, pad)
    else:
        tok = tokenize(vm, texts)
        ids, mask = tok["input_ids"], tok["attention_mask"]
    ids, mask, bs = ids.to(vm.device), mask.to(vm.device), batch_size or vm.batch_size
    return torch.cat(
        [_feat(model.encode_text(ids[s : s + bs], mask[s : s + bs]), normalize) for s in range(0, len(ids), bs)]
    )


def _feat(out: Any, normalize: bool) -> torch.Tensor:
    """The ITC features [B, D] of an encoder's output on the CPU: normalised, or before the norm."""
    return (out.feat if normalize else out.proj).cpu()


@inference
def similarity(
    vm: VLPModel, images: Images, texts: Union[Texts, torch.Tensor], batch_size: Optional[int] = None
) -> torch.Tensor:
    """ITC cosine similarities [N_img, N_txt] (not divided by the temperature); ``texts`` may be
    token ids as :func:`encode_text` takes them."""
    return encode_image(vm, images, batch_size) @ encode_text(vm, texts, batch_size).T


@inference
def itm_score(
    vm: VLPModel, images: Images, texts: Texts, batch_size: Optional[int] = None, *, logit: bool = False
) -> torch.Tensor:
    """Match probability [N] of aligned pairs (``images[i]``, ``texts[i]``): the ITM head's
    softmax class 1 on the fused [CLS] state. ``logit``: the class-1 logit instead (what ALBEF's
    retrieval evaluation re-ranks by, :func:`vlp.eval.retrieval.itm_scores`)."""
    require(vm, "itm_score", "the ITM head", fusion=True)
    model: Any = vm.model
    tok, bs = tokenize(vm, texts), batch_size or vm.batch_size
    n_img = len(image_list(images))
    if n_img != len(tok["input_ids"]):
        raise ValueError(f"itm_score scores aligned pairs: got {n_img} images and {len(tok['input_ids'])} texts")
    ids, mask = tok["input_ids"].to(vm.device), tok["attention_mask"].to(vm.device)
    out = []
    for k, pixels in enumerate(image_batches(vm, images, bs)):
        rows = slice(k * bs, k * bs + len(pixels))
        tokens = model.encode_image(pixels).tokens
        fused = model.fuse(model.text_states(ids[rows], mask[rows]), mask[rows], tokens)
        logits = model.itm_logits(fused).float()
        out.append((logits if logit else logits.softmax(-1))[:, 1].cpu())
    return torch.cat(out)

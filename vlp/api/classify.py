"""The classification actions (:attr:`vlp.kinds.Kind.actions`): :meth:`VLPModel.nlvr
<vlp.api.VLPModel.nlvr>` (NLVR2) and :meth:`VLPModel.entailment <vlp.api.VLPModel.entailment>`
(SNLI-VE). Each takes the :class:`~vlp.api.VLPModel` first; the VLPModel method checks the kind
and turns gradients off."""

from __future__ import annotations

from typing import Any, Optional, Union

import torch

from vlp.api.inputs import Images, Texts, as_list

#: the SNLI-VE classes in ALBEF's order (the columns of :meth:`VLPModel.entailment <vlp.api.VLPModel.entailment>`)
VE_LABELS = ("contradiction", "neutral", "entailment")


def _sentences(vm: Any, texts: Texts) -> dict[str, torch.Tensor]:
    """``input_ids`` / ``attention_mask`` [N, T] of sentences cut as the classification fine-tuning
    cut them (ALBEF's NLVR2 cut, 30 words and no token cut, in albef_compat mode)."""
    from vlp.data.nlvr import tokenize_sentences  # lazily: vlp.data.nlvr loads the training datasets

    return tokenize_sentences(vm.tokenizer, as_list(texts, (str,)), vm.preprocessor.max_len)


def nlvr(
    vm: Any, images0: Images, images1: Images, sentences: Texts, batch_size: Optional[int] = None
) -> Union[float, torch.Tensor]:
    """:meth:`vlp.api.VLPModel.nlvr`: the probability [N] (a float for one ``str``) that each
    sentence is true of its image pair."""
    single = isinstance(sentences, str)
    tok = _sentences(vm, sentences)
    bs = batch_size or vm.batch_size
    n0, n1, n = len(vm.image_list(images0)), len(vm.image_list(images1)), len(tok["input_ids"])
    if not n0 == n1 == n:
        raise ValueError(f"nlvr takes one image pair per sentence: got {n0} + {n1} images and {n} sentences")
    ids, mask = tok["input_ids"].to(vm.device), tok["attention_mask"].to(vm.device)
    out = []
    for k, (p0, p1) in enumerate(zip(vm.image_batches(images0, bs), vm.image_batches(images1, bs))):
        rows = slice(k * bs, k * bs + len(p0))
        out.append(vm.model.classify(p0, p1, ids[rows], mask[rows]).float().softmax(-1)[:, 1].cpu())
    prob = torch.cat(out)
    return float(prob[0]) if single else prob


def entailment(vm: Any, images: Images, hypotheses: Texts, batch_size: Optional[int] = None) -> torch.Tensor:
    """:meth:`vlp.api.VLPModel.entailment`: the probabilities [N, 3] of :data:`VE_LABELS` for each
    (image, hypothesis) pair."""
    tok = _sentences(vm, hypotheses)
    bs = batch_size or vm.batch_size
    n_img, n = len(vm.image_list(images)), len(tok["input_ids"])
    if n_img != n:
        raise ValueError(f"entailment takes one image per hypothesis: got {n_img} images and {n} hypotheses")
    ids, mask = tok["input_ids"].to(vm.device), tok["attention_mask"].to(vm.device)
    out = []
    for k, pix in enumerate(vm.image_batches(images, bs)):
        rows = slice(k * bs, k * bs + len(pix))
        out.append(vm.model.classify(pix, ids[rows], mask[rows]).float().softmax(-1).cpu())
    return torch.cat(out)

"""The classifiers: :meth:`VLPModel.nlvr <vlp.api.VLPModel.nlvr>` (NLVR2) and
:meth:`VLPModel.entailment <vlp.api.VLPModel.entailment>` (SNLI-VE). Each takes the
:class:`~vlp.api.VLPModel` first, checks its kind and runs without gradients in eval mode."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Union

import torch

from vlp.api.capability import require
from vlp.api.inputs import Images, Texts, as_list, image_batches, image_list, inference
from vlp.kinds import NLVR

if TYPE_CHECKING:
    from vlp.api import VLPModel

#: the SNLI-VE classes in ALBEF's order (the columns of :meth:`VLPModel.entailment <vlp.api.VLPModel.entailment>`)
VE_LABELS = ("contradiction", "neutral", "entailment")


def _sentences(vm: VLPModel, texts: Texts) -> dict[str, torch.Tensor]:
    """``input_ids`` / ``attention_mask`` [N, T] of sentences cut as the classification fine-tuning
    cut them (ALBEF's NLVR2 cut, 30 words and no token cut, in albef_compat mode)."""
    from vlp.data.nlvr import tokenize_sentences  # lazily: vlp.data.nlvr loads the training datasets

    return tokenize_sentences(vm.tokenizer, as_list(texts, (str,)), vm.preprocessor.max_len)


@inference
def nlvr(
    vm: VLPModel, images0: Images, images1: Images, sentences: Texts, batch_size: Optional[int] = None
) -> Union[float, torch.Tensor]:
    """Probability that each sentence is true of its image pair: a float for one sentence (a
    ``str``), else a tensor [N]; ``> 0.5`` is the model's True. Sentences are cut as the NLVR2
    fine-tuning cut them."""
    require(vm, NLVR, "the NLVR2 classifier")
    model: Any = vm.model  # the kind's model class: what it offers depends on the kind
    single = isinstance(sentences, str)
    tok = _sentences(vm, sentences)
    bs = batch_size or vm.batch_size
    n0, n1, n = len(image_list(images0)), len(image_list(images1)), len(tok["input_ids"])
    if not n0 == n1 == n:
        raise ValueError(f"nlvr takes one image pair per sentence: got {n0} + {n1} images and {n} sentences")
    ids, mask = tok["input_ids"].to(vm.device), tok["attention_mask"].to(vm.device)
    out = []
    for k, (p0, p1) in enumerate(zip(image_batches(vm, images0, bs), image_batches(vm, images1, bs))):
        rows = slice(k * bs, k * bs + len(p0))
        out.append(model.classify(p0, p1, ids[rows], mask[rows]).float().softmax(-1)[:, 1].cpu())
    prob = torch.cat(out)
    return float(prob[0]) if single else prob


@inference
def entailment(vm: VLPModel, images: Images, hypotheses: Texts, batch_size: Optional[int] = None) -> torch.Tensor:
    """SNLI-VE: the probabilities [N, 3] that each hypothesis is contradicted by / neutral to /
    entailed by its image (ALBEF's class order 0 / 1 / 2: :data:`VE_LABELS`); one image per
    hypothesis. Hypotheses are cut as the VE fine-tuning cut them."""
    require(vm, "entailment", "the SNLI-VE classifier")
    model: Any = vm.model
    tok = _sentences(vm, hypotheses)
    bs = batch_size or vm.batch_size
    n_img, n = len(image_list(images)), len(tok["input_ids"])
    if n_img != n:
        raise ValueError(f"entailment takes one image per hypothesis: got {n_img} images and {n} hypotheses")
    ids, mask = tok["input_ids"].to(vm.device), tok["attention_mask"].to(vm.device)
    out = []
    for k, pix in enumerate(image_batches(vm, images, bs)):
        rows = slice(k * bs, k * bs + len(pix))
        out.append(model.classify(pix, ids[rows], mask[rows]).float().softmax(-1).cpu())
    return torch.cat(out)

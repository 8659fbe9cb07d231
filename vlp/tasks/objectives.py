"""ALBEF objectives as reusable steps over model features (shared by pretraining and fine-tuning).

Each step takes the model (to run its encoders/heads) and precomputed features, calls a pure
tensor loss from ``vlp.losses``, and returns the loss plus whatever a later step needs.

Rows drawn with repeats (ITM's hard negatives) are taken with ``index_select``, whose backward adds
them in index order: the backward of ``x[index]`` accumulates with atomic adds on the CPU, in an
order that changes from run to run (``tests/tasks/test_step_determinism.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from vlp.config import ContrastiveConfig
from vlp.dist import all_gather_nograd, all_gather_with_grad, own_rows, world_size
from vlp.losses.contrastive import cosines, itc_targets
from vlp.losses.matching import ITM_NEGATIVES_PER_POSITIVE, itm_loss, race_noise, sample_hard_negatives
from vlp.losses.mlm import gather_masked, mask_tokens, mlm_capacity, mlm_loss
from vlp.losses.protocol import ContrastiveInputs, ContrastiveLoss
from vlp.losses.registry import build_loss
from vlp.models.albef import ALBEF, ImageFeatures, TextFeatures
from vlp.models.text import ImageKV, select_kv
from vlp.tasks.regulation import Regulation


@dataclass(frozen=True)
class TokenInfo:
    """What the losses need to know about the tokenizer (the model never sees the tokenizer)."""

    vocab_size: int
    mask_id: int
    special_ids: tuple[int, ...]  # never selected for MLM ([CLS], [SEP], [PAD], ...)
    _on_device: dict[str, torch.Tensor] = field(default_factory=dict, init=False, repr=False, compare=False)

    def special_ids_on(self, device: torch.device) -> torch.Tensor:
        """``special_ids`` as a tensor on ``device``, copied there once (not at every step)."""
        key = str(device)
        if key not in self._on_device:
            self._on_device[key] = torch.tensor(self.special_ids, dtype=torch.long).to(device)
        return self._on_device[key]


@dataclass
class ITCOutput:
    loss: torch.Tensor
    sim_i2t: torch.Tensor  # [B, B + Q] online image x (momentum texts | text queue), / temp
    sim_t2i: torch.Tensor  # [B, B + Q] (global bank: [B, world * B + Q])
    batch_cols: slice  # the columns of this rank's own batch (ITM mines its negatives there)
    temp: torch.Tensor | float  # the temperature dividing the cosines (learned, or a fixed tau)
    stats: dict[str, torch.Tensor] = field(default_factory=dict)  # regulation diagnostics


#: ``regulate(cos_i2t, cos_t2i, positives, same_image) -> Regulation``: per-entry log-weights added
#: to the ITC logits, with their statistics (SRCL; see :mod:`vlp.tasks.regulation`).
Regulate = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], Regulation]


def itc_step(
    model: ALBEF,
    img: ImageFeatures,
    txt: TextFeatures,
    img_m: torch.Tensor,
    txt_m: torch.Tensor,
    image_ids: torch.Tensor,
    alpha: float | torch.Tensor,
    positives: str = "pair",
    regulate: Optional[Regulate] = None,
    contrastive: Optional[ContrastiveConfig] = None,
    global_bank: bool = False,
    loss_fn: Optional[ContrastiveLoss] = None,
) -> ITCOutput:
    """ITC against momentum features + queues, with momentum distillation (ALBEF §2.1).

    ``img_m``/``txt_m`` [B, E] momentum features (no grad); ``image_ids`` [B]. ``positives``:
    ``pair`` = own pair only; ``image`` = every bank entry with the anchor's image id.
    ``regulate``: optional negative weighting (SRCL): its log-weights are added to the student's
    logits; the distillation targets are ALBEF's ``alpha * softmax(m) + (1 - alpha) * y`` unless the
    :class:`Regulation` says ``weight_targets`` (``loss.srcl.weight_targets``): then they come from
    the weighted momentum logits, ``alpha * softmax(m + log w) + (1 - alpha) * y`` (a removed
    negative, log-weight -inf, gets target 0). At the optimum of the soft cross-entropy,
    ``softmax(l + log w) = t``, so with ALBEF's targets the student's unweighted probability of a
    negative is ``∝ t_j / w_j``: a down-weighted false negative is pushed *up*
    (:func:`vlp.losses.srcl.distillation_optimum`); weighted targets cancel the ``1 / w_j``.
    ``contrastive``: InfoNCE (default; a fixed ``tau`` replaces
    the learned temperature) or another registered loss; ``loss_fn``: that loss, built once by the
    caller (None: built here). A loss with ``soft_targets`` gets the distillation targets and the
    regulation's log-weights; any other gets the cosines and positives (and the temperature).
    ``global_bank``: the in-batch columns hold every rank's momentum features (rank order), so
    each rank's rows see the whole global batch, as one process with that batch would.
    """
    q = model.queue
    b = img.feat.shape[0]
    if global_bank:
        txt_m, img_m, batch_ids = all_gather_nograd(txt_m), all_gather_nograd(img_m), all_gather_nograd(image_ids)
    else:
        batch_ids = image_ids
    own = own_rows(b) if global_bank else slice(0, b)
    bank_t = torch.cat([txt_m, q.get("text")], 0)
    bank_i = torch.cat([img_m, q.get("image")], 0)
    # same image id as the anchor: positives in "image" mode, a diagnostic for the regulator
    need_ids = positives == "image" or regulate is not None
    same_image = image_ids[:, None] == torch.cat([batch_ids, q.ids], 0)[None, :] if need_ids else None
    if positives == "image":
        assert same_image is not None  # need_ids
        pos = same_image
    else:
        pos = torch.zeros(b, bank_t.shape[0], dtype=torch.bool, device=img.feat.device)
        pos[:, own] = torch.eye(b, dtype=torch.bool, device=img.feat.device)
    img_m, txt_m = img_m[own], txt_m[own]  # this rank's rows, for the distillation targets
    c = contrastive or ContrastiveConfig()
    temp = model.temp if c.tau is None else c.tau
    cos_i2t = cosines(img.feat, bank_t)
    cos_t2i = cosines(txt.feat, bank_i)
    sim_i2t, sim_t2i = cos_i2t / temp, cos_t2i / temp
    loss_fn = loss_fn or build_loss(c)
    if not loss_fn.soft_targets:
        return ITCOutput(loss_fn(ContrastiveInputs(cos_i2t, pos, cos_t2i, pos, tau=temp)), sim_i2t, sim_t2i, own, temp)
    with torch.no_grad():
        m_i2t = cosines(img_m, bank_t) / temp
        m_t2i = cosines(txt_m, bank_i) / temp
    r = regulate(cos_i2t.detach(), cos_t2i.detach(), pos, same_image) if regulate is not None else None
    lw_i2t, lw_t2i, removal = (r.log_w_i2t, r.log_w_t2i, r.removal) if r is not None else (None, None, False)
    if r is not None and r.weight_targets:  # the soft targets see the weights too
        m_i2t, m_t2i = m_i2t + r.log_w_i2t, m_t2i + r.log_w_t2i
    t_i2t, t_t2i = itc_targets(pos, m_i2t, alpha), itc_targets(pos, m_t2i, alpha)
    x = ContrastiveInputs(cos_i2t, pos, cos_t2i, pos, temp, lw_i2t, lw_t2i, t_i2t, t_t2i, removal)
    return ITCOutput(loss_fn(x), sim_i2t, sim_t2i, own, temp, r.stats if r is not None else {})


def enqueue(model: ALBEF, image_ids: torch.Tensor, img_m: torch.Tensor, txt_m: torch.Tensor) -> None:
    """Write the global batch's momentum features into the queues (after the loss)."""
    model.queue.enqueue(all_gather_nograd(image_ids), image=all_gather_nograd(img_m), text=all_gather_nograd(txt_m))


@torch.no_grad()
def global_batch_sims(
    img_feat: torch.Tensor,
    txt_feat: torch.Tensor,
    img_m: torch.Tensor,
    txt_m: torch.Tensor,
    temp: torch.Tensor | float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ITM's sampling similarities over the global batch, identical on every rank (no gradient).

    ``img_feat``/``txt_feat`` [B, E] online and ``img_m``/``txt_m`` [B, E] momentum features of
    this rank. Returns ``(sim_i2t, sim_t2i)`` [world*B, world*B]: every rank's online anchors
    (rows, rank order) against every rank's momentum features / ``temp`` - the in-batch columns of
    the ITC bank of one process holding the global batch. One all-gather of [B, 4E].
    """
    e = img_feat.shape[1]
    feats = torch.cat([img_feat, txt_feat, img_m, txt_m], 1).float()
    i, t, i_m, t_m = all_gather_nograd(feats).split(e, 1)
    return cosines(i, t_m) / temp, cosines(t, i_m) / temp


@dataclass
class ITMPairs:
    """The 3B pairs of an ITM step, ready for one fusion pass: B positives, B (text, hard image)
    and B (hard text, image). Their image K/V are ``kv_index`` [3B] rows of the batch's K/V
    (local negatives) or ``kv`` itself (global negatives, projected from gathered tokens)."""

    hidden: torch.Tensor  # [3B, T, H] text states
    mask: torch.Tensor  # [3B, T]
    kv_index: Optional[torch.Tensor]  # [3B] rows of the batch's image K/V, or None
    kv: Optional[ImageKV]  # the pairs' own K/V when kv_index is None
    valid: torch.Tensor  # [3B] bool: the positives, and negatives that could be drawn
    total: Optional[torch.Tensor]  # global mode: global valid pairs / world


def itm_pairs(
    model: ALBEF,
    txt: TextFeatures,
    sim_i2t: torch.Tensor,
    sim_t2i: torch.Tensor,
    image_ids: Optional[torch.Tensor],
    generator: Optional[torch.Generator] = None,
    image_tokens: Optional[torch.Tensor] = None,
    global_batch: bool = False,
    hardness: float = 1.0,
    noise: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
) -> ITMPairs:
    """ITM's positives and hard negatives. Negatives are drawn with probability
    ``softmax(hardness * sim)`` (``loss.itm_hardness``).

    Local (ALBEF): negatives are drawn from this rank's batch, with the in-batch ITC similarities
    ``sim_*`` [B, B] (the batch columns of :class:`ITCOutput`) and ``image_ids`` [B]; the pairs
    index the batch's image K/V (projected once).

    ``global_batch``: negatives come from the whole global batch. ``sim_*`` [world*B, world*B] and
    ``image_ids`` [world*B] cover the global batch (:func:`global_batch_sims`, gathered ids), and
    ``generator`` must be seeded identically on every rank: every rank draws the global batch's
    negatives and keeps its own rows. The text states [B, T, H] and ``image_tokens`` [B, 1+N, W]
    are gathered with gradient (T must be the same on every rank), the negatives' K/V projected
    from the gathered tokens. The loss is this rank's sum over valid pairs divided by
    (global valid count / world): the mean over ranks is the global batch's loss and DDP's
    gradient mean its gradient. On one process both modes compute the same loss.

    ``noise``: :func:`itm_noise` drawn beforehand, used instead of ``generator`` (the same draws).
    """
    noise_img, noise_txt = noise if noise is not None else (None, None)
    neg_img, ok_img = sample_hard_negatives(sim_t2i, image_ids, generator, hardness, noise_img)  # per text
    neg_txt, ok_txt = sample_hard_negatives(sim_i2t, image_ids, generator, hardness, noise_txt)  # per image
    b = txt.hidden.shape[0]
    total, kv, kv_index = None, None, None
    if not global_batch:
        hidden = torch.cat([txt.hidden, txt.hidden, txt.hidden.index_select(0, neg_txt)], 0)
        mask = torch.cat([txt.mask, txt.mask, txt.mask[neg_txt]], 0)
        own = torch.arange(b, device=neg_img.device)
        kv_index = torch.cat([own, neg_img, own])
    else:
        if image_tokens is None:
            raise ValueError("itm_pairs(global_batch=True) needs the image tokens")
        total = (ok_img.sum() + ok_txt.sum() + ok_img.numel()) / world_size()  # global valid pairs / world
        own_r = own_rows(b)
        neg_img, ok_img, neg_txt, ok_txt = neg_img[own_r], ok_img[own_r], neg_txt[own_r], ok_txt[own_r]
        hidden_all, mask_all = all_gather_with_grad(txt.hidden), all_gather_nograd(txt.mask)
        hidden = torch.cat([txt.hidden, txt.hidden, hidden_all.index_select(0, neg_txt)], 0)
        mask = torch.cat([txt.mask, txt.mask, mask_all[neg_txt]], 0)
        kv = model.image_kv(all_gather_with_grad(image_tokens).index_select(0, neg_img))
    valid = torch.cat([torch.ones(b, dtype=torch.bool, device=ok_img.device), ok_img, ok_txt])
    return ITMPairs(hidden, mask, kv_index, kv, valid, total)


def itm_noise(
    rows: int, device: torch.device, generator: Optional[torch.Generator]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The draws of :func:`itm_pairs`' two samplings (an image per text, then a text per image),
    each [rows, rows] (rows: the batch, or the global batch), in the order it would make them."""
    return race_noise(rows, rows, device, generator), race_noise(rows, rows, device, generator)


def pair_kv(pairs: ITMPairs, image_kv: ImageKV) -> ImageKV:
    """The K/V the pairs attend to: rows of the batch's ``image_kv``, or (global negatives) the
    positives' K/V followed by the negatives' own, per layer."""
    if pairs.kv_index is not None:
        return select_kv(image_kv, pairs.kv_index)
    assert pairs.kv is not None
    return [(torch.cat([k, k_n, k]), torch.cat([v, v_n, v])) for (k, v), (k_n, v_n) in zip(image_kv, pairs.kv)]


def itm_loss_at(model: ALBEF, fused: torch.Tensor, pairs: ITMPairs) -> torch.Tensor:
    """ITM loss of the pairs' fused states [3B, T, H] (B positives, then 2B negatives:
    ``ITM_NEGATIVES_PER_POSITIVE``)."""
    logits = model.itm_logits(fused)
    rows = logits.shape[0]
    labels = (torch.arange(rows, device=logits.device) < rows // (1 + ITM_NEGATIVES_PER_POSITIVE)).long()
    return itm_loss(logits, labels, pairs.valid, pairs.total)


@dataclass
class MaskedText:
    """One MLM draw for this rank's rows: the masked ids, and the masked tokens gathered into a
    fixed number of slots (no boolean indexing: no device sync)."""

    ids: torch.Tensor  # [B, T] input ids with the selected tokens masked
    index: torch.Tensor  # [C] flat indices into [B * T] of the masked tokens (:func:`gather_masked`)
    labels: torch.Tensor  # [C] their original ids, -100 in the empty slots
    total: Optional[torch.Tensor]  # global mode: global masked count / world


def draw_masks(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    tokens: TokenInfo,
    probability: float,
    generator: Optional[torch.Generator] = None,
    length: Optional[int] = None,
    global_batch: bool = False,
    slots: str = "fixed",
) -> MaskedText:
    """BERT masking of ``input_ids``/``attention_mask`` [B, T] (:func:`mask_tokens`). ``length``:
    the tokenizer's max_len, so the masks do not depend on the padding. ``global_batch``: the
    masks are drawn for the gathered [world*B, T] batch with ``generator`` seeded identically on
    every rank (each rank keeps its rows; T must be the same on every rank) and the loss will be
    this rank's sum over its masked tokens divided by (global masked count / world), as
    :func:`itm_pairs` does for its pairs. ``slots`` (``loss.mlm_slots``): ``fixed`` gathers the
    masked tokens into :func:`mlm_capacity` slots without a device sync, ``exact`` exactly (one
    sync), ``auto`` fixed on CUDA and exact elsewhere."""
    total = None
    special = tokens.special_ids_on(input_ids.device)
    draw = (tokens.mask_id, tokens.vocab_size, probability, generator, length)
    if global_batch:
        ids_all, mask_all = all_gather_nograd(input_ids), all_gather_nograd(attention_mask)
        masked, labels = mask_tokens(ids_all, mask_all, special, *draw)
        total = (labels != -100).sum().clamp_min(1) / world_size()
        own = own_rows(input_ids.shape[0])
        masked, labels = masked[own], labels[own]
    else:
        masked, labels = mask_tokens(input_ids, attention_mask, special, *draw)
    fixed = slots == "fixed" or (slots == "auto" and labels.device.type == "cuda")
    index, labels = gather_masked(labels, mlm_capacity(labels.numel(), probability) if fixed else None)
    return MaskedText(masked, index, labels, total)


def mlm_loss_at(
    model: ALBEF, fused: torch.Tensor, fused_m: Optional[torch.Tensor], draw: MaskedText, alpha: float | torch.Tensor
) -> torch.Tensor:
    """Masked LM loss of the fused states of the masked text [B, T, H] (the twin's, or None: no
    distillation); the head runs only at the masked positions' slots."""
    logits = model.mlm_logits(fused.flatten(0, 1)[draw.index])
    logits_m = None
    if fused_m is not None:
        with torch.no_grad():
            logits_m = model.mlm_logits(fused_m.flatten(0, 1)[draw.index], momentum=True)
    return mlm_loss(logits, draw.labels, logits_m, alpha, draw.total)

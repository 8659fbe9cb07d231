"""Zero-shot retrieval engine: embed -> ITC cosine for all pairs -> top-k re-rank by the ITM head.

Final scores: the top-``k_test`` candidates of each query get the re-rank score (``itm``: ITM match
logit, ALBEF's default; ``itm+itc``: ITM logit + ITC cosine, LAVIS/BLIP) and are placed above all
other candidates, which keep their ITC order. Recall@K is therefore exact ALBEF protocol for
K <= k_test and ITC-ordered beyond. ``itc`` skips re-ranking (CLIP_benchmark-compatible).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch.utils.data import DataLoader

from vlp.config import EvalConfig
from vlp.data.datasets import ImageDataset
from vlp.data.formats import RetrievalSplit
from vlp.data.transforms import tokenize
from vlp.eval.metrics import relevance_metrics, retrieval_metrics
from vlp.models.albef import ALBEF
from vlp.models.text import select_kv
from vlp.train.logging import progress

RERANK_OFFSET = 1e4  # lifts re-ranked candidates above every ITC-only candidate


@dataclass
class Embeddings:
    image_tokens: torch.Tensor  # [N_img, 1+N, W]
    image_feat: torch.Tensor  # [N_img, E]
    text_hidden: torch.Tensor  # [N_txt, T, H]
    text_mask: torch.Tensor  # [N_txt, T]
    text_feat: torch.Tensor  # [N_txt, E]


@dataclass
class RetrievalResult:
    metrics: dict[str, float]
    scores_i2t: torch.Tensor  # [N_img, N_txt] final scores
    scores_t2i: torch.Tensor  # [N_txt, N_img]


@torch.no_grad()
def embed(model: ALBEF, split: RetrievalSplit, tokenizer, transform, max_len: int, batch_size: int,
          device: torch.device, show_progress: bool = True, num_workers: int = 0) -> Embeddings:
    """Unimodal features of every image and text of ``split`` (texts in one padded tensor)."""
    tok = tokenize(tokenizer, split.texts, max_len)
    ids, mask = tok["input_ids"].to(device), tok["attention_mask"].to(device)
    hidden, tfeat = [], []
    bar = progress(len(split.texts) + len(split.images), "embed", show_progress)
    for s in range(0, len(ids), batch_size):
        t = model.encode_text(ids[s : s + batch_size], mask[s : s + batch_size])
        hidden.append(t.hidden)
        tfeat.append(t.feat)
        bar.update(len(t.feat))
    loader = DataLoader(ImageDataset(split.images, transform, split.source), batch_size=batch_size, num_workers=num_workers)
    tokens, ifeat = [], []
    for images in loader:
        im = model.encode_image(images.to(device))
        tokens.append(im.tokens)
        ifeat.append(im.feat)
        bar.update(len(im.feat))
    bar.close()
    return Embeddings(torch.cat(tokens), torch.cat(ifeat), torch.cat(hidden), mask, torch.cat(tfeat))


@torch.no_grad()
def itm_scores(model: ALBEF, emb: Embeddings, img_idx: torch.Tensor, txt_idx: torch.Tensor, batch_size: int) -> torch.Tensor:
    """ITM match logits for pairs (img_idx[p], txt_idx[p]) -> [P]. Each distinct image's
    cross-attention K/V is projected once per batch."""
    out = []
    for s in range(0, len(img_idx), batch_size):
        ii, tt = img_idx[s : s + batch_size], txt_idx[s : s + batch_size]
        uniq, inverse = torch.unique(ii, return_inverse=True)
        kv = select_kv(model.image_kv(emb.image_tokens[uniq]), inverse)
        fused = model.fuse(emb.text_hidden[tt], emb.text_mask[tt], kv)
        out.append(model.itm_logits(fused)[:, 1].float())
    return torch.cat(out) if out else torch.zeros(0)


def _reranked(sim: torch.Tensor, top: torch.Tensor, itm: torch.Tensor, score: str) -> torch.Tensor:
    """``sim`` [Q, C] with each query's top-k columns ``top`` [Q, k] replaced by their ITM logits
    ``itm`` [Q, k] (+ the cosine for ``itm+itc``), lifted above every other candidate."""
    rerank = itm + torch.gather(sim, 1, top) if score == "itm+itc" else itm
    final = sim.clone()
    final.scatter_(1, top, rerank + RERANK_OFFSET)
    return final


def rerank_both(model: ALBEF, emb: Embeddings, sim: torch.Tensor, cfg: EvalConfig,
                show_progress: bool = True) -> tuple[torch.Tensor, torch.Tensor, int]:
    """ITM re-ranking of each image's and each caption's top ``k_test`` ITC candidates.

    A pair in both candidate sets is scored once. The distinct pairs are ordered by image, so that
    consecutive pairs share an image and its cross-attention K/V are projected once per batch.
    ``sim`` [N_img, N_txt] cosines -> (i2t [N_img, N_txt], t2i [N_txt, N_img], pairs scored).
    """
    n_img, n_txt = sim.shape
    k_i, k_t = min(cfg.k_test, n_txt), min(cfg.k_test, n_img)
    top_i2t = sim.topk(k_i, dim=1).indices  # [N_img, k_i] captions per image
    top_t2i = sim.T.topk(k_t, dim=1).indices  # [N_txt, k_t] images per caption
    dev = sim.device
    img = torch.cat([torch.arange(n_img, device=dev).repeat_interleave(k_i), top_t2i.reshape(-1)])
    txt = torch.cat([top_i2t.reshape(-1), torch.arange(n_txt, device=dev).repeat_interleave(k_t)])
    pairs, where = torch.unique(img * n_txt + txt, return_inverse=True)  # sorted: by image, then caption
    p_img, p_txt = pairs // n_txt, pairs % n_txt
    scores = []
    bar = progress(len(pairs), "ITM re-rank (distinct pairs)", show_progress)
    chunk = cfg.batch_size * 16
    for s in range(0, len(pairs), chunk):
        scores.append(itm_scores(model, emb, p_img[s : s + chunk], p_txt[s : s + chunk], cfg.batch_size))
        bar.update(min(chunk, len(pairs) - s))
    bar.close()
    itm = torch.cat(scores)[where].to(sim.dtype)
    i2t = _reranked(sim, top_i2t, itm[: n_img * k_i].view(n_img, k_i), cfg.score)
    t2i = _reranked(sim.T.contiguous(), top_t2i, itm[n_img * k_i :].view(n_txt, k_t), cfg.score)
    return i2t, t2i, len(pairs)


@torch.no_grad()
def evaluate_retrieval(model: ALBEF, emb: Embeddings, split: RetrievalSplit, cfg: EvalConfig,
                       relevant_images: Optional[list[list[int]]] = None, show_progress: bool = True,
                       graded_relevance: Optional[torch.Tensor] = None) -> RetrievalResult:
    """Score all pairs and compute ALBEF retrieval metrics (+ relevance-aware ones if given).

    ``graded_relevance`` [N_txt, N_img] float gains >= 0 (needs ``relevant_images``) replaces the
    binary gains of the text->image nDCG (``img_ndcg{10,25}``)."""
    if graded_relevance is not None and relevant_images is None:
        raise ValueError("graded_relevance needs relevant_images (R-precision and mAP use the relevance lists)")
    sim = (emb.image_feat.float() @ emb.text_feat.float().T)  # cosine, not divided by temp
    if cfg.score == "itc":
        i2t, t2i, scored = sim, sim.T.contiguous(), 0
    else:
        i2t, t2i, scored = rerank_both(model, emb, sim, cfg, show_progress)
    i2t, t2i = i2t.cpu(), t2i.cpu()
    metrics = retrieval_metrics(i2t, t2i, split.img2txt, split.txt2img)
    metrics["itm_pairs"] = scored
    if relevant_images is not None:
        metrics |= relevance_metrics(i2t, t2i, relevant_images, graded=graded_relevance)
    return RetrievalResult(metrics, i2t, t2i)

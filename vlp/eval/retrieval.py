"""Zero-shot retrieval engine: embed -> ITC cosine for all pairs -> top-k re-rank by the ITM head.

Final scores: the top-``k_test`` candidates of each query get the re-rank score (``itm``: ITM match
logit, ALBEF's default; ``itm+itc``: ITM logit + ITC cosine, LAVIS/BLIP) and are placed above all
other candidates, which keep their ITC order. Recall@K is therefore exact ALBEF protocol for
K <= k_test and ITC-ordered beyond. ``itc`` skips re-ranking (CLIP_benchmark-compatible).
Re-ranked final scores are float64 (:func:`_reranked`): exact, so candidates whose ITM logits differ
by less than float32's spacing near the offset are not tied. Every entry point runs the model in
eval mode and restores its modes (:func:`vlp.eval.mode.evaluating`).

Several processes (``distributed=True`` under a process group, docs/evaluation.md):

1. each rank encodes a contiguous shard of the images and of the captions (:func:`vlp.dist.shard_bounds`);
   the normalised ITC features are gathered to every rank, which computes the same cosine matrix
   and the same candidate pairs;
2. the distinct pairs, sorted by image, are cut into one contiguous share per rank balanced by pair
   count, an image's pairs never split (:func:`split_pairs`);
3. image tokens and text hidden states never leave their encoding rank except to the one rank (per
   image) or the ranks (per caption) that score them (:func:`vlp.dist.fetch_rows`, point-to-point);
4. the ITM scores are gathered back, and every rank computes identical metrics.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

import torch
from torch.utils.data import DataLoader, Subset

from vlp.config import EvalConfig
from vlp.data.datasets import ImageDataset
from vlp.data.formats import RetrievalSplit
from vlp.dist import fetch_rows, gather_rows, rank, shard_bounds, world_size
from vlp.errors import ConfigError
from vlp.eval.metrics import grouped_text_metrics, relevance_metrics, retrieval_metrics
from vlp.eval.mode import evaluating
from vlp.models.albef import ALBEF
from vlp.preprocess.transforms import tokenize
from vlp.progress import progress

RERANK_OFFSET = 1e4  # lifts re-ranked candidates above every ITC-only candidate


@dataclass
class Embeddings:
    """Unimodal outputs of a split. ITC features cover every image / caption; the ITM inputs
    (tokens, hidden states) cover the rows ``image_ids`` / ``text_ids`` (``None``: all, in order;
    several processes: this rank's shard). ITM inputs may wait in host memory (``eval.offload``);
    the features and masks are on the device."""

    image_tokens: torch.Tensor  # [n_img, 1+N, W]
    image_feat: torch.Tensor  # [N_img, E]
    text_hidden: torch.Tensor  # [n_txt, T, H]
    text_mask: torch.Tensor  # [n_txt, T]
    text_feat: torch.Tensor  # [N_txt, E]
    image_ids: Optional[torch.Tensor] = None  # [n_img] sorted global image indices of image_tokens
    text_ids: Optional[torch.Tensor] = None  # [n_txt] sorted global caption indices of text_hidden


@dataclass
class RetrievalResult:
    metrics: dict[str, float]
    scores_i2t: torch.Tensor  # [N_img, N_txt] final scores
    scores_t2i: torch.Tensor  # [N_txt, N_img]


def autocast(precision: str, device: torch.device) -> AbstractContextManager:
    """bf16 autocast on ``device`` for ``precision == "bf16"``, a no-op for ``fp32``."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")


# ----------------------------------------------------------------------------- rows over ranks


def split_pairs(pair_img: torch.Tensor, world: int) -> list[int]:
    """Cut ``pair_img`` [P] (the image of each pair, sorted) into ``world`` contiguous shares that
    never split an image's pairs: rank r scores pairs ``b[r]:b[r+1]`` of the returned ``b``.

    Balanced by pair count: every share holds between m and m + c pairs, c = the most pairs of one
    image, m as large as possible, so the largest and smallest shares differ by at most c. Such a
    cut always exists: the largest m whose greedy cut (each share the fewest images reaching m
    pairs) leaves >= m pairs for the last share also admits shares of at most m + c.
    """
    n = len(pair_img)
    if world == 1 or n == 0:
        return [0] + [n] * world
    img = pair_img.cpu()
    cuts = [0, *((img[1:] != img[:-1]).nonzero().flatten() + 1).tolist(), n]  # image boundaries
    c = max(b - a for a, b in zip(cuts, cuts[1:]))
    for m in range(n // world, -1, -1):
        bounds = _window_cut(cuts, world, m, c)
        if bounds is not None:
            return bounds
    raise AssertionError("unreachable: see the docstring")


def _window_cut(cuts: list[int], world: int, m: int, c: int) -> Optional[list[int]]:
    """Boundaries (values of ``cuts``) with every share in [m, m + c] pairs, or None if there are none.

    Positions reachable after r shares form all cuts in [lo_r, hi_r] (cuts are at most c apart,
    the window is c wide), so a forward pass finds them and a backward pass picks one per rank."""
    total = cuts[-1]
    lo, hi = [0], [0]
    for _ in range(world - 1):
        if lo[-1] + m > total:
            return None
        lo.append(cuts[bisect_left(cuts, lo[-1] + m)])
        hi.append(cuts[bisect_right(cuts, min(hi[-1] + m + c, total)) - 1])
    if not lo[-1] + m <= total <= hi[-1] + m + c:
        return None
    back = [total]
    for r in range(world - 1, 0, -1):
        back.append(cuts[bisect_right(cuts, min(hi[r], back[-1] - m)) - 1])
    return [0, *reversed(back)]


# ----------------------------------------------------------------------------- encoding


class _Rows:
    """Collects per-batch outputs [b, ...] into one [n, ...] tensor in ``dtype``: on the device, or
    in host memory (``host``; pinned and filled with asynchronous copies when the device is CUDA)."""

    def __init__(self, n: int, dtype: torch.dtype, host: bool, device: torch.device) -> None:
        self.n, self.dtype, self.host, self.device = n, dtype, host, device
        self.pin = host and device.type == "cuda"
        self.parts: list[torch.Tensor] = []
        self.out: Optional[torch.Tensor] = None
        self.at = 0

    def add(self, x: torch.Tensor) -> None:
        x = x.to(self.dtype)
        if not self.host:
            self.parts.append(x)
            return
        if self.out is None:
            self.out = torch.empty((self.n, *x.shape[1:]), dtype=self.dtype, pin_memory=self.pin)
        self.out[self.at : self.at + len(x)].copy_(x, non_blocking=self.pin)
        self.at += len(x)

    def result(self) -> torch.Tensor:
        if not self.host:
            return torch.cat(self.parts)
        if self.pin:
            torch.cuda.synchronize(self.device)  # the asynchronous copies have landed
        return self.out


def _encode_texts(
    model: ALBEF, ids: torch.Tensor, mask: torch.Tensor, batch_size: int, dtype: torch.dtype, bar, host: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """``ids``, ``mask`` [n, T] -> hidden states [n, T, H] in ``dtype`` (``host``: in host memory),
    normalised features [n, E]."""
    hidden, feat = _Rows(len(ids), dtype, host, ids.device), []
    for s in range(0, len(ids), batch_size):
        t = model.encode_text(ids[s : s + batch_size], mask[s : s + batch_size])
        hidden.add(t.hidden)
        feat.append(t.feat)
        bar.update(len(t.feat))
    return hidden.result(), torch.cat(feat)


def _encode_images(
    model: ALBEF,
    dataset,
    batch_size: int,
    device: torch.device,
    num_workers: int,
    dtype: torch.dtype,
    bar,
    host: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Images of ``dataset`` -> tokens [n, 1+N, W] in ``dtype`` (``host``: in host memory),
    normalised features [n, E]. ``num_workers`` loader processes decode the images; on CUDA the
    batches come in pinned memory and are copied without blocking."""
    pin = device.type == "cuda"
    tokens, feat = _Rows(len(dataset), dtype, host, device), []
    for images in DataLoader(dataset, batch_size=batch_size, num_workers=num_workers, pin_memory=pin):
        im = model.encode_image(images.to(device, non_blocking=pin))
        tokens.add(im.tokens)
        feat.append(im.feat)
        bar.update(len(im.feat))
    return tokens.result(), torch.cat(feat)


@torch.no_grad()
def embed(
    model: ALBEF,
    split: RetrievalSplit,
    tokenizer,
    transform,
    max_len: int,
    batch_size: int,
    device: torch.device,
    show_progress: bool = True,
    num_workers: int = 0,
    precision: str = "fp32",
    distributed: bool = False,
    offload: str = "none",
) -> Embeddings:
    """Unimodal features of every image and text of ``split`` (texts in one padded tensor), in eval
    mode (the model's modes restored after).

    ``precision`` (``fp32 | bf16 | auto``, auto: bf16 on CUDA): ``bf16`` encodes under bf16
    autocast and keeps the ITM inputs (tokens, hidden states) in bf16, half the memory (ITC
    features stay fp32). ``offload`` (``none | images | all | auto``, auto: images on CUDA): keep
    the image tokens (``all``: and the text hidden states) in host memory, pinned on CUDA, instead
    of on the device; re-ranking copies each batch's rows over (:func:`score_pairs`).
    ``num_workers``: image-decoding loader processes. ``distributed``: every rank of the process
    group must call it; each encodes its :func:`shard_bounds` shard of the images and of the texts,
    gathers the ITC features and keeps its own tokens and hidden states."""
    world, me = (world_size(), rank()) if distributed else (1, 0)
    settings = EvalConfig(precision=precision, offload=offload)  # validates the names
    precision, offload = settings.resolved_precision(device), settings.resolved_offload(device)
    tok = tokenize(tokenizer, split.texts, max_len)
    t_bounds, i_bounds = shard_bounds(len(split.texts), world), shard_bounds(len(split.images), world)
    t_rows = _rows_or_first(t_bounds[me], t_bounds[me + 1])
    i_rows = _rows_or_first(i_bounds[me], i_bounds[me + 1])
    ids, mask = tok["input_ids"][t_rows].to(device), tok["attention_mask"][t_rows].to(device)
    images = Subset(ImageDataset(split.images, transform, split.source), i_rows)
    bar = progress(len(t_rows) + len(i_rows), "embed", show_progress)
    keep = torch.bfloat16 if precision == "bf16" else torch.float32
    with evaluating(model), autocast(precision, device):
        hidden, tfeat = _encode_texts(model, ids, mask, batch_size, keep, bar, host=offload == "all")
        tokens, ifeat = _encode_images(
            model, images, batch_size, device, num_workers, keep, bar, host=offload in ("images", "all")
        )
    bar.close()
    if world == 1:
        return Embeddings(tokens, ifeat, hidden, mask, tfeat)
    nt, ni = t_bounds[me + 1] - t_bounds[me], i_bounds[me + 1] - i_bounds[me]  # a first row stood in for an empty shard
    return Embeddings(
        tokens[:ni],
        gather_rows(ifeat[:ni], i_bounds),
        hidden[:nt],
        mask[:nt],
        gather_rows(tfeat[:nt], t_bounds),
        torch.arange(i_bounds[me], i_bounds[me + 1], device=device),
        torch.arange(t_bounds[me], t_bounds[me + 1], device=device),
    )


def _rows_or_first(start: int, end: int) -> range:
    """Rows ``start:end``; an empty shard encodes row 0 instead, to learn the output shapes."""
    return range(start, end) if end > start else range(0, 1)


# ----------------------------------------------------------------------------- ITM re-ranking


@torch.no_grad()
def itm_scores(
    model: ALBEF, emb: Embeddings, img_idx: torch.Tensor, txt_idx: torch.Tensor, batch_size: int
) -> torch.Tensor:
    """ITM match logits for pairs (img_idx[p], txt_idx[p]) -> [P]; indices are rows of
    ``emb.image_tokens`` / ``emb.text_hidden`` (on the model's device: :func:`score_pairs` moves
    offloaded rows there). Each distinct image's cross-attention K/V is
    projected once per batch of ``batch_size`` pairs and broadcast to the batch's captions that
    pair with it (``image_index``: no per-pair copy of the K/V)."""
    out = []
    for s in range(0, len(img_idx), batch_size):
        ii, tt = img_idx[s : s + batch_size], txt_idx[s : s + batch_size]
        uniq, inverse = torch.unique(ii, return_inverse=True)
        kv = model.image_kv(emb.image_tokens[uniq])
        fused = model.fuse(emb.text_hidden[tt], emb.text_mask[tt], kv, image_index=inverse)
        out.append(model.itm_logits(fused)[:, 1].float())
    return torch.cat(out) if out else torch.zeros(0, device=img_idx.device)


def _local(ids: Optional[torch.Tensor], idx: torch.Tensor) -> torch.Tensor:
    """Global indices ``idx`` -> rows of a tensor holding the sorted global rows ``ids`` (None: all)."""
    return idx if ids is None else torch.searchsorted(ids, idx)


def _scoring_inputs(emb: Embeddings, p_img: torch.Tensor, p_txt: torch.Tensor, shares: list[int]) -> Embeddings:
    """This rank's ITM inputs: the tokens of the images and the hidden states of the captions of
    its share of pairs (``p_img[shares[r]:shares[r+1]]``), fetched from the ranks that encoded them."""
    world = len(shares) - 1
    need_img = [torch.unique(p_img[shares[q] : shares[q + 1]]) for q in range(world)]
    need_txt = [torch.unique(p_txt[shares[q] : shares[q + 1]]) for q in range(world)]
    i_bounds = shard_bounds(len(emb.image_feat), world)
    t_bounds = shard_bounds(len(emb.text_feat), world)
    device = emb.image_feat.device
    return Embeddings(
        _fetch(emb.image_tokens, i_bounds, need_img, device),
        emb.image_feat,
        _fetch(emb.text_hidden, t_bounds, need_txt, device),
        fetch_rows(emb.text_mask, t_bounds, need_txt),
        emb.text_feat,
        need_img[rank()],
        need_txt[rank()],
    )


def _fetch(local: torch.Tensor, bounds: list[int], need: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """:func:`vlp.dist.fetch_rows` of rows that may wait in host memory (``eval.offload``): the
    transfers run on the run's ``device`` (NCCL takes GPU tensors only), the rows go back to the host."""
    if local.device == device:
        return fetch_rows(local, bounds, need)
    return _to_host(fetch_rows(local.to(device), bounds, need))


def _to_host(x: torch.Tensor) -> torch.Tensor:
    """``x`` in host memory, pinned if it comes from a GPU."""
    if x.device.type != "cuda":
        return x.cpu()
    out = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
    out.copy_(x)
    return out


def _rows_on(
    xs: tuple[torch.Tensor, ...], idx: torch.Tensor, device: torch.device
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The rows ``idx`` [P] of the tensors ``xs`` (same rows) need, on ``device``: ``(rows of each
    [R, ...], idx remapped to them)``. Nothing moves when every tensor is on the device already.
    Rows in host memory are copied over: one contiguous block (asynchronously from pinned memory)
    when they are consecutive, as the images of pairs sorted by image are."""
    if all(x.device == device for x in xs):
        return list(xs), idx
    want = torch.unique(idx)
    lo, hi = int(want[0]), int(want[-1]) + 1
    if hi - lo == len(want):
        return [x[lo:hi].to(device, non_blocking=True) for x in xs], idx - lo
    return [x[want.to(x.device)].to(device) for x in xs], torch.searchsorted(want, idx)


def score_pairs(
    model: ALBEF,
    emb: Embeddings,
    p_img: torch.Tensor,
    p_txt: torch.Tensor,
    cfg: EvalConfig,
    show_progress: bool = True,
    distributed: bool = False,
) -> torch.Tensor:
    """ITM match logits [P] of the pairs (p_img[p], p_txt[p]), sorted by image, under
    ``cfg.precision``, ``cfg.pair_batch`` pairs per fusion batch.

    ``distributed``: rank r scores the pairs ``split_pairs(...)[r]:[r+1]`` (its images' K/V
    projected on that rank only) and every rank receives all scores. Image tokens or text states in
    host memory (``eval.offload``) are copied to the device one chunk of 16 pair batches at a time:
    only the chunk's images (consecutive, since pairs are sorted by image) and captions."""
    world, me = (world_size(), rank()) if distributed else (1, 0)
    device = emb.image_feat.device
    shares = split_pairs(p_img, world)
    if world > 1:
        if emb.image_ids is None:
            raise ValueError("distributed scoring takes the sharded Embeddings of embed(..., distributed=True)")
        emb = _scoring_inputs(emb, p_img, p_txt, shares)
    mine = slice(shares[me], shares[me + 1])
    img, txt = _local(emb.image_ids, p_img[mine]), _local(emb.text_ids, p_txt[mine])
    scores = []
    bar = progress(len(img), "ITM re-rank (distinct pairs)", show_progress)
    chunk = cfg.pair_batch * 16
    with evaluating(model), autocast(cfg.resolved_precision(device), device):
        for s in range(0, len(img), chunk):
            (tokens,), ii = _rows_on((emb.image_tokens,), img[s : s + chunk], device)
            (hidden, mask), tt = _rows_on((emb.text_hidden, emb.text_mask), txt[s : s + chunk], device)
            part = Embeddings(tokens, emb.image_feat, hidden, mask, emb.text_feat)
            scores.append(itm_scores(model, part, ii, tt, cfg.pair_batch))
            bar.update(min(chunk, len(img) - s))
    bar.close()
    return gather_rows(torch.cat(scores) if scores else torch.zeros(0, device=p_img.device), shares)


def _reranked(sim: torch.Tensor, top: torch.Tensor, itm: torch.Tensor, score: str) -> torch.Tensor:
    """``sim`` [Q, C] with each query's top-k columns ``top`` [Q, k] replaced by their ITM logits
    ``itm`` [Q, k] (+ the cosine for ``itm+itc``), lifted above every other candidate by
    :data:`RERANK_OFFSET`. float64 [Q, C]: near 1e4 float32 values lie ~1e-3 apart, which would
    round the re-ranked scores and tie candidates whose logits differ by less; in float64 the sum is
    exact (``final - RERANK_OFFSET`` gives back the float32 logit bit for bit, for |logit| >= 2^-16)."""
    final = sim.to(torch.float64, memory_format=torch.contiguous_format)
    rerank = itm.double() + torch.gather(final, 1, top) if score == "itm+itc" else itm.double()
    final.scatter_(1, top, rerank + RERANK_OFFSET)
    return final


def check_k_test(cfg: EvalConfig, n_images: int, n_texts: int, source: str = "the evaluation split") -> None:
    """ITM re-ranking scores the top ``eval.k_test`` images of each caption and captions of each
    image: it cannot exceed the candidate set (fails before any encoding; ``itc`` does not re-rank)."""
    if cfg.score != "itc" and cfg.k_test > min(n_images, n_texts):
        raise ConfigError(
            f"config key 'eval.k_test': {cfg.k_test} candidates per query, but {source} has "
            f"{n_images} images and {n_texts} captions; set eval.k_test <= {min(n_images, n_texts)}"
        )


def rerank_both(
    model: ALBEF,
    emb: Embeddings,
    sim: torch.Tensor,
    cfg: EvalConfig,
    show_progress: bool = True,
    distributed: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """ITM re-ranking of each image's and each caption's top ``k_test`` ITC candidates.

    A pair in both candidate sets is scored once. The distinct pairs are ordered by image, so that
    consecutive pairs share an image and its cross-attention K/V are projected once per batch.
    ``sim`` [N_img, N_txt] cosines -> (i2t [N_img, N_txt], t2i [N_txt, N_img] float64 on the host,
    pairs scored).
    ``distributed``: the pairs are split over the ranks (:func:`score_pairs`).
    """
    n_img, n_txt = sim.shape
    check_k_test(cfg, n_img, n_txt)
    k_i, k_t = cfg.k_test, cfg.k_test
    top_i2t = sim.topk(k_i, dim=1).indices  # [N_img, k_i] captions per image
    top_t2i = sim.T.topk(k_t, dim=1).indices  # [N_txt, k_t] images per caption
    dev = sim.device
    img = torch.cat([torch.arange(n_img, device=dev).repeat_interleave(k_i), top_t2i.reshape(-1)])
    txt = torch.cat([top_i2t.reshape(-1), torch.arange(n_txt, device=dev).repeat_interleave(k_t)])
    pairs, where = torch.unique(img * n_txt + txt, return_inverse=True)  # sorted: by image, then caption
    scores = score_pairs(model, emb, pairs // n_txt, pairs % n_txt, cfg, show_progress, distributed)
    itm, host = scores[where].cpu(), sim.cpu()  # the final float64 matrices are built on the host
    i2t = _reranked(host, top_i2t.cpu(), itm[: n_img * k_i].view(n_img, k_i), cfg.score)
    t2i = _reranked(host.T, top_t2i.cpu(), itm[n_img * k_i :].view(n_txt, k_t), cfg.score)
    return i2t, t2i, len(pairs)


@torch.no_grad()
def evaluate_retrieval(
    model: ALBEF,
    emb: Embeddings,
    split: RetrievalSplit,
    cfg: EvalConfig,
    relevant_images: Optional[list[list[int]]] = None,
    show_progress: bool = True,
    graded_relevance: Optional[torch.Tensor] = None,
    distributed: bool = False,
    caption_groups: Optional[Mapping[str, Sequence[int]]] = None,
    relevant_texts: Optional[list[list[int]]] = None,
) -> RetrievalResult:
    """Score all pairs and compute ALBEF retrieval metrics (+ relevance-aware ones if given).

    ``relevant_images`` [N_txt] lists (text -> its relevant images); ``relevant_texts`` [N_img]
    lists (image -> its relevant texts; None: the transpose of ``relevant_images``;
    :class:`~vlp.data.relevance.Relevance`).

    ``graded_relevance`` [N_txt, N_img] float gains >= 0 (needs ``relevant_images``) replaces the
    binary gains of the text->image nDCG (``img_ndcg{10,25}``). ``caption_groups`` (name -> caption
    indices) adds the text->image metrics of each group's queries as ``<metric>@<name>``
    (:func:`~vlp.eval.metrics.grouped_text_metrics`). ``distributed``: ``emb`` from
    :func:`embed` with ``distributed=True``; every rank calls it and gets the same result.
    Similarities and metrics are fp32 whatever ``cfg.precision``."""
    if graded_relevance is not None and relevant_images is None:
        raise ValueError("graded_relevance needs relevant_images (R-precision and mAP use the relevance lists)")
    if relevant_texts is not None and relevant_images is None:
        raise ValueError("relevant_texts needs relevant_images (a relevance file gives both)")
    sim = emb.image_feat.float() @ emb.text_feat.float().T  # cosine, not divided by temp
    if cfg.score == "itc":
        i2t, t2i, scored = sim, sim.T.contiguous(), 0
    else:
        i2t, t2i, scored = rerank_both(model, emb, sim, cfg, show_progress, distributed)
    i2t, t2i = i2t.cpu(), t2i.cpu()
    metrics = retrieval_metrics(i2t, t2i, split.img2txt, split.txt2img)
    metrics["itm_pairs"] = scored
    if relevant_images is not None:
        metrics |= relevance_metrics(i2t, t2i, relevant_images, graded=graded_relevance, relevant_texts=relevant_texts)
    if caption_groups:
        metrics |= grouped_text_metrics(t2i, split.txt2img, caption_groups, relevant_images, graded_relevance)
    return RetrievalResult(metrics, i2t, t2i)

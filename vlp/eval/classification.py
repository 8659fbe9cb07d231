"""Zero-shot classification on tensors: prompt ensembles, top-k / per-class metrics and the ITM re-rank.

No models and no files here (``vlp.runs.evaluation.zero_shot_classification`` embeds and writes). Scores are ``[N, C]``
(images x classes, higher is better) and metrics follow the retrieval metrics' tie rule
(:func:`vlp.eval.metrics.best_positive_rank`): a class tied with the true class ranks above it, so
constant scores never count as correct. Percentages like the retrieval metrics.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F

from vlp.eval.metrics import best_positive_rank, positives_mask

#: top-k accuracy reported besides top-1 (capped at the number of classes)
TOP_K = 5


def prompt_ensemble(text_features: torch.Tensor, n_classes: int, n_templates: int) -> torch.Tensor:
    """Class embeddings from the embeddings of every (class, template) prompt, as open_clip's
    ``build_zero_shot_classifier``: ``text_features`` [C*T, D] in class-major order (class c's
    templates at rows ``c*T .. c*T+T-1``) -> [C, D] fp32, ``normalize(mean_t normalize(f[c, t]))``."""
    if text_features.shape[0] != n_classes * n_templates:
        raise ValueError(
            f"prompt_ensemble: {text_features.shape[0]} prompt features for {n_classes} classes x "
            f"{n_templates} templates (expected {n_classes * n_templates})"
        )
    per_prompt = F.normalize(text_features.float(), dim=-1).view(n_classes, n_templates, -1)
    return F.normalize(per_prompt.mean(1), dim=-1)


def predicted_classes(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The top-scoring class of each row of ``scores`` [N, C], ties broken against the true class
    ``labels`` [N] (then towards the lowest index), so that ``pred == labels`` exactly where the
    true class ranks first under the metrics' tie rule -> [N] long."""
    top = scores == scores.max(1, keepdim=True).values
    others = top & ~F.one_hot(labels, scores.shape[1]).bool()
    return torch.where(others.any(1), others.int().argmax(1), labels)


def classification_metrics(scores: torch.Tensor, labels: torch.Tensor) -> dict[str, Any]:
    """Accuracy of ``scores`` [N, C] against the true classes ``labels`` [N] (long, in 0..C-1).

    Returns ``top1``, ``top5`` (top-``k`` with ``k`` = min(5, C), recorded as ``top5_k``),
    ``mean_per_class`` (the mean of ``per_class`` over the classes with images), ``per_class``
    [C] (None for a class without images), ``per_class_n`` [C] (images per class), ``confusion``
    [C, C] (rows: true class, columns: :func:`predicted_classes`; its trace over ``n`` is ``top1``)
    and ``n``. Accuracies in percent."""
    n, c = scores.shape
    if labels.shape != (n,) or n == 0:
        raise ValueError(f"classification_metrics: scores {tuple(scores.shape)} and labels {tuple(labels.shape)}")
    labels = labels.long().cpu()
    scores = scores.float().cpu()
    rank = best_positive_rank(scores, positives_mask([[y] for y in labels.tolist()], c))
    k = min(TOP_K, c)
    pred = predicted_classes(scores, labels)
    confusion = torch.zeros(c, c, dtype=torch.long)
    confusion.index_put_((labels, pred), torch.ones(n, dtype=torch.long), accumulate=True)
    per_n = confusion.sum(1)
    per_class: list[Optional[float]] = [
        100.0 * confusion[i, i].item() / per_n[i].item() if per_n[i] > 0 else None for i in range(c)
    ]
    present = [a for a in per_class if a is not None]
    return {
        "top1": 100.0 * (rank < 1).float().mean().item(),
        "top5": 100.0 * (rank < k).float().mean().item(),
        "top5_k": k,
        "mean_per_class": sum(present) / len(present),
        "per_class": per_class,
        "per_class_n": per_n.tolist(),
        "confusion": confusion.tolist(),
        "n": n,
    }


def itm_rerank(itc_scores: torch.Tensor, itm_scores: torch.Tensor, topk_idx: torch.Tensor) -> torch.Tensor:
    """Re-order each image's top-k classes by their ITM score, above every other class.

    ``itc_scores`` [N, C]; ``topk_idx`` [N, k] the classes to re-rank (each row distinct; any
    order); ``itm_scores`` [N, k] their ITM scores (in ``vlp evaluate classification``: the mean over
    the templates of the ITM match probability). Returns [N, C] fp32 scores: the classes outside the
    top k keep their ITC score; the top k get ``max(itc_scores) + k - r``, r = 0..k-1 the class's place
    when sorted by ITM score (descending), ties broken by ITC score (descending), then by the lower
    class index. The ranks are integers above every ITC score, so the order is exact (no ties among
    the top k) and :func:`classification_metrics` reads it like any score matrix."""
    n, k = topk_idx.shape
    if itm_scores.shape != (n, k) or itc_scores.shape[0] != n:
        raise ValueError(
            f"itm_rerank: itc {tuple(itc_scores.shape)}, itm {tuple(itm_scores.shape)}, top-k {tuple(topk_idx.shape)}"
        )
    itc = itc_scores.float()
    idx = topk_idx.long()
    # stable sorts from the last key to the first: class index, then ITC, then ITM
    order = idx.argsort(1)
    for key in (torch.gather(itc, 1, idx), itm_scores.float()):
        keyed = torch.gather(key, 1, order)
        order = torch.gather(order, 1, keyed.sort(dim=1, descending=True, stable=True).indices)
    ranked = torch.gather(idx, 1, order)  # [N, k] classes, best first
    lifted = itc.max() + torch.arange(k, 0, -1, dtype=itc.dtype)  # k..1 above the best ITC score
    return itc.clone().scatter_(1, ranked, lifted.expand(n, k).contiguous())

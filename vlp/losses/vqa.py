"""VQA answer generation: token-summed sequence NLL, the (distilled) weighted VQA loss, and the
pure tensor steps of answer ranking over a candidate list.

Answer sequences are ``[CLS] answer [SEP] [PAD]...`` with [CLS] as the start token: the logits at
position ``t`` predict token ``t + 1``, so a sequence of length ``L`` has ``L - 1`` targets, of
which the non-padding ones (``mask[:, 1:]``) count.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


def _shifted(
    logits: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``logits`` [A, L, V] -> log-probs [A, L-1, V] at positions 0..L-2, targets [A, L-1], valid [A, L-1] bool."""
    if logits.shape[:2] != ids.shape or ids.shape != mask.shape:
        raise ValueError(f"logits {tuple(logits.shape)}, ids {tuple(ids.shape)}, mask {tuple(mask.shape)} do not match")
    logp = F.log_softmax(logits[:, :-1].float(), dim=-1)
    return logp, ids[:, 1:], mask[:, 1:].bool()


def sequence_nll(logits: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token-summed negative log-likelihood of each sequence.

    ``logits`` [A, L, V] (position ``t`` predicts token ``t+1``), ``ids`` [A, L], ``mask`` [A, L]
    (1 = token). Returns [A]: ``-sum_{t=1..L-1, mask[t]} log p(ids[t] | ids[<t])``. The first answer
    token (``ids[:, 1]``) is included; [CLS] itself is never a target.
    """
    logp, target, valid = _shifted(logits, ids, mask)
    tok = logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # [A, L-1]
    # where, not multiply: a padding target may have log-prob -inf
    return -torch.where(valid, tok, torch.zeros_like(tok)).sum(-1)


def sequence_soft_ce(logits: torch.Tensor, logits_m: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token-summed soft cross-entropy against a teacher: [A].

    ``-sum_{t valid} sum_v softmax(logits_m[t])_v * log_softmax(logits[t])_v`` over the vocabulary
    axis, at the same positions and with the same mask as :func:`sequence_nll`. ``logits``,
    ``logits_m`` [A, L, V]; ``mask`` [A, L].
    """
    if logits_m.shape != logits.shape:
        raise ValueError(f"teacher logits {tuple(logits_m.shape)} vs student {tuple(logits.shape)}")
    logp = F.log_softmax(logits[:, :-1].float(), dim=-1)
    target = F.softmax(logits_m[:, :-1].float(), dim=-1)
    ce = -(target * logp).sum(-1)  # [A, L-1]
    return torch.where(mask[:, 1:].bool(), ce, torch.zeros_like(ce)).sum(-1)


def vqa_loss(
    logits: torch.Tensor,
    ids: torch.Tensor,
    mask: torch.Tensor,
    weights: torch.Tensor,
    n_questions: int,
    logits_m: Optional[torch.Tensor] = None,
    alpha: float = 0.0,
) -> torch.Tensor:
    """ALBEF's VQA loss: ``sum_k w_k * [(1 - alpha) NLL_k + alpha * D_k] / n_questions``.

    ``logits`` [A, L, V] for the A answers of the batch (each answer decoded against its own
    question), ``ids``/``mask`` [A, L] the ``[CLS] answer [SEP]`` tokens, ``weights`` [A] the answer
    weights, ``n_questions`` the batch's question count B. ``NLL_k``: :func:`sequence_nll`; ``D_k``:
    :func:`sequence_soft_ce` against ``logits_m`` [A, L, V] (the momentum decoder), ignored when
    ``logits_m`` is None or ``alpha == 0``. Returns a scalar.
    """
    if n_questions < 1:
        raise ValueError(f"n_questions must be >= 1, got {n_questions}")
    per_answer = sequence_nll(logits, ids, mask)
    if logits_m is not None and alpha != 0.0:
        per_answer = (1.0 - alpha) * per_answer + alpha * sequence_soft_ce(logits, logits_m, mask)
    return (weights.to(per_answer.dtype) * per_answer).sum() / n_questions


def first_token_topk(first_logits: torch.Tensor, cand_first_ids: torch.Tensor, k: int) -> torch.Tensor:
    """Ranking step 1: the ``k`` candidates whose first answer token is most probable.

    ``first_logits`` [B, V] the decoder's logits after [CLS]; ``cand_first_ids`` [C] each candidate's
    first answer token. Returns candidate indices [B, min(k, C)], most probable first. (Top-k of
    the probabilities = top-k of the logits: softmax is monotonic.)
    """
    k = min(k, cand_first_ids.shape[0])
    if k < 1:
        raise ValueError(f"need k >= 1 and at least one candidate, got k={k}")
    probs = F.softmax(first_logits.float(), dim=-1)
    return probs.index_select(1, cand_first_ids).topk(k, dim=1).indices


def select_answers(topk: torch.Tensor, nll: torch.Tensor, n_candidates: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Ranking step 2: score = -NLL of each kept candidate (the first token counted once).

    ``topk`` [B, k] candidate indices from :func:`first_token_topk`, ``nll`` [B, k] their
    :func:`sequence_nll`. Returns ``(pred [B] long, scores [B, n_candidates])`` with ``pred`` the
    candidate index of the highest score and ``scores`` -NLL at the kept candidates, -inf elsewhere.
    """
    scores = torch.full((topk.shape[0], n_candidates), float("-inf"), dtype=nll.dtype, device=nll.device)
    scores.scatter_(1, topk, -nll)
    pred = topk.gather(1, nll.argmin(dim=1, keepdim=True)).squeeze(1)
    return pred, scores

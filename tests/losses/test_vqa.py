import math

import pytest
import torch

from vlp.losses.vqa import first_token_topk, select_answers, sequence_nll, sequence_soft_ce, vqa_loss

LN2 = math.log(2.0)


def logp(*probs: float) -> list[float]:
    return [math.log(p) if p > 0 else float("-inf") for p in probs]


# Three answers over a 3-token vocabulary (0 = [CLS]/[PAD], 1 = [SEP], 2 = "a"), L = 3.
# Logits are log-probabilities, so softmax gives back the listed distributions.
IDS = torch.tensor([[0, 2, 1], [0, 1, 0], [0, 2, 1]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1]])
P = [  # P[answer][position] = distribution predicting the next token
    [[0.25, 0.25, 0.5], [0.25, 0.5, 0.25], [1 / 3, 1 / 3, 1 / 3]],  # p(a)=.5, p(SEP)=.5
    [[0.5, 0.25, 0.25], [0.98, 0.01, 0.01], [1 / 3, 1 / 3, 1 / 3]],  # p(SEP)=.25, then padding
    [[0.1, 0.1, 0.8], [0.25, 0.5, 0.25], [1 / 3, 1 / 3, 1 / 3]],  # p(a)=.8, p(SEP)=.5
]
LOGITS = torch.tensor([[logp(*d) for d in a] for a in P])
WEIGHTS = torch.tensor([1.0, 0.5, 0.3])  # answers 0, 1 -> question 0; answer 2 -> question 1
NLL = [2 * LN2, 2 * LN2, -math.log(0.8) + LN2]
TEACHER = [0.5, 0.25, 0.25]  # same teacher distribution over the vocabulary at every position


def cross_entropy(q: list[float], p: list[float]) -> float:
    return -sum(qi * math.log(pi) for qi, pi in zip(q, p))


D = [  # token-summed soft CE over the valid target positions (1 and 2 of 3 -> positions 0, 1)
    cross_entropy(TEACHER, P[0][0]) + cross_entropy(TEACHER, P[0][1]),
    cross_entropy(TEACHER, P[1][0]),
    cross_entropy(TEACHER, P[2][0]) + cross_entropy(TEACHER, P[2][1]),
]
TEACHER_LOGITS = torch.tensor(logp(*TEACHER)).expand(3, 3, 3).clone()


def test_sequence_nll_is_token_summed_and_skips_padding():
    assert sequence_nll(LOGITS, IDS, MASK).tolist() == pytest.approx(NLL, abs=1e-6)
    # the padding target (answer 1, position 1) may even have log-prob -inf: still ignored
    logits = LOGITS.clone()
    logits[1, 1] = torch.tensor([float("-inf"), 5.0, -3.0])
    assert sequence_nll(logits, IDS, MASK).tolist() == pytest.approx(NLL, abs=1e-6)


def test_vqa_loss_equals_hand_computation():
    expected = (1.0 * NLL[0] + 0.5 * NLL[1] + 0.3 * NLL[2]) / 2  # 2 questions
    assert vqa_loss(LOGITS, IDS, MASK, WEIGHTS, 2).item() == pytest.approx(expected, abs=1e-6)
    assert expected == pytest.approx((3 * LN2 + 0.3 * math.log(2 / 0.8)) / 2)


def test_alpha_zero_ignores_teacher_and_alpha_one_is_soft_ce():
    garbage = torch.randn(3, 3, 3) * 10
    plain = vqa_loss(LOGITS, IDS, MASK, WEIGHTS, 2)
    assert vqa_loss(LOGITS, IDS, MASK, WEIGHTS, 2, garbage, alpha=0.0).item() == pytest.approx(plain.item(), abs=1e-6)
    soft = (1.0 * D[0] + 0.5 * D[1] + 0.3 * D[2]) / 2
    assert sequence_soft_ce(LOGITS, TEACHER_LOGITS, MASK).tolist() == pytest.approx(D, abs=1e-6)
    assert vqa_loss(LOGITS, IDS, MASK, WEIGHTS, 2, TEACHER_LOGITS, alpha=1.0).item() == pytest.approx(soft, abs=1e-6)
    mixed = vqa_loss(LOGITS, IDS, MASK, WEIGHTS, 2, TEACHER_LOGITS, alpha=0.4).item()
    assert mixed == pytest.approx(0.6 * plain.item() + 0.4 * soft, abs=1e-6)


def test_vqa_loss_gradient_reaches_only_valid_positions():
    logits = LOGITS.clone().requires_grad_()
    vqa_loss(logits, IDS, MASK, WEIGHTS, 2, TEACHER_LOGITS, alpha=0.4).backward()
    assert logits.grad[:, 2].abs().sum() == 0  # last position predicts nothing
    assert logits.grad[1, 1].abs().sum() == 0  # answer 1: its target there is padding
    assert logits.grad[0, 1].abs().sum() > 0


# ---------------------------------------------------------------- ranking
# Vocabulary: 0 [PAD], 1 [CLS], 2 [SEP], 3 x, 4 y, 5 z. Candidates X, Y, Z = [CLS] w [SEP].
CANDS = torch.tensor([[1, 3, 2], [1, 4, 2], [1, 5, 2]])
CMASK = torch.ones(3, 3, dtype=torch.long)
SEP_AFTER = {3: 0.4, 4: 0.95, 5: 0.99}  # p([SEP] | [CLS] w); the rest goes to token x


def first_dist(px: float, py: float, pz: float) -> list[float]:
    return [0.0, 0.0, 0.0, px, py, pz]


def candidate_logits(first: list[float]) -> torch.Tensor:
    """Teacher-forced logits [C, 3, V] of every candidate for one question."""
    rows = []
    for w in (3, 4, 5):
        after = [0.0] * 6
        after[2], after[3] = SEP_AFTER[w], 1 - SEP_AFTER[w]
        rows.append([logp(*first), logp(*after), logp(*[1 / 6] * 6)])
    return torch.tensor(rows)


Q_FIRST = [first_dist(0.6, 0.3, 0.1), first_dist(0.3, 0.2, 0.5)]


def rank(k: int) -> tuple[torch.Tensor, torch.Tensor]:
    first_logits = torch.tensor([logp(*d) for d in Q_FIRST])  # [B=2, V]
    topk = first_token_topk(first_logits, CANDS[:, 1], k)
    nll = torch.stack(
        [sequence_nll(candidate_logits(Q_FIRST[b])[topk[b]], CANDS[topk[b]], CMASK[topk[b]]) for b in range(2)]
    )
    return select_answers(topk, nll, 3)


def test_first_token_counted_once_changes_the_winner():
    nll_x, nll_y = -math.log(0.6) - math.log(0.4), -math.log(0.3) - math.log(0.95)  # 1.427, 1.255
    assert -nll_y > -nll_x  # ours: Y
    assert -nll_x + math.log(0.6) > -nll_y + math.log(0.3)  # reference's double count would pick X
    pred, scores = rank(k=3)
    assert pred.tolist() == [1, 2]  # question 0 -> Y; question 1 -> Z (NLL 0.703)
    assert scores[0].tolist() == pytest.approx([-nll_x, -nll_y, math.log(0.1) + math.log(0.99)], abs=1e-5)
    assert scores[1, 2].item() == pytest.approx(math.log(0.5) + math.log(0.99), abs=1e-5)


def test_top_k_restricts_to_most_probable_first_tokens():
    pred, scores = rank(k=1)  # question 0 keeps only X, question 1 only Z
    assert pred.tolist() == [0, 2]
    assert torch.isinf(scores).tolist() == [[False, True, True], [True, True, False]]
    pred, scores = rank(k=2)  # question 0: X, Y (Z out); question 1: Z, X (Y out)
    assert pred.tolist() == [1, 2]
    assert torch.isinf(scores).tolist() == [[False, False, True], [False, True, False]]
    assert first_token_topk(torch.zeros(2, 6), CANDS[:, 1], 99).shape == (2, 3)  # k = min(k, C)

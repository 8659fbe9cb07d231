import pytest
import torch

from vlp.config import ModelConfig, TextConfig, VisionConfig
from vlp.losses.vqa import vqa_loss
from vlp.models.vqa import VQAModel
from vlp.tasks.vqa import VQATask

CLS, SEP = 101, 102


def tiny_model(momentum: float = 0.995, hidden: int = 64) -> VQAModel:
    torch.manual_seed(0)
    text = TextConfig(layers=1, fusion_layers=1, hidden=hidden, heads=4, intermediate=2 * hidden, dropout=0.0)
    return VQAModel(
        ModelConfig(
            vision=VisionConfig(depth=1, width=64, heads=2), text=text, queue_size=0, embed_dim=8, momentum=momentum
        )
    )


def answers(*words: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """[CLS] words [SEP], right-padded with 0 -> ids, mask [A, L]."""
    L = max(len(w) for w in words) + 2
    ids = torch.zeros(len(words), L, dtype=torch.long)
    for i, w in enumerate(words):
        ids[i, : len(w) + 2] = torch.tensor([CLS, *w, SEP])
    return ids, (ids != 0).long()


# 4 questions; question 0 has a second, low-weight answer
ANSWERS = [[2000], [2001], [2002, 2003], [2003], [2005]]
ANSWER_QUESTION = torch.tensor([0, 1, 2, 3, 0])
WEIGHTS = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.3])


def make_batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    q_ids = torch.tensor(
        [
            [CLS, 2054, 3609, 102, 0],
            [CLS, 2129, 2116, 2024, SEP],
            [CLS, 2003, 2045, SEP, 0],
            [CLS, 2073, 2003, 1996, SEP],
        ]
    )
    a_ids, a_mask = answers(*ANSWERS)
    return dict(
        images=torch.randn(4, 3, 64, 64, generator=g),
        input_ids=q_ids,
        attention_mask=(q_ids != 0).long(),
        answer_ids=a_ids,
        answer_mask=a_mask,
        answer_weights=WEIGHTS,
        answer_question=ANSWER_QUESTION,
    )


def test_alpha_ramp_and_switch():
    m = tiny_model()
    assert VQATask(m, alpha=0.4, alpha_ramp_steps=10).alpha(5) == pytest.approx(0.2)
    assert VQATask(m, alpha=0.4, alpha_ramp_steps=10).alpha(50) == pytest.approx(0.4)
    assert VQATask(m, alpha=0.4).alpha(0) == pytest.approx(0.4)
    assert VQATask(m, alpha=0.4, distill=False).alpha(100) == 0.0


def test_task_loss_equals_repeated_question_states_and_momentum_distillation():
    m = tiny_model().eval()
    with torch.no_grad():  # a momentum twin that differs from the online model
        for p in m.momentum.twin.parameters():
            p.add_(0.05 * torch.randn_like(p))
    b = make_batch()
    out = VQATask(m, alpha=0.4)(b)
    with torch.no_grad():

        def logits(momentum: bool) -> torch.Tensor:
            q = m.encode_question(b["images"], b["input_ids"], b["attention_mask"], momentum)
            q_rep = q.index_select(0, ANSWER_QUESTION)  # question states repeated per answer
            q_mask = b["attention_mask"].index_select(0, ANSWER_QUESTION)
            return m.answer_logits(q_rep, q_mask, b["answer_ids"], b["answer_mask"], momentum)

        online, teacher = logits(False), logits(True)
    expected = vqa_loss(online, b["answer_ids"], b["answer_mask"], WEIGHTS, 4, teacher, 0.4)
    plain = vqa_loss(online, b["answer_ids"], b["answer_mask"], WEIGHTS, 4)
    assert out["loss"].item() == pytest.approx(expected.item(), rel=1e-5)
    assert out["vqa"].item() == pytest.approx(expected.item(), rel=1e-5)
    assert out["alpha"].item() == pytest.approx(0.4)
    assert abs(expected.item() - plain.item()) > 1e-3  # the momentum teacher does matter here
    assert VQATask(m, distill=False)(b)["loss"].item() == pytest.approx(plain.item(), rel=1e-5)


def test_training_reduces_loss_and_ranking_picks_the_trained_answers():
    # hidden 192: with hidden 64 the tied embeddings (std 0.02) give tiny logits and 30 steps are
    # not enough; a larger lr makes the post-LN layers unstable. Momentum 0.9 so the teacher follows.
    m = tiny_model(momentum=0.9, hidden=192)
    task = VQATask(m, alpha=0.4, alpha_ramp_steps=10)
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=2e-3, weight_decay=0.0)
    b = make_batch()
    losses = []
    for step in range(1, 31):
        out = task(b, step=step)
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
        task.after_optimizer_step(step)
        losses.append(out["vqa"].item())
    assert m.vision.patch_embed.proj.weight.grad is not None  # the encoder is trained too
    assert losses[-1] < 0.3 * losses[0], losses
    m.eval()
    cand_ids, cand_mask = answers([2000], [2001], [2002, 2003], [2003], [2005], [2004, 2000])
    with torch.no_grad():
        states = m.encode_question(b["images"], b["input_ids"], b["attention_mask"])
    for k in (2, 6):
        pred, scores = m.rank_answers(states, b["attention_mask"], cand_ids, cand_mask, k=k)
        assert pred.tolist() == [0, 1, 2, 3]  # each question's weight-1 answer (q0: not its 0.3 one)
        assert (torch.isfinite(scores).sum(1) == k).all()
    # question 0: its two answers' scores differ by about log(1 / 0.3), the ratio of their weights
    assert 0.5 < (scores[0, 0] - scores[0, 4]).item() < 2.5

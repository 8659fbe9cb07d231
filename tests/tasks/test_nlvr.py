import pytest
import torch
import torch.nn.functional as F

from tests.helpers import narrow_model_config
from vlp.losses.nlvr import assign_pairs, distilled_ce, hard_image_probs
from vlp.models.nlvr import NLVRModel
from vlp.tasks.nlvr import NLVRTask, TextAssignmentTask


def tiny(head: str = "cls") -> NLVRModel:
    torch.manual_seed(0)
    return NLVRModel(narrow_model_config(dropout=0.0), head)


def nlvr_batch(b: int = 4) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "images0": torch.randn(b, 3, 32, 32, generator=g),
        "images1": torch.randn(b, 3, 32, 32, generator=g),
        "input_ids": torch.randint(1000, 2000, (b, 6), generator=g),
        "attention_mask": torch.ones(b, 6, dtype=torch.long),
        "labels": torch.arange(b) % 2,
    }


# -- pure functions -------------------------------------------------------------------------------


def test_distilled_ce_numbers():
    logits = torch.tensor([[2.0, -1.0], [0.5, 0.5]], requires_grad=True)
    labels = torch.tensor([0, 1])
    m = torch.tensor([[0.0, 1.0], [3.0, 0.0]])
    ce = F.cross_entropy(logits, labels)
    soft = -(torch.softmax(m, -1) * torch.log_softmax(logits, -1)).sum(-1).mean()
    assert distilled_ce(logits, labels, m, 0.4).item() == pytest.approx((0.6 * ce + 0.4 * soft).item(), abs=1e-6)
    assert distilled_ce(logits, labels, m, 0.0).item() == pytest.approx(ce.item(), abs=1e-7)
    assert distilled_ce(logits, labels).item() == pytest.approx(ce.item(), abs=1e-7)
    # row 0: -(0.26894 * log 0.95257 + 0.73106 * log 0.04743) = 2.24176; row 1: log 2
    assert soft.item() == pytest.approx((2.24176 + 0.69315) / 2, abs=1e-4)


def test_hard_image_probs_masks_same_id_before_softmax_and_merges_ids():
    ids = torch.tensor([0, 0, 1, 2, 2])
    sim = torch.randn(5, 5, generator=torch.Generator().manual_seed(0)) * 3
    sim[0, 0] = sim[0, 1] = 1e4  # same image: must not underflow the row
    p = hard_image_probs(sim, ids)
    sm = torch.softmax(sim[0, 2:], 0)
    assert torch.allclose(p[0], torch.tensor([0.0, 0.0, sm[0], sm[1] + sm[2], 0.0]), atol=1e-6)
    assert (p[3] > 0).tolist() == [True, False, True, False, False]  # ids 0 and 1 at their first column
    nan = sim.clone()
    nan[2] = float("nan")  # no finite mass: uniform over the other ids
    assert torch.allclose(hard_image_probs(nan, ids)[2], torch.tensor([0.5, 0.0, 0.0, 0.5, 0.0]))


def test_assign_pairs_label_semantics_and_frequencies():
    b = 60
    ids = torch.arange(b) // 2 + 100  # two captions per image
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(3)
    for r in range(50):
        sim = torch.randn(b, b, generator=torch.Generator().manual_seed(r)) * 5
        idx0, idx1, labels = assign_pairs(sim, ids, g)
        counts += torch.bincount(labels, minlength=3)
        own = torch.arange(b)
        first, second, neither = labels == 0, labels == 1, labels == 2
        assert torch.equal(idx0[first], own[first]) and torch.equal(idx1[second], own[second])
        hard = torch.where(first, idx1, torch.where(second, idx0, idx1))
        assert (ids[hard] != ids).all()  # a hard image never has the own image id
        assert (ids[idx0[neither]] != ids[neither]).all() and (ids[idx1[neither]] != ids[neither]).all()
        assert (ids[idx0[neither]] != ids[idx1[neither]]).all()  # two distinct images
        assert (ids[idx0[first | second]] != ids[idx1[first | second]]).all()
    freq = counts / counts.sum()
    assert torch.allclose(freq, torch.full((3,), 1 / 3), atol=0.03), freq


def test_assign_pairs_follows_the_similarity_and_is_seeded():
    ids = torch.arange(4)
    sim = torch.zeros(4, 4)
    sim[0, 3] = 20.0  # image 3 is by far the hardest for text 0
    idx0, idx1, labels = assign_pairs(sim, ids, torch.Generator().manual_seed(1))
    draws = [assign_pairs(sim, ids, torch.Generator().manual_seed(s)) for s in range(40)]
    hard0 = [int(i1[0]) if int(lab[0]) == 0 else int(i0[0]) for i0, i1, lab in draws if int(lab[0]) < 2]
    assert hard0 and all(h == 3 for h in hard0)
    again = assign_pairs(sim, ids, torch.Generator().manual_seed(1))
    assert all(torch.equal(a, b) for a, b in zip((idx0, idx1, labels), again))


def test_assign_pairs_needs_three_image_ids():
    with pytest.raises(ValueError, match="at least 3 distinct image ids"):
        assign_pairs(torch.zeros(4, 4), torch.tensor([1, 1, 2, 2]))


# -- NLVR2 fine-tuning -----------------------------------------------------------------------------


def test_nlvr_task_loss_numbers():
    model = tiny()
    model.train(False)  # deterministic forward (twin included)
    with torch.no_grad():  # momentum differs from online: distillation is visible
        for p in model.momentum.parameters():
            p.add_(0.05 * torch.randn_like(p))
    batch = nlvr_batch()
    args = (batch["images0"], batch["images1"], batch["input_ids"], batch["attention_mask"])
    logits, logits_m = model.classify(*args), model.classify(*args, momentum=True)
    ce = F.cross_entropy(logits, batch["labels"])
    soft = -(torch.softmax(logits_m, -1) * torch.log_softmax(logits, -1)).sum(-1).mean()
    plain = NLVRTask(model, alpha=0.0)(batch)
    assert plain["loss"].item() == pytest.approx(ce.item(), abs=1e-5)
    assert NLVRTask(model, distill=False)(batch)["loss"].item() == pytest.approx(ce.item(), abs=1e-5)
    out = NLVRTask(model, alpha=0.4)(batch)
    assert out["loss"].item() == pytest.approx((0.6 * ce + 0.4 * soft).item(), abs=1e-5)
    assert out["alpha"].item() == pytest.approx(0.4)
    acc = (logits.argmax(-1) == batch["labels"]).float().mean()
    assert out["acc"].item() == pytest.approx(acc.item()) and set(out) == {"loss", "nlvr", "acc", "alpha"}
    ramp = NLVRTask(model, alpha=0.4, alpha_ramp_steps=100)
    assert ramp.alpha(25) == pytest.approx(0.1) and ramp.alpha(500) == pytest.approx(0.4)
    with pytest.raises(ValueError, match="head='cls'"):
        NLVRTask(tiny("ta"))


def test_nlvr_task_training_reduces_loss_and_updates_momentum():
    model = tiny()
    task = NLVRTask(model, alpha=0.4)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    batch = nlvr_batch()
    twin_before = model.momentum["cls_head"][0].weight.clone()
    losses, acc = [], []
    for step in range(1, 9):
        out = task(batch, step)
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
        task.after_optimizer_step(step)
        losses.append(out["loss"].item())
        acc.append(out["acc"].item())
    # the soft targets of a slow (m = 0.995) twin bound the distilled loss from below: ~0.46 here
    assert all(b < a for a, b in zip(losses, losses[1:])) and losses[-1] < 0.8 * losses[0], losses
    assert acc[-1] == 1.0, acc
    assert not torch.equal(model.momentum["cls_head"][0].weight, twin_before)
    assert model.momentum["cls_head"][0].weight.grad is None


# -- text assignment -------------------------------------------------------------------------------


def ta_batch(b: int = 6) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return {
        "images": torch.randn(b, 3, 32, 32, generator=g),
        "input_ids": torch.randint(1000, 2000, (b, 6), generator=g),
        "attention_mask": torch.ones(b, 6, dtype=torch.long),
        "image_ids": torch.tensor([5, 5, 6, 7, 8, 9])[:b],
    }


def test_text_assignment_loss_matches_manual_pairs():
    model = tiny("ta")
    model.train(False)
    task = TextAssignmentTask(model, seed=3)
    batch = ta_batch()
    out = task(batch)
    with torch.no_grad():
        tokens = model.vision.forward_features(batch["images"])
        feat = F.normalize(model.vision_proj(tokens[:, 0]), dim=-1)
        idx0, idx1, labels = assign_pairs(feat @ feat.T / 0.07, batch["image_ids"], torch.Generator().manual_seed(3))
        logits = model.pair_logits(tokens[idx0], tokens[idx1], batch["input_ids"], batch["attention_mask"])
    assert out["loss"].item() == pytest.approx(F.cross_entropy(logits, labels).item(), abs=1e-5)
    assert set(out) == {"loss", "ta", "acc"}
    out["loss"].backward()
    assert model.ta_head.weight.grad is not None and model.vision.cls_token.grad is not None
    assert model.vision_proj.weight.grad is None  # frozen: only used without gradient
    with pytest.raises(ValueError, match="at least 3 distinct image ids"):
        task({**batch, "image_ids": torch.tensor([1, 1, 1, 2, 2, 2])})

"""The straightforward reference step of ``scripts/bench/reference_step.py`` computes vlp's maths.

With the same weights, batch, hard negatives and MLM masks, its ITC/ITM/MLM losses and every
gradient equal those of :class:`vlp.tasks.pretrain.PretrainTask`; after an AdamW step, its
start-of-forward momentum loop leaves the same momentum weights and queue as vlp's fused update
after the step. Negative controls show the comparison can fail.
"""

import copy

import pytest
import torch

from tests.helpers import ROOT, TINY_ALBEF_32, load_script
from vlp.config import PretrainConfig, load_config
from vlp.models.albef import ALBEF
from vlp.tasks.objectives import TokenInfo
from vlp.tasks.pretrain import PretrainTask

rs = load_script("scripts/bench/reference_step.py")

TINY = [*TINY_ALBEF_32, "model.momentum_warmup_steps=0", "model.momentum=0.5", "loss.alpha_ramp_steps=0"]
TOKENS = TokenInfo(30522, 103, (0, 100, 101, 102, 103))
B = 8


def make_batch(seed: int) -> dict[str, torch.Tensor]:
    """Padded captions of different lengths; images 2 and 3 are the same image."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, 30000, (B, 10), generator=g)
    ids[:, 0] = 101
    mask = torch.ones(B, 10, dtype=torch.long)
    for i, n in enumerate([10, 7, 9, 5, 10, 8, 6, 10]):
        ids[i, n - 1], ids[i, n:], mask[i, n:] = 102, 0, 0
    return dict(
        images=torch.randn(B, 3, 32, 32, generator=g),
        input_ids=ids,
        attention_mask=mask,
        image_ids=torch.tensor([0, 1, 2, 2, 3, 4, 5, 6]),
    )


@pytest.fixture()
def pair():
    cfg = load_config(PretrainConfig, str(ROOT / "configs/pretrain/shapes_tiny.yaml"), TINY)
    torch.manual_seed(0)
    model = ALBEF(cfg.model)
    task = PretrainTask(model, cfg.loss, TOKENS, seed=3)
    ref = rs.ReferenceALBEFStep(copy.deepcopy(model), cfg.loss, TOKENS, seed=5)
    return cfg, task, ref


def vlp_step(task, batch, step):
    with rs.record_vlp_draws() as rec:
        out = task(batch, step=step)
    return out, rec["negatives"][0], rec["mlm"][0]


def assert_losses_equal(out, ref_out):
    for k in ("itc", "itm", "mlm", "loss"):
        assert float(ref_out[k].detach()) == pytest.approx(float(out[k].detach()), abs=1e-5, rel=1e-6), k


def test_reference_is_eager_and_structured_like_the_original(pair):
    _, task, ref = pair
    assert not any(getattr(m, "fused_attn", False) for m in ref.model.modules())
    assert any(getattr(m, "fused_attn", False) for m in task.model.modules())  # vlp's own model is untouched
    # one pair per distinct parameter: the MLM decoder tied to the word embeddings is updated once
    n_twin = sum(1 for _ in ref.model.momentum.twin.parameters())
    assert len(ref.pairs) == n_twin and len({id(p_m) for _, p_m in ref.pairs}) == n_twin
    # its own draws: negatives never show the anchor's image, masks never pick padding or specials
    ids = torch.tensor([0, 0, 1, 2])
    for _ in range(20):
        neg = ref.sample_negatives(torch.randn(4, 4), ids)
        assert neg[0] in (2, 3) and neg[1] in (2, 3) and neg[2] != 2 and neg[3] != 3
    assert ref.sample_negatives(torch.randn(2, 2), torch.tensor([7, 7])) == [0, 1]  # no negative: itself
    batch = make_batch(0)
    masked, labels = ref.mask(batch["input_ids"], batch["attention_mask"])
    sel = labels != -100
    assert not (sel & (batch["attention_mask"] == 0)).any()
    assert not (sel & torch.isin(batch["input_ids"], torch.tensor(TOKENS.special_ids))).any()
    assert torch.equal(labels[sel], batch["input_ids"][sel]) and torch.equal(masked[~sel], batch["input_ids"][~sel])


def test_same_losses_gradients_momentum_and_queue(pair):
    cfg, task, ref = pair
    # Plain SGD: AdamW's first step is lr * sign(grad), which turns float noise in near-zero
    # gradients into full-size differences (the optimizer is not what is compared here).
    opt_vlp = torch.optim.SGD(task.parameters(), lr=0.5)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.5)
    twin0 = [p.clone() for p in task.model.momentum.twin.parameters()]
    batch = make_batch(0)

    out, negatives, mlm = vlp_step(task, batch, 0)
    ref_out = ref(batch, step=0, negatives=negatives, mlm=mlm)
    assert_losses_equal(out, ref_out)
    assert out["mlm"].detach().item() > 0 and (mlm[1] != -100).sum() > 0 and out["itm"].detach().item() > 0

    out["loss"].backward()
    ref_out["loss"].backward()
    grads_vlp = dict(task.model.named_parameters())
    grads_ref = dict(ref.model.named_parameters())
    checked = 0
    for name, p in grads_vlp.items():
        if p.grad is None:
            continue
        q = grads_ref[name].grad
        scale = p.grad.abs().max().item()
        assert (q - p.grad).abs().max().item() <= 1e-4 * scale + 1e-7, name
        checked += 1
    assert checked > 40 and {
        "temp",
        "itm_head.weight",
        "fusion.layer.0.crossattention.self.kv.weight",
        "text.embeddings.word_embeddings.weight",
    } <= {n for n, p in grads_vlp.items() if p.grad is not None and p.grad.abs().max() > 0}

    # one optimizer step each; vlp updates the momentum twin now, the reference at its next forward
    opt_vlp.step()
    opt_ref.step()
    opt_vlp.zero_grad(set_to_none=True)
    opt_ref.zero_grad(set_to_none=True)
    task.after_optimizer_step(1)
    ref_params = dict(ref.model.named_parameters())
    for n, p in task.model.named_parameters():
        if p.requires_grad:  # online weights (the reference's twin moves at its next forward)
            assert torch.allclose(p, ref_params[n], atol=1e-5), n
    q_vlp, q_ref = task.model.queue, ref.model.queue
    for name in ("image", "text", "ids", "ptr"):
        assert torch.allclose(getattr(q_vlp, name).float(), getattr(q_ref, name).float(), atol=1e-6), name
    assert int(q_vlp.ptr) == B and torch.equal(q_vlp.ids[:B], batch["image_ids"])

    batch1 = make_batch(1)
    out1, negatives1, mlm1 = vlp_step(task, batch1, 1)
    ref_out1 = ref(batch1, step=1, negatives=negatives1, mlm=mlm1)  # its momentum loop runs first
    moved = 0.0
    for p, q, p0 in zip(task.model.momentum.twin.parameters(), ref.model.momentum.twin.parameters(), twin0):
        assert (p - q).abs().max().item() <= 1e-5
        moved = max(moved, (p - p0).abs().max().item())
    assert moved > 1e-3  # the twin really moved: a missing update would be caught
    assert_losses_equal(out1, ref_out1)  # queue now holds the first batch's momentum features


def test_comparison_can_fail(pair):
    _, task, ref = pair
    batch = make_batch(0)
    out, (neg_img, neg_txt), (masked, labels) = vlp_step(task, batch, 0)
    other_mask = ref.mask(batch["input_ids"], batch["attention_mask"])

    queue = {k: v.clone() for k, v in ref.model.queue.state_dict().items()}

    def run(model_ref, negatives, mlm):  # each call starts from the same queue
        model_ref.model.queue.load_state_dict(queue)
        with torch.no_grad():
            return model_ref(batch, step=0, negatives=negatives, mlm=mlm)

    assert abs(float(run(ref, (neg_img.roll(1), neg_txt), (masked, labels))["itm"]) - float(out["itm"].detach())) > 1e-4
    assert abs(float(run(ref, (neg_img, neg_txt), other_mask)["mlm"]) - float(out["mlm"].detach())) > 1e-3
    with torch.no_grad():  # a perturbed weight shows in ITC
        ref.model.text_proj.weight[0, 0] += 0.1
    assert abs(float(run(ref, (neg_img, neg_txt), (masked, labels))["itc"]) - float(out["itc"].detach())) > 1e-4


def test_batch_of_one_image_has_no_itm_negatives(pair):
    _, task, ref = pair
    batch = make_batch(2)
    batch["image_ids"] = torch.full((B,), 4)  # every caption of one image: only the B positives count
    out, negatives, mlm = vlp_step(task, batch, 0)
    with torch.no_grad():
        assert_losses_equal(out, ref(batch, step=0, negatives=negatives, mlm=mlm))

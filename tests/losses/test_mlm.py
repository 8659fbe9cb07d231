import torch

from vlp.losses.mlm import mask_tokens, mlm_loss

CLS, SEP, PAD, MASK, V = 101, 102, 0, 103, 30522


def batch(b=64, t=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, 30000, (b, t), generator=g)
    lengths = torch.randint(5, t, (b,), generator=g)
    mask = (torch.arange(t)[None] < lengths[:, None]).long()
    ids[:, 0] = CLS
    ids[torch.arange(b), lengths - 1] = SEP
    ids = ids * mask  # padding id 0
    return ids, mask


def test_masking_rates_and_exclusions():
    ids, mask = batch(512, 40)
    masked, labels = mask_tokens(ids, mask, (CLS, SEP, PAD), MASK, V, 0.15, torch.Generator().manual_seed(1))
    sel = labels != -100
    selectable = mask.bool() & (ids != CLS) & (ids != SEP)
    assert not (sel & ~selectable).any()  # never padding, [CLS] or [SEP]
    assert (labels[sel] == ids[sel]).all()
    rate = sel.sum().item() / selectable.sum().item()
    assert abs(rate - 0.15) < 0.01
    n = sel.sum().item()
    to_mask = (masked[sel] == MASK).sum().item() / n
    unchanged = (masked[sel] == ids[sel]).sum().item() / n
    assert abs(to_mask - 0.8) < 0.03
    assert abs(unchanged - 0.1) < 0.03  # (a random token equal to the original is ~1e-4)
    assert abs(1 - to_mask - unchanged - 0.1) < 0.03
    assert torch.equal(masked[~sel], ids[~sel])  # unselected tokens untouched


def test_probability_zero_and_one():
    ids, mask = batch(8, 12)
    _, labels = mask_tokens(ids, mask, (CLS, SEP, PAD), MASK, V, 0.0)
    assert (labels == -100).all()
    _, labels = mask_tokens(ids, mask, (CLS, SEP, PAD), MASK, V, 1.0)
    assert ((labels != -100) == (mask.bool() & (ids != CLS) & (ids != SEP))).all()


def test_mlm_loss_against_brute_force_vocab_axis():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 7, generator=g, dtype=torch.float64, requires_grad=True)
    mom = torch.randn(5, 7, generator=g, dtype=torch.float64)
    labels = torch.tensor([0, 3, 6, 2, 2])
    alpha = 0.4
    ce = sum(-(logits[i, labels[i]] - torch.logsumexp(logits[i], 0)) for i in range(5)) / 5
    d = sum(-(torch.softmax(mom[i], 0) * (logits[i] - torch.logsumexp(logits[i], 0))).sum() for i in range(5)) / 5
    ref = (1 - alpha) * ce + alpha * d
    ours = mlm_loss(logits, labels, mom, alpha)
    assert torch.allclose(ours.double(), ref, atol=1e-6)
    assert torch.allclose(torch.autograd.grad(ours, logits)[0].double(), torch.autograd.grad(ref, logits)[0], atol=1e-6)
    assert torch.allclose(mlm_loss(logits, labels).double(), ce, atol=1e-6)


def test_mlm_loss_empty_selection_is_zero_with_gradient():
    logits = torch.zeros(0, 7, requires_grad=True)
    loss = mlm_loss(logits, torch.zeros(0, dtype=torch.long))
    assert loss.item() == 0.0 and loss.requires_grad

import torch
from torch import nn

from vlp.models.momentum import FeatureQueue, MomentumTwin


def test_queue_wraps_around_with_any_batch_size():
    q = FeatureQueue(5, dict(a=2))
    for step, n in enumerate([3, 3, 3]):  # 9 entries through a queue of 5: no divisibility needed
        ids = torch.arange(n) + 10 * step
        q.enqueue(ids, a=torch.stack([ids.float(), -ids.float()], 1))
    # writes: slots 0,1,2 <- 0,1,2 ; 3,4,0 <- 10,11,12 ; 1,2,3 <- 20,21,22
    assert q.ids.tolist() == [12, 20, 21, 22, 11]
    assert q.get("a")[:, 0].tolist() == [12.0, 20.0, 21.0, 22.0, 11.0]
    assert q.ptr.item() == 4


def test_queue_batch_larger_than_queue_keeps_newest():
    q = FeatureQueue(3, dict(a=1))
    q.enqueue(torch.arange(7), a=torch.arange(7).float()[:, None])
    assert sorted(q.ids.tolist()) == [4, 5, 6]
    assert q.ptr.item() == 0


def test_queue_init_is_normalised_and_ids_never_real():
    q = FeatureQueue(16, dict(a=8))
    assert torch.allclose(q.get("a").norm(dim=1), torch.ones(16))
    assert (q.ids == -100).all()


def test_ema_update_values_and_tied_weights():
    emb = nn.Embedding(4, 3)
    head = nn.Linear(3, 4, bias=False)
    head.weight = emb.weight  # tied, as the MLM decoder is
    lin = nn.Linear(3, 3)
    twin = MomentumTwin(dict(emb=emb, head=head, lin=lin), momentum=0.9)
    assert twin["head"].weight is twin["emb"].weight  # tie preserved in the copy
    assert not any(p.requires_grad for p in twin.parameters())
    before = {k: v.clone() for k, v in twin.state_dict().items()}
    with torch.no_grad():
        for p in (emb.weight, lin.weight, lin.bias):
            p.add_(1.0)
    twin.update()
    for name, online in (("emb.weight", emb.weight), ("lin.weight", lin.weight), ("lin.bias", lin.bias)):
        expected = 0.9 * before[f"twin.{name}"] + 0.1 * online.detach()
        assert torch.allclose(twin.state_dict()[f"twin.{name}"], expected, atol=1e-6)
    twin.copy_from_online()
    assert torch.equal(twin["lin"].weight, lin.weight.detach())


def test_momentum_twin_stays_fp32_with_bf16_online():
    lin = nn.Linear(4, 4).to(torch.bfloat16)
    twin = MomentumTwin(dict(lin=lin), momentum=0.995)
    assert twin["lin"].weight.dtype == torch.float32
    twin.update()
    assert twin["lin"].weight.dtype == torch.float32


def test_the_sync_free_ema_in_groups_equals_lerp_and_a_skipped_step_keeps_the_twin():
    """The loop's EMA gets its skip flag as a device tensor: twin += w (online - twin) in groups of
    at most ``EMA_CHUNK`` elements (here tiny: a tensor alone, then three together)."""
    torch.manual_seed(0)
    online = {"a": nn.Linear(300, 200), "b": nn.Linear(50, 7)}
    twin = MomentumTwin(online, 0.9)
    twin.EMA_CHUNK = 1000
    assert twin._chunks() == [(0, 1), (1, 4)]
    with torch.no_grad():
        for p in [*online["a"].parameters(), *online["b"].parameters()]:
            p.add_(torch.randn_like(p))
    want = [t + 0.1 * (o - t) for t, o in zip(twin._twin_params, twin._online_params)]
    twin.update(None, torch.tensor(False))
    assert all(torch.allclose(t, w, atol=1e-6) for t, w in zip(twin._twin_params, want))
    kept = [t.clone() for t in twin._twin_params]
    twin.update(None, torch.tensor(True))
    assert all(torch.equal(t, k) for t, k in zip(twin._twin_params, kept))

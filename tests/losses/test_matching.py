import torch

from vlp.losses.matching import itm_loss, race_noise, sample_hard_negatives


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def test_dominant_diagonal_never_crashes_and_never_picks_positive():
    sim = torch.full((8, 8), -50.0)
    sim.fill_diagonal_(1e4)  # softmax-then-zero (ALBEF) underflows every row here
    idx, valid = sample_hard_negatives(sim, None, gen())
    assert valid.all()
    assert (idx != torch.arange(8)).all()


def test_same_image_candidates_are_masked():
    ids = torch.tensor([0, 0, 1, 1, 2])
    sim = torch.zeros(5, 5)
    sim[0, 1] = sim[2, 3] = 100.0  # the most similar candidates share the anchor's image
    for s in range(20):
        idx, valid = sample_hard_negatives(sim, ids, gen(s))
        assert valid.all()
        assert (ids[idx] != ids).all()


def test_all_candidates_from_same_image_is_flagged_invalid():
    ids = torch.tensor([3, 3, 3])
    idx, valid = sample_hard_negatives(torch.randn(3, 3), ids, gen())
    assert not valid.any()
    assert (idx == torch.arange(3)).all()


def test_batch_of_one():
    idx, valid = sample_hard_negatives(torch.tensor([[0.7]]), None, gen())
    assert idx.tolist() == [0] and valid.tolist() == [False]


def test_nan_and_minus_inf_rows_fall_back_to_uniform_over_valid():
    sim = torch.zeros(3, 3)
    sim[0] = float("nan")
    sim[1] = float("-inf")
    counts = torch.zeros(3, 3)
    for s in range(300):
        idx, valid = sample_hard_negatives(sim, None, gen(s))
        assert valid.all()
        counts[torch.arange(3), idx] += 1
    assert counts.diagonal().sum() == 0
    # row 0 and 1: uniform over the two valid columns
    assert (counts[0, 1:] > 100).all() and (counts[1, [0, 2]] > 100).all()


def test_sampling_frequencies_follow_softmax_of_valid_entries():
    sim = torch.tensor([[9.0, 0.0, 1.0, 2.0]]).repeat(4, 1)  # row 0: the diagonal (9) is masked
    g = gen(1)
    n = 3000
    draws = torch.stack([sample_hard_negatives(sim, None, g)[0][0] for _ in range(n)])
    freq = torch.bincount(draws, minlength=4).float() / n
    assert freq[0] == 0
    assert torch.allclose(freq[1:], torch.softmax(torch.tensor([0.0, 1.0, 2.0]), 0), atol=0.03)


def test_itm_loss_ignores_invalid_rows():
    logits = torch.tensor([[0.0, 5.0], [5.0, 0.0], [100.0, -100.0]])
    labels = torch.tensor([1, 0, 1])
    valid = torch.tensor([True, True, False])
    expected = torch.nn.functional.cross_entropy(logits[:2], labels[:2])
    assert torch.allclose(itm_loss(logits, labels, valid), expected)
    assert torch.allclose(itm_loss(logits, labels), torch.nn.functional.cross_entropy(logits, labels))


def test_hardness_scales_the_sampling_logits():
    sim = torch.tensor([[9.0, 0.0, 1.0, 4.0]]).repeat(4, 1)
    n = 3000
    # hardness 0: uniform random negatives over the valid columns (the diagonal stays masked)
    g = gen(2)
    draws = torch.stack([sample_hard_negatives(sim, None, g, hardness=0.0)[0][0] for _ in range(n)])
    freq = torch.bincount(draws, minlength=4).float() / n
    assert freq[0] == 0 and torch.allclose(freq[1:], torch.full((3,), 1 / 3), atol=0.03)
    # hardness 0.5: softmax of half the logits
    g = gen(3)
    draws = torch.stack([sample_hard_negatives(sim, None, g, hardness=0.5)[0][0] for _ in range(n)])
    freq = torch.bincount(draws, minlength=4).float() / n
    assert torch.allclose(freq[1:], torch.softmax(torch.tensor([0.0, 0.5, 2.0]), 0), atol=0.03)
    # hardness 1 is ALBEF's sampling, draw for draw
    s = torch.randn(6, 6, generator=gen(4)) * 5
    assert torch.equal(
        sample_hard_negatives(s, None, gen(5))[0], sample_hard_negatives(s, None, gen(5), hardness=1.0)[0]
    )


def test_the_exponential_race_is_multinomials_draw_without_its_sync():
    """``argmax(p / q)``, q ~ Exp(1), is torch.multinomial(p, 1)'s own algorithm: the same columns
    from the same generator state (so the ITM negatives did not change when multinomial went)."""
    for seed in range(5):
        p = torch.rand(6, 9, generator=gen(100 + seed)) ** 4
        p[2] = 0.0
        p[2, 5] = 1.0  # a one-hot row
        want = torch.multinomial(p, 1, generator=gen(seed)).squeeze(1)
        assert torch.equal((p / race_noise(6, 9, p.device, gen(seed))).argmax(1), want)
    sim, ids = torch.randn(5, 5), torch.tensor([0, 0, 1, 2, 3])
    drawn = sample_hard_negatives(sim, ids, gen(7))
    given = sample_hard_negatives(sim, ids, noise=race_noise(5, 5, sim.device, gen(7)))
    assert all(torch.equal(a, b) for a, b in zip(drawn, given))

"""Suppression probes (vlp.lab.probes, vlp.lab.minimal_pairs) on constructed embeddings: linear probes, majority baseline,
grouped splits, minimal-pair accuracy."""

import pytest
import torch

from vlp.lab.minimal_pairs import minimal_pair_accuracy
from vlp.lab.probes import grouped_split, majority_accuracy, probe_accuracy


def _labels(n: int, probs: list[float], seed: int) -> torch.Tensor:
    return torch.multinomial(torch.tensor(probs), n, replacement=True, generator=torch.Generator().manual_seed(seed))


def _halves(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
    n = len(y) // 2
    return x[:n], y[:n], x[n:], y[n:]


def test_grouped_split_keeps_each_group_in_one_half_and_is_seeded() -> None:
    groups = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3, 4, 5])
    train, test = grouped_split(groups, 0.5, seed=1)
    assert sorted(torch.cat([train, test]).tolist()) == list(range(10))
    assert not set(groups[train].tolist()) & set(groups[test].tolist())
    assert len(set(groups[test].tolist())) == 3  # round(0.5 * 6 groups)
    again = grouped_split(groups, 0.5, seed=1)
    assert torch.equal(again[0], train) and torch.equal(again[1], test)
    other = [grouped_split(groups, 0.5, seed=s)[1].tolist() for s in range(5)]
    assert len({tuple(t) for t in other}) > 1
    with pytest.raises(ValueError):
        grouped_split(groups, 1.0)


def test_majority_baseline_hand_worked() -> None:
    assert majority_accuracy(torch.tensor([0, 1, 1, 2]), torch.tensor([1, 1, 0, 2, 1])) == pytest.approx(3 / 5)
    assert majority_accuracy(torch.tensor([2, 0]), torch.tensor([0, 2, 2])) == pytest.approx(1 / 3)  # tie: lowest


def test_a_label_encoded_in_one_dimension_is_read_perfectly() -> None:
    g = torch.Generator().manual_seed(0)
    y = _labels(600, [0.5, 0.3, 0.2], seed=1)
    x = torch.randn(600, 12, generator=g)
    x[:, 5] = y.float() * 3.0  # three ordered values along one axis (the middle class needs a multinomial probe)
    assert probe_accuracy(*_halves(x, y)) == 1.0


def test_noise_and_an_erased_attribute_stay_at_the_majority_baseline() -> None:
    g = torch.Generator().manual_seed(0)
    a, b = _labels(600, [0.6, 0.25, 0.15], seed=2), _labels(600, [0.4, 0.3, 0.3], seed=3)
    noise = torch.randn(600, 12, generator=g)
    xtr, atr, xte, ate = _halves(noise, a)
    acc, majority = probe_accuracy(xtr, atr, xte, ate), majority_accuracy(atr, ate)
    assert majority == pytest.approx(0.6, abs=0.05) and acc <= majority + 0.03
    # b is written into the embedding, a (independent of b) is erased from it: b is read, a is not
    x = noise.clone()
    x[:, :3] += 8.0 * torch.nn.functional.one_hot(b, 3).float()
    assert probe_accuracy(*_halves(x, b)) == 1.0
    xtr, atr, xte, ate = _halves(x, a)
    assert probe_accuracy(xtr, atr, xte, ate) <= majority_accuracy(atr, ate) + 0.03


def test_probe_is_deterministic_and_needs_rows() -> None:
    g = torch.Generator().manual_seed(4)
    x, y = torch.randn(80, 6, generator=g), _labels(80, [0.5, 0.5], seed=5)
    assert probe_accuracy(*_halves(x, y)) == probe_accuracy(*_halves(x, y))
    with pytest.raises(ValueError):
        probe_accuracy(x[:0], y[:0], x, y)


def test_minimal_pair_accuracy_hand_worked() -> None:
    text = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    target = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    distractors = torch.tensor(
        [
            [[0.0, 1.0], [3.0, 0.0]],  # caption 0: loses to its target (1), ties it after normalising (1/2)
            [[0.0, 2.0], [5.0, -1.0]],  # caption 1: beats its target (0); the second slot is padding
        ]
    )
    valid = torch.tensor([[True, True], [True, False]])
    assert minimal_pair_accuracy(text, target, distractors, valid) == pytest.approx((1 + 0.5 + 0) / 3)
    assert minimal_pair_accuracy(text, target, distractors, torch.tensor([[True, False], [False, False]])) == 1.0
    with pytest.raises(ValueError):
        minimal_pair_accuracy(text, target, distractors, torch.zeros(2, 2, dtype=torch.bool))


def test_minimal_pair_accuracy_of_identical_images_is_chance() -> None:
    g = torch.Generator().manual_seed(0)
    text, img = torch.randn(5, 8, generator=g), torch.randn(5, 8, generator=g)
    assert minimal_pair_accuracy(text, img, img[:, None].expand(5, 3, 8), torch.ones(5, 3, dtype=torch.bool)) == 0.5

"""Suppression probes on frozen embeddings: linear probes, the majority baseline, minimal-pair accuracy.

Metrics take tensors, never models (the commands in :mod:`vlp.runs.probes` embed the captions
and images). Everything is computed on the CPU in float64 and is deterministic: the probe is a
multinomial logistic regression fitted full-batch by L-BFGS from zero weights.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = [
    "grouped_split",
    "standardize",
    "fit_linear_probe",
    "probe_accuracy",
    "majority_accuracy",
    "minimal_pair_accuracy",
]


def grouped_split(groups: torch.Tensor, test_fraction: float = 0.5, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Split rows into train and test by group: ``groups`` [N] long -> (train rows, test rows), each
    sorted [N_train] / [N_test] long. The distinct groups are shuffled by ``seed`` and the first
    ``round(test_fraction * n_groups)`` go to the test half, so no group is in both halves."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    uniq, inverse = torch.unique(groups.cpu(), return_inverse=True)
    order = torch.randperm(len(uniq), generator=torch.Generator().manual_seed(seed))
    is_test = torch.zeros(len(uniq), dtype=torch.bool)
    is_test[order[: round(test_fraction * len(uniq))]] = True
    rows = torch.arange(len(groups))
    return rows[~is_test[inverse]], rows[is_test[inverse]]


def standardize(x_train: torch.Tensor, x_test: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Both [N, E] -> float64, centred and scaled per dimension by the training rows' mean and
    standard deviation (a constant dimension is left at 0)."""
    x_train, x_test = x_train.detach().double().cpu(), x_test.detach().double().cpu()
    mean, std = x_train.mean(0), x_train.std(0, unbiased=False)
    std = torch.where(std > 1e-12, std, torch.ones_like(std))
    return (x_train - mean) / std, (x_test - mean) / std


def fit_linear_probe(
    x: torch.Tensor, y: torch.Tensor, n_classes: int, weight_decay: float = 1e-2, max_iter: int = 200
) -> tuple[torch.Tensor, torch.Tensor]:
    """Multinomial logistic regression: ``x`` [N, E] (float64), ``y`` [N] long in [0, n_classes) ->
    weights [E, C], bias [C] minimising ``mean CE(x W + b, y) + weight_decay / 2 * ||W||^2``
    (bias not decayed), full-batch L-BFGS (strong Wolfe line search) from zero."""
    w = torch.zeros(x.shape[1], n_classes, dtype=torch.float64, requires_grad=True)
    b = torch.zeros(n_classes, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], lr=1.0, max_iter=max_iter, tolerance_grad=1e-9, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(x @ w + b, y) + 0.5 * weight_decay * w.pow(2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return w.detach(), b.detach()


def probe_accuracy(
    x_train: torch.Tensor,
    y_train: torch.Tensor,
    x_test: torch.Tensor,
    y_test: torch.Tensor,
    weight_decay: float = 1e-2,
    max_iter: int = 200,
) -> float:
    """Test accuracy of a linear probe: ``x_train`` [N, E], ``y_train`` [N] long, ``x_test`` [M, E],
    ``y_test`` [M] long. Features are standardised by the training rows (:func:`standardize`), the
    probe fitted by :func:`fit_linear_probe` on the training rows, and the share of test rows whose
    arg-max class is their label returned (ties: the lowest class index)."""
    if len(x_train) == 0 or len(x_test) == 0:
        raise ValueError("probe_accuracy needs training and test rows")
    xtr, xte = standardize(x_train, x_test)
    y_train, y_test = y_train.long().cpu(), y_test.long().cpu()
    n_classes = int(max(y_train.max(), y_test.max())) + 1
    w, b = fit_linear_probe(xtr, y_train, n_classes, weight_decay, max_iter)
    return float(((xte @ w + b).argmax(1) == y_test).double().mean())


def majority_accuracy(y_train: torch.Tensor, y_test: torch.Tensor) -> float:
    """The majority-class baseline: the share of ``y_test`` [M] equal to the most frequent label of
    ``y_train`` [N] (ties: the lowest label)."""
    majority = torch.bincount(y_train.long().cpu()).argmax()
    return float((y_test.long().cpu() == majority).double().mean())


def minimal_pair_accuracy(
    text: torch.Tensor, target_img: torch.Tensor, distractor_img: torch.Tensor, valid: torch.Tensor
) -> float:
    """Share of (caption, distractor) pairs in which the caption scores its target image above the
    distractor; a tie counts 1/2, so chance is 0.5.

    ``text`` [N, E] caption embeddings, ``target_img`` [N, E] their images, ``distractor_img``
    [N, K, E] up to K distractor images per caption, ``valid`` [N, K] bool (False: padding).
    The score is the cosine similarity (fp32; inputs need not be normalised)."""
    if not bool(valid.any()):
        raise ValueError("minimal_pair_accuracy needs at least one valid pair")
    images = torch.cat([target_img[:, None], distractor_img], 1).float()  # [N, 1 + K, E]: one product for all
    s = torch.einsum("ne,nke->nk", F.normalize(text.float(), dim=-1), F.normalize(images, dim=-1))
    s_target, s_distractor = s[:, :1], s[:, 1:]
    won = (s_target > s_distractor).float() + 0.5 * (s_target == s_distractor).float()
    return float(won[valid].mean())

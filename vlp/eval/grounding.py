"""Box maths of weakly supervised visual grounding (ALBEF's RefCOCO+ protocol): IoU, scoring
candidate boxes by a patch heat map, accuracy, and two baselines. Tensors in, no models.

Boxes are ``[x, y, w, h]`` in pixels of the original image (:mod:`vlp.data.grounding`) and are
computed in float64 (exact for pixel coordinates, so an IoU of exactly 0.5 counts); heat maps and
scores are float32.

- :func:`box_iou`: continuous IoU, ``|A ∩ B| / (wA hA + wB hB - |A ∩ B|)``.
- :func:`box_scores`: ALBEF's ``grounding_eval`` (``dataset/utils.py``): the [h, w] patch map is
  upsampled to the image's [H, W] pixels (bicubic, ``align_corners=False``) and each box scores
  ``sum of the map over rows int(y) .. int(y + h) - 1, columns int(x) .. int(x + w) - 1`` divided
  by ``(w h) ** alpha`` with ``alpha = 0.5``; the best-scoring box is the model's choice.
- :func:`grounding_accuracy`: % of chosen boxes with IoU >= 0.5 with the target.
- :func:`random_candidate_accuracy`: the expected accuracy of a uniform pick among the candidates.
- :func:`fixed_position_prior` / :func:`prior_accuracy`: always pick the candidate whose centre
  is nearest one fixed point (in fractions of the image width and height), the point being the
  best of a grid on the training split.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.nn.functional as F

__all__ = [
    "ALBEF_AREA_EXPONENT",
    "PositionPrior",
    "box_iou",
    "box_scores",
    "choose_box",
    "fixed_position_prior",
    "grounding_accuracy",
    "paired_iou",
    "prior_accuracy",
    "random_candidate_accuracy",
]

#: ALBEF's ``alpha`` of ``grounding_eval`` (``Grounding.py`` passes 0.5): score = sum / area ** alpha
ALBEF_AREA_EXPONENT = 0.5


def _boxes(x: Any) -> torch.Tensor:
    """``x`` as a float64 tensor [..., 4] of xywh boxes."""
    t = torch.as_tensor(x, dtype=torch.float64)
    if t.shape[-1:] != (4,):
        raise ValueError(f"expected boxes [..., 4] (x, y, w, h), got shape {tuple(t.shape)}")
    return t


def _iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """IoU of broadcastable float64 box tensors a [..., 4], b [..., 4] -> [...]."""
    ix = (torch.minimum(a[..., 0] + a[..., 2], b[..., 0] + b[..., 2]) - torch.maximum(a[..., 0], b[..., 0])).clamp(
        min=0
    )
    iy = (torch.minimum(a[..., 1] + a[..., 3], b[..., 1] + b[..., 3]) - torch.maximum(a[..., 1], b[..., 1])).clamp(
        min=0
    )
    inter = ix * iy
    return inter / (a[..., 2] * a[..., 3] + b[..., 2] * b[..., 3] - inter)


def box_iou(a: Any, b: Any) -> torch.Tensor:
    """IoU of every box of ``a`` [N, 4] with every box of ``b`` [M, 4] (xywh) -> float64 [N, M]."""
    a, b = _boxes(a), _boxes(b)
    return _iou(a[:, None, :], b[None, :, :])


def paired_iou(a: Any, b: Any) -> torch.Tensor:
    """IoU of ``a[i]`` with ``b[i]``: boxes [N, 4], [N, 4] (xywh) -> float64 [N]."""
    a, b = _boxes(a), _boxes(b)
    if a.shape != b.shape:
        raise ValueError(f"paired boxes must have the same shape, got {tuple(a.shape)} and {tuple(b.shape)}")
    return _iou(a, b)


def box_scores(
    heatmap: torch.Tensor, boxes: Any, image_size: tuple[int, int], alpha: float = ALBEF_AREA_EXPONENT
) -> torch.Tensor:
    """ALBEF's score of each box [M, 4] (xywh, pixels) under a patch heat map [h, w] of an image of
    ``image_size`` (W, H) pixels -> float32 [M] (module docstring).

    The map is upsampled bicubically to [H, W]; a box sums it over rows ``int(y) .. int(y + h) - 1``
    and columns ``int(x) .. int(x + w) - 1`` (clipped to the image; ALBEF's slicing would wrap a
    negative corner round the image) and divides by ``(w h) ** alpha``, the box's own area.
    """
    if heatmap.dim() != 2:
        raise ValueError(f"expected a heat map [h, w], got shape {tuple(heatmap.shape)}")
    width, height = image_size
    b = _boxes(boxes).to(heatmap.device)
    if b.dim() != 2 or not bool((b[:, 2:] > 0).all()):
        raise ValueError("expected boxes [M, 4] with width and height > 0")
    up = F.interpolate(heatmap.float()[None, None], size=(height, width), mode="bicubic", align_corners=False)[0, 0]
    integral = F.pad(up.double().cumsum(0).cumsum(1), (1, 0, 1, 0))  # [H + 1, W + 1]: sums of up[:y, :x]
    x0 = b[:, 0].trunc().clamp(0, width).long()
    y0 = b[:, 1].trunc().clamp(0, height).long()
    x1 = torch.maximum((b[:, 0] + b[:, 2]).trunc().clamp(0, width).long(), x0)
    y1 = torch.maximum((b[:, 1] + b[:, 3]).trunc().clamp(0, height).long(), y0)
    inside = integral[y1, x1] - integral[y0, x1] - integral[y1, x0] + integral[y0, x0]
    return (inside / (b[:, 2] * b[:, 3]) ** alpha).float()


def choose_box(
    heatmap: torch.Tensor, boxes: Any, image_size: tuple[int, int], alpha: float = ALBEF_AREA_EXPONENT
) -> int:
    """The index of the best-scoring box of [M, 4] under :func:`box_scores` (the first on ties;
    ALBEF keeps only scores > 0 and leaves the previous choice otherwise, a bug not repeated)."""
    return int(box_scores(heatmap, boxes, image_size, alpha).argmax())


def grounding_accuracy(chosen: Any, targets: Any, threshold: float = 0.5) -> float:
    """% of chosen boxes [N, 4] whose IoU with their target [N, 4] is >= ``threshold``."""
    iou = paired_iou(chosen, targets)
    if iou.numel() == 0:
        raise ValueError("no boxes to score")
    return 100.0 * float((iou >= threshold).double().mean())


def _per_example(candidates: Sequence[Any], targets: Any) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Candidate lists ([M_i, 4] each, M_i >= 1) and targets [N, 4] as float64, checked to pair up."""
    cands = [_boxes(c).reshape(-1, 4) for c in candidates]
    t = _boxes(targets).reshape(-1, 4)
    if len(cands) != len(t) or not cands:
        raise ValueError(f"{len(cands)} candidate lists but {len(t)} targets (expected the same, > 0)")
    if any(len(c) == 0 for c in cands):
        raise ValueError("every example needs at least one candidate box")
    return cands, t


def random_candidate_accuracy(candidates: Sequence[Any], targets: Any, threshold: float = 0.5) -> float:
    """Expected accuracy (%) of picking one of each example's candidates [M_i, 4] uniformly at
    random: the mean over examples of the share of candidates with IoU >= ``threshold`` with the
    target [N, 4]."""
    cands, t = _per_example(candidates, targets)
    shares = [float((_iou(c, tgt[None]) >= threshold).double().mean()) for c, tgt in zip(cands, t)]
    return 100.0 * sum(shares) / len(shares)


@dataclass(frozen=True)
class PositionPrior:
    """A fixed point (x, y) in fractions of the image width and height, and its accuracy (%) on
    the split it was fitted on."""

    point: tuple[float, float]
    train_accuracy: float


def _centres(boxes: torch.Tensor, image_size: Sequence[float]) -> torch.Tensor:
    """Box centres [M, 2] in fractions of the image (W, H)."""
    size = torch.as_tensor(image_size, dtype=torch.float64)
    return (boxes[:, :2] + boxes[:, 2:] / 2) / size


def _prior_hits(
    points: torch.Tensor, cands: torch.Tensor, target: torch.Tensor, size: Sequence[float], threshold: float
) -> torch.Tensor:
    """For each point [P, 2], is the candidate [M, 4] with the nearest centre a hit on the target [4]? -> bool [P]."""
    squared = ((points[:, None, :] - _centres(cands, size)[None, :, :]) ** 2).sum(-1)  # [P, M]
    nearest = squared.argmin(dim=1)  # first on ties
    return _iou(cands, target[None])[nearest] >= threshold


def _sizes(image_sizes: Sequence[Sequence[float]], n: int) -> list[Sequence[float]]:
    if len(image_sizes) != n:
        raise ValueError(f"{len(image_sizes)} image sizes for {n} examples")
    return list(image_sizes)


def prior_accuracy(
    point: tuple[float, float],
    candidates: Sequence[Any],
    targets: Any,
    image_sizes: Sequence[Sequence[float]],
    threshold: float = 0.5,
) -> float:
    """Accuracy (%) of always choosing the candidate whose centre is nearest ``point`` (fractions of
    each image's (W, H) in ``image_sizes``; the first candidate on ties)."""
    cands, t = _per_example(candidates, targets)
    p = torch.tensor([point], dtype=torch.float64)
    hits = [bool(_prior_hits(p, c, tgt, s, threshold)[0]) for c, tgt, s in zip(cands, t, _sizes(image_sizes, len(t)))]
    return 100.0 * sum(hits) / len(hits)


def fixed_position_prior(
    train_candidates: Sequence[Any],
    train_targets: Any,
    image_sizes: Sequence[Sequence[float]],
    grid: int = 10,
    threshold: float = 0.5,
) -> PositionPrior:
    """The best fixed point on the training split: of the ``grid`` x ``grid`` points
    ``((i + 0.5) / grid, (j + 0.5) / grid)`` (fractions of each image's (W, H)), the one whose nearest
    candidate is a hit most often (the first in row-major order, top row first, on ties); score
    it on another split with :func:`prior_accuracy`."""
    if grid < 1:
        raise ValueError(f"grid must be >= 1, got {grid}")
    cands, t = _per_example(train_candidates, train_targets)
    ticks = (torch.arange(grid, dtype=torch.float64) + 0.5) / grid
    ys, xs = torch.meshgrid(ticks, ticks, indexing="ij")
    points = torch.stack([xs.reshape(-1), ys.reshape(-1)], dim=1)  # [grid * grid, 2], row-major
    hits = torch.zeros(len(points), dtype=torch.float64)
    for c, tgt, s in zip(cands, t, _sizes(image_sizes, len(t))):
        hits += _prior_hits(points, c, tgt, s, threshold)
    best = int(hits.argmax())
    return PositionPrior((float(points[best, 0]), float(points[best, 1])), 100.0 * float(hits[best]) / len(t))

"""The false negatives of contrastive batches on a shapes world: how many of a training batch's
negatives (and of a queue of earlier batches) are captions true of the image, by the world's
ground truth -- what SRCL has to find.

:func:`training_batches` draws batches as training does (shared with the helper analyses of
:mod:`vlp.lab.diagnostics` and :mod:`vlp.lab.calibration`); :func:`false_negative_share` measures
one pretraining file; :func:`run_false_negatives` is ``vlp analyze false-negatives``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

import numpy as np

from vlp.data.formats import load_pairs, write_json_atomic
from vlp.errors import DataError
from vlp.lab.oracle import WorldTruth
from vlp.world.relevance import SceneTable

__all__ = ["training_batches", "false_negative_share", "run_false_negatives", "format_false_negatives"]


class _Truth:
    """Which of the file's ``images`` each caption of ``texts`` is true of, by the world's ground
    truth (:class:`WorldTruth`: its scenes and predicates): one bool row [images] per caption text,
    computed on first use (:class:`SceneTable`), and each caption's kind."""

    def __init__(self, world: WorldTruth, images: Sequence[str], texts: list[str]) -> None:
        self.table = SceneTable([world.scene(i) for i in images])
        self.texts = texts
        self.preds = [world.predicate(t) for t in texts]
        self.kinds = [p["kind"] for p in self.preds]
        self.rows: dict[int, np.ndarray] = {}

    def __call__(self, caption_ids: np.ndarray) -> np.ndarray:
        """[len(caption_ids), images] bool: caption ``caption_ids[k]`` is true of image j."""
        for c in set(caption_ids.tolist()) - self.rows.keys():
            self.rows[c] = self.table.matches(self.preds[c])
        return np.stack([self.rows[c] for c in caption_ids.tolist()])


def training_batches(
    captions: Sequence[Sequence[int]], batch_size: int, queue_size: int, batches: int, seed: int
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Batches as training draws them: each epoch a fresh permutation of the items cut into full
    batches (the last partial one dropped), one random caption per item; the queue holds the
    ``queue_size`` samples before the batch, newest first (``ceil(queue_size / B)`` warm-up
    batches fill it first). ``captions[i]``: the caption ids of item i. Yields ``batches`` times
    ``(items [B], caption ids [B], queued items [Q], queued caption ids [Q])``."""
    rng = np.random.default_rng(seed)

    def stream() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        while True:
            order = rng.permutation(len(captions))
            for s in range(0, len(captions) - batch_size + 1, batch_size):
                items = order[s : s + batch_size]
                yield items, np.array([captions[i][int(rng.integers(len(captions[i])))] for i in items])

    draws = stream()
    q_items, q_caps = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    for k in range(-(-queue_size // batch_size) + batches):
        items, caps = next(draws)
        if k * batch_size >= queue_size:  # the queue is full: a measured batch
            yield items, caps, q_items, q_caps
        q_items = np.concatenate([items, q_items])[:queue_size]
        q_caps = np.concatenate([caps, q_caps])[:queue_size]


def false_negative_share(
    data_file: str | Path,
    world_root: str | Path,
    batch_size: int,
    queue_size: int = 0,
    batches: int = 50,
    seed: int = 0,
) -> dict[str, Any]:
    """How many negatives of a training batch are false negatives under ``data_file`` (a
    pretraining file over images of the world at ``world_root``), by the world's ground truth
    (:func:`~vlp.world.predicates.caption_matches` on the scenes of ``scenes.json``).

    Batches are drawn like training: shuffled items, ``batch_size`` per batch (the last partial
    batch of an epoch dropped), one random caption per item. A negative is every pair (image i,
    caption t_j) but the anchor pair (ALBEF pretraining's ``loss.itc_positives=pair``); it is a
    false negative when t_j is true of image i. In-batch, the B(B-1) negatives are the same pairs
    for i2t and t2i. With a queue (the ``queue_size`` samples before the batch, first-in
    first-out, filled by ``ceil(queue_size / B)`` warm-up batches before the ``batches`` measured
    ones), i2t adds (batch image, queued caption) and t2i (batch caption, queued image) pairs;
    queued samples of the anchor's own image are false negatives too (``same_image_per_anchor``).

    Returns fractions in [0, 1] pooled over the measured batches: ``in_batch_share`` (false /
    all in-batch negatives), ``in_batch_per_anchor`` (false negatives per anchor),
    ``in_batch_anchors`` (share of anchors, i2t, with at least one), ``in_batch_share_by_kind``
    (per kind of the negative caption), ``caption_kinds`` (share of the drawn captions per kind),
    ``i2t_share``/``t2i_share`` and ``i2t_per_anchor``/``t2i_per_anchor`` (batch + queue; equal
    to the in-batch values without a queue), ``same_image_per_anchor``, and the settings.
    """
    _check_settings(batch_size, queue_size, batches)
    samples = load_pairs([data_file])
    if len(samples) < batch_size:
        raise ValueError(f"{data_file}: {len(samples)} items, fewer than one batch of {batch_size}")
    world = WorldTruth.load(world_root)
    images = sorted({s.image for s in samples})
    index = {p: k for k, p in enumerate(images)}
    texts = sorted({t for s in samples for t in s.captions})
    text_id = {t: k for k, t in enumerate(texts)}
    truth = _Truth(world, images, texts)
    item_image = np.array([index[s.image] for s in samples])
    item_caps = [[text_id[t] for t in s.captions] for s in samples]
    kinds = sorted(set(truth.kinds))
    caption_kind = np.array([kinds.index(k) for k in truth.kinds])

    b = batch_size
    tot = dict.fromkeys(("fn", "anchors", "i2t_q", "t2i_q", "same"), 0)
    kind_fn, kind_neg, kind_drawn = np.zeros(len(kinds)), np.zeros(len(kinds)), np.zeros(len(kinds))
    for items, caps, q_items, q_cap in training_batches(item_caps, b, queue_size, batches, seed):
        imgs, q_img = item_image[items], item_image[q_items]
        cap_true = truth(caps)  # [B, images]
        fn = cap_true[:, imgs] & ~np.eye(b, dtype=bool)  # [caption j, image i], the anchor pairs left out
        tot["fn"] += int(fn.sum())
        tot["anchors"] += int(fn.any(0).sum())
        np.add.at(kind_fn, caption_kind[caps], fn.sum(1))
        np.add.at(kind_neg, caption_kind[caps], b - 1)
        np.add.at(kind_drawn, caption_kind[caps], 1)
        if queue_size:
            tot["i2t_q"] += int(truth(q_cap)[:, imgs].sum())
            tot["t2i_q"] += int(cap_true[:, q_img].sum())
            tot["same"] += int((q_img[:, None] == imgs[None, :]).sum())
    return {
        "data": str(data_file),
        "items": len(samples),
        "batch_size": b,
        "queue_size": queue_size,
        "batches": batches,
        "seed": seed,
        **_pooled_shares(tot, kinds, (kind_fn, kind_neg, kind_drawn), batches, b, queue_size),
    }


def _check_settings(batch_size: int, queue_size: int, batches: int) -> None:
    """Raises ValueError unless ``batch_size >= 2``, ``queue_size >= 0`` and ``batches >= 1``; returns None."""
    if batch_size < 2:
        raise ValueError(f"batch_size must be >= 2, got {batch_size}")
    if queue_size < 0 or batches < 1:
        raise ValueError(f"queue_size must be >= 0 and batches >= 1, got {queue_size} and {batches}")


def _pooled_shares(
    tot: dict[str, int],
    kinds: list[str],
    by_kind: tuple[np.ndarray, np.ndarray, np.ndarray],
    batches: int,
    batch_size: int,
    queue_size: int,
) -> dict[str, Any]:
    """The fractions of :func:`false_negative_share` from its counts pooled over ``batches`` batches
    of ``batch_size`` with a queue of ``queue_size``: ``tot`` (``fn``, ``anchors``, ``i2t_q``,
    ``t2i_q``, ``same``) and ``by_kind`` (false negatives, negatives and drawn captions, each
    [kinds] in the order of ``kinds``). Returns the ``in_batch_*``, ``caption_kinds``,
    ``i2t_*``/``t2i_*`` and ``same_image_per_anchor`` entries, in that order."""
    kind_fn, kind_neg, kind_drawn = by_kind
    b = batch_size
    anchors = batches * b
    negatives = anchors * (b - 1 + queue_size)
    return {
        "in_batch_share": tot["fn"] / (anchors * (b - 1)),
        "in_batch_per_anchor": tot["fn"] / anchors,
        "in_batch_anchors": tot["anchors"] / anchors,
        "in_batch_share_by_kind": {k: float(kind_fn[i] / kind_neg[i]) for i, k in enumerate(kinds) if kind_neg[i]},
        "caption_kinds": {k: float(kind_drawn[i] / anchors) for i, k in enumerate(kinds) if kind_drawn[i]},
        "i2t_share": (tot["fn"] + tot["i2t_q"]) / negatives,
        "t2i_share": (tot["fn"] + tot["t2i_q"]) / negatives,
        "i2t_per_anchor": (tot["fn"] + tot["i2t_q"]) / anchors,
        "t2i_per_anchor": (tot["fn"] + tot["t2i_q"]) / anchors,
        "same_image_per_anchor": tot["same"] / anchors,
    }


def run_false_negatives(
    data_file: str | Path,
    world_root: str | Path,
    batch_size: int = 64,
    queue_sizes: Sequence[int] = (0,),
    batches: int = 50,
    seed: int = 0,
    out: Optional[str | Path] = None,
) -> list[dict[str, Any]]:
    """``vlp analyze false-negatives``: the share of true false negatives among a training batch's
    negatives (:func:`false_negative_share`), for each queue size; also written
    to ``out`` as JSON. A data file the measurement cannot use is a :class:`DataError`."""
    rows = []
    for queue_size in queue_sizes:
        try:
            rows.append(false_negative_share(data_file, world_root, batch_size, queue_size, batches, seed))
        except ValueError as e:
            raise DataError(str(e)) from None
    if out:
        write_json_atomic(Path(out), rows, indent=1)
    return rows


def format_false_negatives(rows: Sequence[dict[str, Any]]) -> str:
    """The lines ``vlp analyze false-negatives`` prints of :func:`run_false_negatives`: one per queue size."""
    return "\n".join(
        f"batch {r['batch_size']:4d} queue {r['queue_size']:6d}: {100 * r['in_batch_share']:5.1f}% of in-batch negatives "
        f"are false ({r['in_batch_per_anchor']:.1f} per anchor); with the queue i2t {100 * r['i2t_share']:.1f}% / t2i "
        f"{100 * r['t2i_share']:.1f}% ({r['i2t_per_anchor']:.1f} / {r['t2i_per_anchor']:.1f} per anchor)"
        for r in rows
    )

"""Pretraining files that mix a shapes world's captions, and the false negatives of their batches.

:func:`write_generic_mix` captions a share of the training images only generically and the rest
only by their scene caption; :func:`write_caption_mix` keeps only the captions of given kinds.
:func:`false_negative_share` measures, with the world's ground truth, how many of the negatives of
a training batch (and of a queue of earlier batches) are false negatives under a pretraining file:
what SRCL has to find. See ``docs/shapes_world.md``.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from vlp.data.synthetic.captions import CAPTION_KINDS, KIND_WEIGHTS, draw_caption
from vlp.data.synthetic.oracle import WorldTruth
from vlp.data.synthetic.relevance import SceneTable
from vlp.data.synthetic.scene import Scene, scene_from_dict, world_rng
from vlp.data.synthetic.world import _write_json

__all__ = [
    "CaptionMix",
    "check_kinds",
    "write_generic_mix",
    "write_caption_mix",
    "false_negative_share",
]


def _train_records(root: Path) -> list[dict[str, Any]]:
    """The ``scenes.json`` records of the world's training images."""
    return json.loads((root / "scenes.json").read_text())["splits"]["train"]


def _image_field(root: Path, out: Path, image: str) -> str:
    """A world image path (relative to ``root``) as a file at ``out`` writes it: unchanged when
    the file lies in ``root`` (image paths resolve against the file's folder), else absolute."""
    return image if out.parent.resolve() == root.resolve() else str((root / image).resolve())


def write_generic_mix(root: str | Path, generic_share: float, seed: int = 0, out: str | Path | None = None) -> Path:
    """A pretraining file over the training images of the world at ``root`` in which a share
    ``generic_share`` of the images are described only by their generic captions (object,
    relation, count: each true of many images, hence false negatives of one another) and the
    rest only by their fully specified scene caption. Written to ``out`` (default
    ``root/pretrain_generic_<share>.json``); deterministic in ``seed``."""
    if not 0.0 <= generic_share <= 1.0:
        raise ValueError(f"generic_share must be in [0, 1], got {generic_share}")
    root = Path(root)
    path = Path(out) if out is not None else root / f"pretrain_generic_{generic_share:g}.json"
    items = []
    for i, r in enumerate(_train_records(root)):
        texts = [c["text"] for c in r["captions"]]
        generic = world_rng(seed, "train", i, "generic-mix").random() < generic_share
        image = _image_field(root, path, r["image"])
        items.append({"image": image, "caption": texts[1:] if generic and len(texts) > 1 else texts[0]})
    _write_json(path, items)
    return path


@dataclass(frozen=True)
class CaptionMix:
    """What :func:`write_caption_mix` wrote: the file, its images and captions, the images left
    out (no caption of the kinds, as ``scenes.json`` paths) and the captions sampled beyond the
    world's own (``min_captions``)."""

    path: Path
    kinds: tuple[str, ...]
    images: int
    captions: int
    dropped: tuple[str, ...]
    added: int


def check_kinds(kinds: Sequence[str]) -> tuple[str, ...]:
    """``kinds`` validated against the world's caption kinds, without repeats, in the order of
    :data:`~vlp.data.synthetic.captions.CAPTION_KINDS`; ``ValueError`` names a bad kind."""
    if isinstance(kinds, str):
        raise ValueError(f"caption kinds must be a sequence of kind names, got the string {kinds!r}")
    for k in kinds:
        if k not in CAPTION_KINDS:
            raise ValueError(f"unknown caption kind {k!r}; the shapes world's kinds are {', '.join(CAPTION_KINDS)}")
    if not kinds:
        raise ValueError(f"no caption kinds given; choose from {', '.join(CAPTION_KINDS)}")
    return tuple(k for k in CAPTION_KINDS if k in kinds)


def _top_up(
    scene: Scene, texts: list[str], own: list[str], kinds: tuple[str, ...], rng: random.Random, n: int
) -> list[tuple[str, str]]:
    """Up to ``n`` further distinct captions ``(text, kind)`` of ``kinds`` (object, relation, count;
    the scene caption is unique) true of ``scene``, none among the image's ``texts`` or ``own``
    ones: each a kind drawn with :data:`KIND_WEIGHTS`, then :func:`draw_caption`; fewer when the
    grammar runs out."""
    possible = [k for k in KIND_WEIGHTS if k in kinds and (k != "relation" or len(scene.objects) >= 2)]
    seen = {*texts, *own}
    extra: list[tuple[str, str]] = []
    while possible and len(extra) < n:
        kind = rng.choices(possible, weights=[KIND_WEIGHTS[k] for k in possible])[0]
        drawn = draw_caption(scene, kind, rng, seen, fallback=possible)
        if drawn is None:  # every possible kind is exhausted
            break
        seen.add(drawn[0])
        extra.append((drawn[0], drawn[1].kind))
    return extra


def write_caption_mix(
    root: str | Path,
    kinds: Sequence[str],
    seed: int = 0,
    out: str | Path | None = None,
    min_captions: int = 0,
    repeats: Mapping[str, int] | None = None,
) -> CaptionMix:
    """A pretraining file over the training images of the world at ``root`` in which each image
    keeps only its captions of ``kinds`` (a subset of ``scene, object, relation, count``), in the
    world's order; images with none are left out (a ``relation`` needs two objects, so the
    one-object images of a relation-only mix go). Written to ``out`` (default
    ``root/pretrain_kinds_<kinds joined by '+'>.json``, kinds in the world's order, e.g.
    ``pretrain_kinds_object+count.json``).

    ``min_captions`` > 0 tops every image up to that many captions of the kinds, drawn from its
    scene with ``world_rng(seed, "train", i, "caption-mix")`` (deterministic in ``seed``; a
    scene has one scene caption, so a scene-only mix stays at one). With the default 0 the file
    holds only captions of ``pretrain.json`` and ``seed`` has no effect.

    ``repeats`` {kind: n >= 1} lists each caption of that kind n times in its image's list (after
    any top-up), so the loader's uniform draw of one caption per image picks that kind n times as
    often: a caption-kind *weight* in the plain ALBEF file format. The default name then marks the
    kind ``<kind>-x<n>`` (``pretrain_kinds_scene-x4+object+relation+count.json``). ``captions``
    counts the listed entries, repeats included.
    """
    kinds = check_kinds(kinds)
    if min_captions < 0:
        raise ValueError(f"min_captions must be >= 0, got {min_captions}")
    times = dict(repeats or {})
    for k, n in times.items():
        if k not in kinds:
            raise ValueError(f"caption kind {k!r} is repeated but not among the kinds {', '.join(kinds)}")
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"repeats of caption kind {k!r} must be an integer >= 1, got {n!r}")
    tag = "+".join(k if times.get(k, 1) == 1 else f"{k}-x{times[k]}" for k in kinds)
    root = Path(root)
    path = Path(out) if out is not None else root / f"pretrain_kinds_{tag}.json"
    items, dropped, added = [], [], 0
    for i, r in enumerate(_train_records(root)):
        texts = [c["text"] for c in r["captions"]]
        own = [(c["text"], c["predicate"]["kind"]) for c in r["captions"] if c["predicate"]["kind"] in kinds]
        if len(own) < min_captions:
            extra = _top_up(
                scene_from_dict(r),
                texts,
                [t for t, _ in own],
                kinds,
                world_rng(seed, "train", i, "caption-mix"),
                min_captions - len(own),
            )
            own += extra
            added += len(extra)
        if not own:
            dropped.append(r["image"])
            continue
        listed = [t for t, kind in own for _ in range(times.get(kind, 1))]
        items.append(
            {"image": _image_field(root, path, r["image"]), "caption": listed if len(listed) > 1 else listed[0]}
        )
    _write_json(path, items)
    n_captions = sum(len(e["caption"]) if isinstance(e["caption"], list) else 1 for e in items)
    return CaptionMix(path, kinds, len(items), n_captions, tuple(dropped), added)


# ----------------------------------------------------------------------------- false negatives


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
    (:func:`~vlp.data.synthetic.predicates.caption_matches` on the scenes of ``scenes.json``).

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
    if batch_size < 2:
        raise ValueError(f"batch_size must be >= 2, got {batch_size}")
    if queue_size < 0 or batches < 1:
        raise ValueError(f"queue_size must be >= 0 and batches >= 1, got {queue_size} and {batches}")
    from vlp.data.formats import load_pairs

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
    anchors = batches * b
    negatives = anchors * (b - 1 + queue_size)
    return {
        "data": str(data_file),
        "items": len(samples),
        "batch_size": b,
        "queue_size": queue_size,
        "batches": batches,
        "seed": seed,
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

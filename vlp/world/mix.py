"""Pretraining files that mix a shapes world's captions.

:func:`write_generic_mix` captions a share of the training images only generically and the rest
only by their scene caption; :func:`write_caption_mix` keeps only the captions of given kinds. How
many of the negatives of their training batches are false negatives is measured in the lab
(:func:`vlp.lab.false_negatives.false_negative_share`). See ``docs/shapes_world.md``.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from vlp.world.captions import CAPTION_KINDS, KIND_WEIGHTS, draw_caption
from vlp.world.scene import Scene, scene_from_dict, world_rng
from vlp.world.writer import write_compact_json

__all__ = [
    "CaptionMix",
    "check_kinds",
    "write_generic_mix",
    "write_caption_mix",
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
    write_compact_json(path, items)
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
    :data:`~vlp.world.captions.CAPTION_KINDS`; ``ValueError`` names a bad kind."""
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
    write_compact_json(path, items)
    n_captions = sum(len(e["caption"]) if isinstance(e["caption"], list) else 1 for e in items)
    return CaptionMix(path, kinds, len(items), n_captions, tuple(dropped), added)

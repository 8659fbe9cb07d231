"""``vlp analyze minimal-pairs``: does a checkpoint score a caption's image above a scene that differs
from it in exactly one attribute of one object?

For a caption true of a target scene, a distractor changes one object's ``shape``, ``color`` or
``size``, moves it to an empty ``cell``, or changes the ``count`` (removes one object, or adds a
copy of one in an empty cell), such that the caption is false of the distractor
(:func:`~vlp.world.predicates.caption_matches`). A model that scores the target image above the
distractor for the caption has kept that attribute in its caption embedding
(:func:`minimal_pair_accuracy`; :func:`run_minimal_pairs` on a world's held-out scene captions).
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
import torch.nn.functional as F

from vlp.errors import DataError
from vlp.lab import probes
from vlp.pictures import RunStep
from vlp.world.predicates import Predicate, caption_matches
from vlp.world.scene import (
    COLORS,
    MAX_OBJECTS,
    MIN_OBJECTS,
    SHAPES,
    SIZES,
    Obj,
    Scene,
    render_scene,
    scene_from_dict,
    world_rng,
)

__all__ = [
    "PAIR_ATTRIBUTES",
    "Distractor",
    "distractors",
    "sample_distractors",
    "minimal_pair_accuracy",
    "run_minimal_pairs",
    "format_minimal_pairs",
]

PAIR_ATTRIBUTES: tuple[str, ...] = ("shape", "color", "size", "cell", "count")
_VALUES: dict[str, tuple[str, ...]] = {"shape": SHAPES, "color": COLORS, "size": SIZES}


@dataclass(frozen=True)
class Distractor:
    """A scene differing from the target in ``attribute`` of one object; ``change`` says how."""

    attribute: str
    scene: Scene
    change: str


def _scene(objects: Sequence[Obj]) -> Scene:
    """A scene with its objects in canonical (row-major cell) order."""
    return Scene(tuple(sorted(objects, key=lambda o: (o.row, o.col))))


def _empty_cells(scene: Scene) -> list[tuple[int, int]]:
    taken = {(o.row, o.col) for o in scene.objects}
    return [(r, c) for r in range(3) for c in range(3) if (r, c) not in taken]


def _name(o: Obj) -> str:
    return f"{o.size} {o.color} {o.shape} at ({o.row},{o.col})"


def _all_changes(scene: Scene, attribute: str) -> list[Distractor]:
    """Every single-attribute change of ``scene`` (one object, one attribute), caption not yet checked."""
    objs = list(scene.objects)
    out = []
    for i, o in enumerate(objs):
        rest = objs[:i] + objs[i + 1 :]
        if attribute in _VALUES:
            for v in _VALUES[attribute]:
                if v != getattr(o, attribute):
                    moved = Obj(**{**asdict(o), attribute: v})
                    out.append(Distractor(attribute, _scene([*rest, moved]), f"{_name(o)}: {attribute} -> {v}"))
        elif attribute == "cell":
            for r, c in _empty_cells(scene):
                out.append(Distractor(attribute, _scene([*rest, replace(o, row=r, col=c)]), f"{_name(o)} -> ({r},{c})"))
        elif attribute == "count":
            if len(objs) > MIN_OBJECTS:
                out.append(Distractor(attribute, _scene(rest), f"{_name(o)} removed"))
            if len(objs) < MAX_OBJECTS:
                for r, c in _empty_cells(scene):
                    copy = replace(o, row=r, col=c)
                    out.append(Distractor(attribute, _scene([*objs, copy]), f"{_name(o)} copied to ({r},{c})"))
        else:
            raise ValueError(f"unknown attribute {attribute!r}; expected one of {list(PAIR_ATTRIBUTES)}")
    return out


def distractors(pred: dict[str, Any] | Predicate, scene: Scene, attribute: str) -> list[Distractor]:
    """Every scene that differs from ``scene`` (of which ``pred`` is true) in ``attribute`` of exactly
    one object and of which ``pred`` is false, in a fixed order. ``count`` changes the number of
    objects by one (removing one, or copying one into an empty cell), within the world's 1-4."""
    if not caption_matches(pred, scene):
        raise ValueError("the caption is not true of the target scene")
    return [d for d in _all_changes(scene, attribute) if not caption_matches(pred, d.scene)]


def sample_distractors(
    pred: dict[str, Any] | Predicate,
    scene: Scene,
    rng: random.Random,
    per_attribute: int = 2,
    attributes: Sequence[str] = PAIR_ATTRIBUTES,
) -> dict[str, list[Distractor]]:
    """Up to ``per_attribute`` distractors of each attribute, drawn without replacement by ``rng``
    (fewer where fewer exist, e.g. no ``size`` distractor of a caption that names no size)."""
    out = {}
    for a in attributes:
        pool = distractors(pred, scene, a)
        out[a] = rng.sample(pool, min(per_attribute, len(pool)))
    return out


# ----------------------------------------------------------------------------- scoring


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


def _pair_tensors(feats: torch.Tensor, owners: list[int], n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Distractor features ``feats`` [M, E] of caption ``owners[m]`` -> [n, k, E] and valid [n, k]."""
    out = torch.zeros(n, k, feats.shape[1])
    valid = torch.zeros(n, k, dtype=torch.bool)
    slot = [0] * n
    for m, j in enumerate(owners):
        out[j, slot[j]], valid[j, slot[j]] = feats[m], True
        slot[j] += 1
    return out, valid


def run_minimal_pairs(
    run: str | Path,
    world_root: str | Path,
    out: str | Path,
    n_captions: int = 200,
    per_attribute: int = 2,
    split: str = "test",
    attributes: Sequence[str] = PAIR_ATTRIBUTES,
    seed: int = 0,
    batch_size: int = 256,
    device: Optional[str] = None,
) -> dict[str, Any]:
    """Minimal-pair retrieval of a checkpoint on the fully specified (``scene``) captions of the
    first ``n_captions`` images of the world's ``split``.

    For each caption, up to ``per_attribute`` distractor scenes per attribute
    (:func:`sample_distractors`, drawn by
    ``world_rng(seed, split, i, "minimal-pairs")``) are rendered with the image's own render RNG
    (the objects keep their jitter; the target is the world's image file) and scored by ITC cosine
    against the caption. Writes ``out/minimal_pairs.json`` (the returned record: accuracy per
    attribute and over all pairs, chance 0.5), ``out/minimal_pairs_detail.json`` (every pair with
    its change and both scores) and ``out/minimal_pairs.png``."""
    from vlp.viz import plot_attribute_bars

    meta, captions, targets, pairs = _draw_pairs(world_root, split, n_captions, per_attribute, attributes, seed)
    model = probes.load_model(run, device, batch_size)
    text, target = model.encode_text(captions).float(), model.encode_image(targets).float()
    images = [render_scene(d.scene, meta["image_size"], world_rng(meta["seed"], split, j, "render")) for j, d in pairs]
    dist = model.encode_image(images).float() if images else torch.zeros(0, text.shape[1])
    results = {a: _pair_accuracy(text, target, dist, pairs, a) for a in [*attributes, "all"]}
    record = {
        **probes.record_head(model, run, world_root, split, len(captions)),
        "per_attribute": per_attribute,
        "seed": seed,
        "chance": 0.5,
        "attributes": results,
    }
    out = Path(out)
    probes.write_record(out, "minimal_pairs", record)
    probes.write_record(
        out, "minimal_pairs_detail", {"pairs": _pair_details(pairs, captions, targets, text, target, dist)}
    )
    done = {a: r["accuracy"] for a, r in results.items() if "accuracy" in r}
    shows = RunStep.of_checkpoint(record["checkpoint"])
    png = out / "minimal_pairs.png"
    plot_attribute_bars(done, png, "minimal-pair retrieval", "accuracy", line=0.5, line_label="chance", shows=shows)
    return record


def _draw_pairs(
    world_root: str | Path, split: str, n_captions: int, per_attribute: int, attributes: Sequence[str], seed: int
) -> tuple[dict[str, Any], list[str], list[str], list[tuple[int, Distractor]]]:
    """The world's metadata, the scene captions and image paths of the first ``n_captions`` images
    of ``split``, and their distractors as (caption index, distractor)."""
    meta, records = probes.world_split(world_root, split)
    root = Path(world_root)
    captions, targets, pairs = [], [], []
    for i, r in enumerate(records[:n_captions]):
        cap = r["captions"][0]
        if cap["predicate"]["kind"] != "scene":
            raise DataError(f"{root / 'scenes.json'}: {split} image {i}: the first caption is not the scene caption")
        rng = world_rng(seed, split, i, "minimal-pairs")
        drawn = sample_distractors(cap["predicate"], scene_from_dict(r), rng, per_attribute, attributes)
        captions.append(cap["text"])
        targets.append(str(root / r["image"]))
        pairs += [(i, d) for a in attributes for d in drawn[a]]
    return meta, captions, targets, pairs


def _pair_accuracy(
    text: torch.Tensor, target: torch.Tensor, dist: torch.Tensor, pairs: list[tuple[int, Distractor]], attribute: str
) -> dict[str, Any]:
    """Minimal-pair accuracy over the pairs of ``attribute`` (``all``: every pair): ``text``,
    ``target`` [N, E] per caption, ``dist`` [M, E] per pair."""
    rows = [m for m, (_, d) in enumerate(pairs) if attribute in ("all", d.attribute)]
    if not rows:
        return {"n_pairs": 0, "skipped": "no distractor of this attribute"}
    owners = [pairs[m][0] for m in rows]
    k = max(owners.count(j) for j in set(owners))
    feats, valid = _pair_tensors(dist[rows], owners, len(text), k)
    return {"accuracy": minimal_pair_accuracy(text, target, feats, valid), "n_pairs": len(rows)}


def _pair_details(
    pairs: list[tuple[int, Distractor]],
    captions: list[str],
    targets: list[str],
    text: torch.Tensor,
    target: torch.Tensor,
    dist: torch.Tensor,
) -> list[dict[str, Any]]:
    """One entry per (caption, distractor): what changed and the two cosine scores."""
    text, target, dist = (F.normalize(x.float(), dim=-1) for x in (text, target, dist))
    s_target = (text * target).sum(-1)
    return [
        {
            "caption": captions[j],
            "image": targets[j],
            "attribute": d.attribute,
            "change": d.change,
            "score_target": float(s_target[j]),
            "score_distractor": float(text[j] @ dist[m]),
        }
        for m, (j, d) in enumerate(pairs)
    ]


def format_minimal_pairs(report: dict[str, Any]) -> str:
    """The table ``vlp analyze minimal-pairs`` prints of a report of :func:`run_minimal_pairs`: each
    attribute's minimal-pair accuracy."""
    return "\n".join(
        f"  {name:10s} minimal-pair accuracy {100 * v['accuracy']:5.1f}%  ({v['n_pairs']} pairs; chance 50%)"
        for name, v in report["attributes"].items()
        if "accuracy" in v
    )

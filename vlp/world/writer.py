"""The world writer: every file of a shapes world (images, annotations, relevance, tasks).

:func:`generate_world` samples, captions and renders the scenes of the train, val and test
splits and writes the pretraining, retrieval and relevance files, ``scenes.json`` and the VQA
and NLVR2 files (:func:`write_task_files`) and those of the other tasks (:mod:`vlp.world.task_files`);
pretraining files that mix the captions are :mod:`vlp.world.mix`. The file formats are described in
``docs/shapes_world.md`` (relevance and caption groups: :mod:`vlp.data.formats`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from vlp.data.formats import CAPTION_GROUPS_FORMAT, RELEVANCE_FORMAT, write_atomic, write_json_atomic
from vlp.kinds import HELPER, PRETRAIN
from vlp.world.captions import CAPTION_KINDS, make_captions
from vlp.world.relevance import compute_graded_relevance, compute_relevance
from vlp.world.scene import (
    COLORS,
    SHAPES,
    SIZES,
    Scene,
    render_scene,
    sample_scene,
    scene_to_dict,
    world_rng,
)
from vlp.world.task_files.classification import write_classification_splits
from vlp.world.task_files.grounding import write_grounding_splits
from vlp.world.task_files.nlvr import NLVR_TEMPLATES, check_templates, nlvr_task_files
from vlp.world.task_files.ve import write_ve_splits
from vlp.world.task_files.vqa import vqa_task_files

__all__ = [
    "SPLITS",
    "HELPER_SPLIT",
    "RELEVANCE_FORMAT",
    "CAPTION_GROUPS_FORMAT",
    "GENERIC_KINDS",
    "generate_world",
    "write_compact_json",
    "write_task_files",
]

SPLITS: tuple[str, ...] = ("train", "val", "test")
#: the optional split of images disjoint from every other, for an SRCL helper (``n_helper``), named
#: after the kind it trains
HELPER_SPLIT = HELPER
#: the caption kinds each true of many images (the false negatives of one another)
GENERIC_KINDS: tuple[str, ...] = tuple(k for k in CAPTION_KINDS if k != "scene")

_IMAGE_NAME = re.compile(r"^(train|val|test|helper)_\d{6}\.png$")


def write_compact_json(path: Path, obj: Any) -> None:
    """Write ``obj`` to ``path`` as compact ASCII JSON, atomically (temp file in the same directory,
    then ``os.replace``); return nothing. A failure (``json.dump``'s ``TypeError`` or ``ValueError``
    for an object JSON cannot hold, an ``OSError``) is raised and leaves no file behind."""
    write_json_atomic(path, obj, separators=(",", ":"), ensure_ascii=True)


def _write_npy(path: Path, arr: np.ndarray) -> None:
    """Write a ``.npy`` array atomically (like :func:`write_compact_json`)."""
    write_atomic(path, lambda f: np.save(f, arr, allow_pickle=False), binary=True)


def generate_world(
    out: str | Path,
    seed: int = 0,
    n_train: int = 4000,
    n_val: int = 200,
    n_test: int = 1000,
    image_size: int = 64,
    progress: bool = True,
    vqa_per_image: int = 3,
    nlvr_per_image: int = 2,
    nlvr_templates: Sequence[str] | None = None,
    n_helper: int = 0,
) -> dict[str, Path]:
    """Generate a shapes world under ``out`` and return the written paths.

    Writes ``images/{split}/{split}_{i:06d}.png``, ``pretrain.json``, ``helper.json`` (the scene
    captions only: the clean caption set of the SRCL helper),
    ``retrieval_{train,val,test}.json``, ``relevance_{val,test}.json``,
    ``relevance_graded_{val,test}.npy`` (float32 [texts, images], :func:`~vlp.world.relevance.caption_grade`),
    ``caption_kinds_{val,test}.json`` (the kind of each caption of ``retrieval_<split>.json``, in its
    order, and the union ``generic`` of the non-scene kinds: the caption groups of ``vlp evaluate
    retrieval``),
    ``scenes.json``, and the downstream tasks of :mod:`vlp.world.task_files.vqa` and
    :mod:`vlp.world.task_files.nlvr`:
    ``vqa_{train,val,test}.json`` (up to ``vqa_per_image`` questions per image; test without
    answers), ``vqa_test_annotations.json``, ``answer_list.json`` and
    ``nlvr_{train,dev,test}.json`` (``nlvr_per_image`` statements per image of the split, the
    ``nlvr_templates`` (default: all of ``NLVR_TEMPLATES``) in equal shares) (see
    ``docs/shapes_world.md``).  ``n_helper`` > 0 adds the split ``helper``: that many further
    images (``images/helper/``, scenes from their own RNGs, hence disjoint from the other splits
    as images) with all their captions, every kind, in ``helper_split.json`` (pretraining format)
    and under ``splits.helper`` of ``scenes.json``: the training data of an SRCL helper that knows
    the whole caption vocabulary without seeing a training image. ``n_helper`` = 0 writes no
    helper file (and removes those of an earlier world): every other file is byte-identical to a
    world without the option.  Deterministic: the same arguments give byte-identical files and
    images; the task files draw from their own RNGs, so the other files do not depend on
    ``vqa_per_image`` / ``nlvr_per_image`` (nor on ``n_helper``).  Returns a dict with keys
    ``pretrain, helper, retrieval_train, retrieval_val, retrieval_test, relevance_val,
    relevance_test, relevance_graded_val, relevance_graded_test, caption_kinds_val,
    caption_kinds_test, scenes, vqa_train, vqa_val, vqa_test, vqa_test_annotations, answer_list,
    nlvr_train, nlvr_dev, nlvr_test, root``, the SNLI-VE triples
    (:func:`~vlp.world.task_files.ve.write_ve_splits`: ``ve_{train,dev,test}``), the grounding splits
    (:func:`~vlp.world.task_files.grounding.write_grounding_splits`: ``grounding_{train,val,test}``),
    the zero-shot classification splits of val and test
    (:func:`~vlp.world.task_files.classification.write_classification_splits`:
    ``classification_<shape|colour|count>_<split>`` and their ``_classes`` / ``_templates`` files)
    and, with ``n_helper`` > 0, ``helper_split``.
    """
    templates = check_templates(nlvr_templates if nlvr_templates is not None else NLVR_TEMPLATES)
    root = Path(out)
    counts = {"train": n_train, "val": n_val, "test": n_test, HELPER_SPLIT: n_helper}
    for split, n in counts.items():
        if n < 0:
            raise ValueError(f"n_{split} must be >= 0")
    records: dict[str, list[dict[str, Any]]] = {}
    scenes: dict[str, list[Scene]] = {}
    for split in SPLITS:
        records[split], scenes[split] = _write_split_images(root, split, counts[split], seed, image_size, progress)
    helper = _write_helper_split(root, n_helper, seed, image_size, progress)

    paths = _world_paths(root)
    texts = {s: [[c["text"] for c in r["captions"]] for r in records[s]] for s in SPLITS}
    _write_train_files(paths, records["train"], texts["train"])
    for split in ("val", "test"):
        _write_eval_files(paths, split, records[split], texts[split], scenes[split])
    _write_scenes(
        paths["scenes"], seed, image_size, records if helper is None else {**records, HELPER_SPLIT: helper[1]}
    )
    paths.update(_write_all_tasks(root, seed, scenes, records, vqa_per_image, nlvr_per_image, templates))
    if helper is not None:
        paths["helper_split"] = helper[0]
    return {**paths, "root": root}


def _world_paths(root: Path) -> dict[str, Path]:
    """The paths of the world's pretraining, retrieval, relevance, caption-kind and scene files under
    ``root``. Returns name -> path, in the order :func:`generate_world` returns them."""
    return {
        PRETRAIN: root / "pretrain.json",
        HELPER: root / "helper.json",
        "retrieval_train": root / "retrieval_train.json",
        "retrieval_val": root / "retrieval_val.json",
        "retrieval_test": root / "retrieval_test.json",
        "relevance_val": root / "relevance_val.json",
        "relevance_test": root / "relevance_test.json",
        "relevance_graded_val": root / "relevance_graded_val.npy",
        "relevance_graded_test": root / "relevance_graded_test.npy",
        "caption_kinds_val": root / "caption_kinds_val.json",
        "caption_kinds_test": root / "caption_kinds_test.json",
        "scenes": root / "scenes.json",
    }


def _write_scenes(path: Path, seed: int, image_size: int, splits: Mapping[str, list[dict[str, Any]]]) -> None:
    """Writes ``scenes.json``: the seed, the image size, the attribute vocabularies and each split's
    scene records (``splits``); returns None."""
    write_compact_json(
        path,
        {
            "seed": seed,
            "image_size": image_size,
            "attributes": {"shapes": list(SHAPES), "colors": list(COLORS), "sizes": list(SIZES)},
            "splits": splits,
        },
    )


def _write_all_tasks(
    root: Path,
    seed: int,
    scenes: dict[str, list[Scene]],
    records: dict[str, list[dict[str, Any]]],
    vqa_per_image: int,
    nlvr_per_image: int,
    templates: Sequence[str],
) -> dict[str, Path]:
    """Writes the downstream task files of the world under ``root`` (each split's ``scenes`` and
    image ``records``): VQA and NLVR2 (:func:`write_task_files`), grounding, SNLI-VE and the
    zero-shot classification splits of val and test. Returns name -> path, in that order."""
    images = {s: [r["image"] for r in records[s]] for s in SPLITS}
    paths = dict(write_task_files(root, seed, scenes, images, vqa_per_image, nlvr_per_image, templates))
    paths.update(write_grounding_splits(root))
    paths.update(write_ve_splits(root))
    for split in ("val", "test"):
        paths.update(write_classification_splits(root, split))
    return paths


def format_world_files(paths: Mapping[str, Path]) -> str:
    """The table ``vlp make-world`` prints of the files it wrote: one ``name path`` each."""
    return "\n".join(f"{k:22s} {p}" for k, p in paths.items())


def _write_helper_split(
    root: Path, n: int, seed: int, image_size: int, progress: bool
) -> Optional[tuple[Path, list[dict[str, Any]]]]:
    """The ``helper`` split of ``n`` images and ``helper_split.json`` (every caption of each
    image); returns the file and the ``scenes.json`` records, or None for ``n`` = 0 (after
    removing the helper images and file of an earlier world)."""
    path = root / "helper_split.json"
    if n == 0:
        if (root / "images" / HELPER_SPLIT).is_dir():
            _write_split_images(root, HELPER_SPLIT, 0, seed, image_size, False)  # removes the stale images
        path.unlink(missing_ok=True)
        return None
    records, _ = _write_split_images(root, HELPER_SPLIT, n, seed, image_size, progress)
    write_compact_json(path, [{"image": r["image"], "caption": [c["text"] for c in r["captions"]]} for r in records])
    return path, records


def _write_split_images(
    root: Path, split: str, n: int, seed: int, image_size: int, progress: bool
) -> tuple[list[dict[str, Any]], list[Scene]]:
    """Sample, caption and render the ``n`` images of ``split`` (removing stale images of an earlier,
    larger world); returns their ``scenes.json`` records and scenes."""
    from tqdm.auto import tqdm

    img_dir = root / "images" / split
    img_dir.mkdir(parents=True, exist_ok=True)
    written = set()
    records, scenes = [], []
    for i in tqdm(range(n), desc=f"shapes world [{split}]", disable=not progress, leave=False):
        scene = sample_scene(world_rng(seed, split, i, "scene"))
        caps = make_captions(scene, world_rng(seed, split, i, "captions"))
        name = f"{split}_{i:06d}.png"
        render_scene(scene, image_size, world_rng(seed, split, i, "render")).save(img_dir / name, format="PNG")
        written.add(name)
        scenes.append(scene)
        records.append(
            {
                "image": f"images/{split}/{name}",
                "objects": scene_to_dict(scene)["objects"],
                "captions": [{"text": t, "predicate": p} for t, p in caps],
            }
        )
    for stale in img_dir.iterdir():  # leftovers of an earlier, larger world
        if _IMAGE_NAME.match(stale.name) and stale.name not in written:
            stale.unlink()
    return records, scenes


def _write_train_files(paths: dict[str, Path], records: list[dict[str, Any]], texts: list[list[str]]) -> None:
    """``pretrain.json``, ``helper.json`` and ``retrieval_train.json`` of the training images."""
    write_compact_json(paths[PRETRAIN], [{"image": r["image"], "caption": t} for r, t in zip(records, texts)])
    # the "human-quality" caption set of the SRCL helper: the fully specified scene captions
    write_compact_json(paths[HELPER], [{"image": r["image"], "caption": t[0]} for r, t in zip(records, texts)])
    write_compact_json(
        paths["retrieval_train"],
        [
            {"image": r["image"], "caption": c, "image_id": Path(r["image"]).stem}
            for r, t in zip(records, texts)
            for c in t
        ],
    )


def _write_eval_files(
    paths: dict[str, Path], split: str, records: list[dict[str, Any]], texts: list[list[str]], scenes: list[Scene]
) -> None:
    """``retrieval_<split>.json``, ``relevance_<split>.json``, ``relevance_graded_<split>.npy`` and
    ``caption_kinds_<split>.json``, checking that every caption is true of its own image and that
    the graded relevance is 1.0 exactly where the caption is true."""
    write_compact_json(
        paths[f"retrieval_{split}"], [{"image": r["image"], "caption": t} for r, t in zip(records, texts)]
    )
    preds = [c["predicate"] for r in records for c in r["captions"]]
    write_compact_json(
        paths[f"caption_kinds_{split}"],
        {
            "format": CAPTION_GROUPS_FORMAT,
            "annotation": paths[f"retrieval_{split}"].name,
            "labels": [p["kind"] for p in preds],  # the captions in retrieval_<split>.json order
            "unions": {"generic": list(GENERIC_KINDS)},
        },
    )
    owners = [i for i, r in enumerate(records) for _ in r["captions"]]
    relevant = compute_relevance(preds, scenes)
    for k, (own, rel) in enumerate(zip(owners, relevant)):
        if own not in rel:  # a caption must be true of its own image
            raise AssertionError(f"{split} text {k} does not match its own image {own}")
    write_compact_json(
        paths[f"relevance_{split}"],
        {
            "format": RELEVANCE_FORMAT,
            "annotation": paths[f"retrieval_{split}"].name,
            "num_images": len(records),
            "texts": [c for t in texts for c in t],
            "relevant_images": relevant,
        },
    )
    graded = compute_graded_relevance(preds, scenes)
    exact = np.zeros(graded.shape, dtype=bool)
    for k, rel in enumerate(relevant):
        exact[k, rel] = True
    if not np.array_equal(graded == 1.0, exact):  # graded 1.0 exactly where the caption is true
        raise AssertionError(f"{split}: graded relevance disagrees with the relevance lists")
    _write_npy(paths[f"relevance_graded_{split}"], graded)


def write_task_files(
    root: Path,
    seed: int,
    scenes: dict[str, list[Scene]],
    images: dict[str, list[str]],
    vqa_per_image: int = 3,
    nlvr_per_image: int = 2,
    nlvr_templates: Sequence[str] = NLVR_TEMPLATES,
) -> dict[str, Path]:
    """Write the VQA and NLVR2 files of a world under ``root``; returns their paths by key."""
    files = {
        **vqa_task_files(scenes, images, seed, vqa_per_image),
        **nlvr_task_files(scenes, images, seed, nlvr_per_image, nlvr_templates),
    }
    paths = {}
    for key, (name, obj) in files.items():
        paths[key] = root / name
        write_compact_json(paths[key], obj)
    return paths

"""``vlp prepare refcoco+``: the refer toolkit's RefCOCO / RefCOCO+ / RefCOCOg release -> grounding files.

Inputs: ``refs(unc).p`` (a Python 2 pickle, read with :func:`vlp.safe_pickle.restricted_load`:
a list of refs ``{ref_id, ann_id, image_id, split, sentences: [{sent, raw, tokens, sent_id}],
file_name, category_id, sent_ids}``) and ``instances.json`` (COCO: ``images [{id, file_name,
width, height}]``, ``annotations [{id, image_id, bbox: [x, y, w, h], category_id}]``).

Outputs (:mod:`vlp.data.grounding`): ``<dataset>_train.json`` and ``<dataset>_<split>.json`` for
every other split in the refs (RefCOCO+: val, testA, testB), one entry per sentence. Every entry
carries ``ref_id``, the target ``bbox`` (the referred annotation's box), ``candidates`` and
``image_size``; the train file is read as train entries (image and text, as ALBEF's). Candidates
are the gold boxes of every COCO annotation of the image (ascending annotation id), or, with a
detections file ``{image_id or ref_id: [[x, y, w, h, ...], ...]}`` (ALBEF used MAttNet's
detections, keyed by image id), its boxes (the first four numbers of each row).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from vlp.data.grounding import check_box
from vlp.data.json_entries import read_json, write_json_atomic
from vlp.errors import DataError
from vlp.prepare.common import check_images_exist, required_key, required_text, top_list
from vlp.safe_pickle import restricted_load

__all__ = ["REFER_SPLITS", "DETS_KEYS", "prepare_refcoco"]

#: the splits of the refer toolkit's releases (RefCOCO/RefCOCO+ unc: train val testA testB;
#: RefCOCOg umd: train val test)
REFER_SPLITS: tuple[str, ...] = ("train", "val", "testA", "testB", "test")
#: what the keys of a detections file are
DETS_KEYS: tuple[str, ...] = ("image_id", "ref_id")

Box = list[float]


def _checked_box(path: Path, where: str, v: Any) -> Box:
    problem = check_box(v)
    if problem is not None:
        raise DataError(f"{path}: {where}: box is {problem}, expected [x, y, w, h] with w and h > 0")
    return [float(x) for x in v]


def _coco(path: Path) -> tuple[dict[int, dict[str, Any]], dict[int, Box], dict[int, list[int]]]:
    """COCO ``instances.json`` -> images by id (``file_name``, ``width``, ``height``), annotation
    boxes by id, and the annotation ids of each image (ascending)."""
    data = read_json(path)
    images: dict[int, dict[str, Any]] = {}
    for i, img in enumerate(top_list(path, data, "images")):
        where = f"images[{i}]"
        iid = required_key(path, where, img, "id", (int,), "an int image id")
        images[iid] = {
            "file_name": required_text(path, where, img, "file_name", "the image file name"),
            "size": [
                required_key(path, where, img, k, (int,), f"the image {k} in pixels") for k in ("width", "height")
            ],
        }
    boxes: dict[int, Box] = {}
    by_image: dict[int, list[int]] = {}
    for i, ann in enumerate(top_list(path, data, "annotations")):
        where = f"annotations[{i}]"
        aid = required_key(path, where, ann, "id", (int,), "an int annotation id")
        iid = required_key(path, where, ann, "image_id", (int,), "an int image id")
        boxes[aid] = _checked_box(
            path, f"{where}.bbox", required_key(path, where, ann, "bbox", (list,), "[x, y, w, h]")
        )
        by_image.setdefault(iid, []).append(aid)
    return images, boxes, {iid: sorted(aids) for iid, aids in by_image.items()}


def _detections(path: Path) -> dict[str, list[Box]]:
    """A detections file: ``{id: [[x, y, w, h, ...], ...]}`` -> boxes by id (as a string)."""
    data = read_json(path)
    if not isinstance(data, dict):
        raise DataError(f"{path}: expected an object {{id: [[x, y, w, h], ...]}}, got {type(data).__name__}")
    dets: dict[str, list[Box]] = {}
    for key, rows in data.items():
        if not isinstance(rows, list) or not rows:
            raise DataError(f"{path}: key '{key}': expected a non-empty list of boxes [x, y, w, h, ...]")
        dets[key] = [
            _checked_box(path, f"key '{key}'[{k}]", r[:4] if isinstance(r, list) else r) for k, r in enumerate(rows)
        ]
    return dets


def _ref_entries(
    path: Path,
    i: int,
    ref: Any,
    coco: tuple[dict[int, dict[str, Any]], dict[int, Box], dict[int, list[int]]],
    dets: Optional[dict[str, list[Box]]],
    dets_by: str,
    image_prefix: str,
) -> tuple[str, list[dict[str, Any]]]:
    """The split of ref ``i`` and its entries, one per sentence."""
    images, boxes, by_image = coco
    where = f"refs[{i}]"
    ref_id = required_key(path, where, ref, "ref_id", (int,), "an int ref id")
    split = required_key(path, where, ref, "split", (str,), f"one of {list(REFER_SPLITS)}")
    if split not in REFER_SPLITS:
        raise DataError(f"{path}: {where}: key 'split' is {split!r}, expected one of {list(REFER_SPLITS)}")
    image_id = required_key(path, where, ref, "image_id", (int,), "an int image id")
    ann_id = required_key(path, where, ref, "ann_id", (int,), "an int annotation id")
    if image_id not in images:
        raise DataError(f"{path}: {where}: image_id {image_id} is not an image of the instances file")
    if ann_id not in boxes:
        raise DataError(f"{path}: {where}: ann_id {ann_id} is not an annotation of the instances file")
    if dets is None:
        candidates = [boxes[a] for a in by_image[image_id]]
    else:
        key = str(image_id if dets_by == "image_id" else ref_id)
        if key not in dets:
            raise DataError(f"{path}: {where}: no detections for {dets_by} {key}")
        candidates = dets[key]
    sentences = required_key(path, where, ref, "sentences", (list,), "a non-empty list of {sent, raw, ...}")
    if not sentences:
        raise DataError(f"{path}: {where}: key 'sentences' is an empty list, expected referring expressions")
    image = images[image_id]
    entry = {
        "image": image_prefix + image["file_name"],
        "ref_id": ref_id,
        "bbox": boxes[ann_id],
        "candidates": candidates,
        "image_size": image["size"],
    }
    texts = [
        required_text(path, f"{where}.sentences[{k}]", s, "sent", "a sentence string") for k, s in enumerate(sentences)
    ]
    return split, [{"text": t, **entry} for t in texts]


def prepare_refcoco(
    refs: str | Path,
    instances: str | Path,
    out_dir: str | Path,
    dataset: str = "refcoco+",
    dets: Optional[str | Path] = None,
    dets_by: str = "image_id",
    image_prefix: str = "",
    image_root: Optional[str | Path] = None,
) -> dict[str, Path]:
    """The refer toolkit's ``refs(unc).p`` + COCO ``instances.json`` -> ``out_dir/<dataset>_<split>.json``
    for each split of the refs (module docstring); returns ``{split: path}``.

    ``dets``: a detections JSON file replacing the gold candidate boxes, keyed by ``dets_by``
    ("image_id", ALBEF's ``dets.json``, or "ref_id"). Image paths are ``image_prefix`` + the COCO
    ``file_name`` (e.g. ``train2014/`` when the image root is the COCO folder); with an
    ``image_root`` every image must exist under it. A refs file that names any class or callable
    is refused (:func:`~vlp.safe_pickle.restricted_load`).
    """
    if not dataset or Path(dataset).name != dataset:
        raise DataError(f"dataset name {dataset!r} must be a plain file-name prefix like 'refcoco+'")
    if dets_by not in DETS_KEYS:
        raise DataError(f"unknown detections key {dets_by!r}, expected one of {list(DETS_KEYS)}")
    refs_path, inst_path = Path(refs), Path(instances)
    ref_list = restricted_load(refs_path)
    if not isinstance(ref_list, list) or not ref_list:
        raise DataError(f"{refs_path}: expected a non-empty list of refs, got {type(ref_list).__name__}")
    coco = _coco(inst_path)
    det_boxes = _detections(Path(dets)) if dets is not None else None
    out: dict[str, list[dict[str, Any]]] = {}
    for i, ref in enumerate(ref_list):
        split, entries = _ref_entries(refs_path, i, ref, coco, det_boxes, dets_by, image_prefix)
        out.setdefault(split, []).extend(entries)
    if "train" not in out:
        raise DataError(f"{refs_path}: no refs of split 'train'")
    check_images_exist((e["image"] for entries in out.values() for e in entries), image_root, refs_path)
    paths = {}
    for split in (s for s in REFER_SPLITS if s in out):
        paths[split] = Path(out_dir) / f"{dataset}_{split}.json"
        write_json_atomic(paths[split], out[split])
    return paths

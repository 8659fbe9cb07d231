"""``vlp prepare coco|flickr30k``: Karpathy's ``dataset_coco.json`` / ``dataset_flickr30k.json`` ->
``{coco,flickr30k}_{train,val,test}.json`` (train: one entry per caption with ``image_id``, train +
restval; val/test: one entry per image with its caption list). Image paths are relative to the image
root (``data.image_root``)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from vlp.data.json_entries import read_json, write_json_atomic
from vlp.errors import DataError
from vlp.prepare.common import check_images_exist, required_key, required_text, top_list

KARPATHY_SPLITS = {"train": "train", "restval": "train", "val": "val", "test": "test"}


def _karpathy(
    dataset_json: str | Path, out_dir: str | Path, name: str, image_path, image_id, image_root: Optional[str | Path]
) -> dict[str, int]:
    path = Path(dataset_json)
    images = top_list(path, read_json(path), "images")
    out: dict[str, list] = {"train": [], "val": [], "test": []}
    counts = {f"{s}_{k}": 0 for s in out for k in ("images", "captions")}
    paths = []
    for i, img in enumerate(images):
        where = f"images[{i}]"
        split = required_key(path, where, img, "split", (str,), "one of train, restval, val, test")
        if split not in KARPATHY_SPLITS:
            raise DataError(f"{path}: {where}: key 'split' is {split!r}, expected one of train, restval, val, test")
        split = KARPATHY_SPLITS[split]
        rel = image_path(path, where, img)
        sentences = required_key(path, where, img, "sentences", (list,), 'a non-empty list of {"raw": caption}')
        if not sentences:
            raise DataError(f"{path}: {where}: key 'sentences' is an empty list, expected captions")
        caps = [
            required_text(path, f"{where}.sentences[{k}]", s, "raw", "a caption string")
            for k, s in enumerate(sentences)
        ]
        paths.append(rel)
        counts[f"{split}_images"] += 1
        counts[f"{split}_captions"] += len(caps)
        if split == "train":
            iid = image_id(path, where, img)
            out["train"].extend({"image": rel, "caption": c, "image_id": iid} for c in caps)
        else:
            out[split].append({"image": rel, "caption": caps})
    check_images_exist(paths, image_root, path)
    out_dir = Path(out_dir)
    for split, entries in out.items():
        if not entries:
            raise DataError(
                f"{path}: no images of split {split!r}" + (" (train or restval)" if split == "train" else "")
            )
        write_json_atomic(out_dir / f"{name}_{split}.json", entries)
    return counts


def coco_karpathy(
    dataset_coco_json: str | Path, image_root: Optional[str | Path], out_dir: str | Path
) -> dict[str, int]:
    """Karpathy's ``dataset_coco.json`` -> ``out_dir/coco_{train,val,test}.json``.

    Image paths are ``filepath/filename`` (``val2014/COCO_val2014_000000391895.jpg``), relative to the
    COCO folder holding ``train2014/`` and ``val2014/``; ``image_id`` is ``coco_<cocoid>``. With an
    ``image_root`` every image must exist there. Returns ``{split}_images`` / ``{split}_captions``.
    """

    def image_path(path: Path, where: str, img: dict) -> str:
        return (
            required_text(path, where, img, "filepath", "the image folder, e.g. val2014")
            + "/"
            + required_text(path, where, img, "filename", "the image file name")
        )

    def image_id(path: Path, where: str, img: dict) -> str:
        return f"coco_{required_key(path, where, img, 'cocoid', (int, str), 'the COCO image id')}"

    return _karpathy(dataset_coco_json, out_dir, "coco", image_path, image_id, image_root)


def flickr30k_karpathy(
    dataset_flickr30k_json: str | Path,
    image_root: Optional[str | Path],
    out_dir: str | Path,
    prefix: str = "flickr30k-images",
) -> dict[str, int]:
    """Karpathy's ``dataset_flickr30k.json`` -> ``out_dir/flickr30k_{train,val,test}.json``.

    Image paths are ``prefix/filename`` (ALBEF: ``flickr30k-images/1000092795.jpg``; ``prefix=""``:
    the file name alone); ``image_id`` is ``flickr30k_<file name without extension>``.
    """

    def image_path(path: Path, where: str, img: dict) -> str:
        name = required_text(path, where, img, "filename", "the image file name")
        return f"{prefix.rstrip('/')}/{name}" if prefix else name

    def image_id(path: Path, where: str, img: dict) -> str:
        return f"flickr30k_{Path(required_text(path, where, img, 'filename', 'the image file name')).stem}"

    return _karpathy(dataset_flickr30k_json, out_dir, "flickr30k", image_path, image_id, image_root)

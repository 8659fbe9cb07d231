"""``vlp prepare eccv-caption``: the extended positives of ECCV Caption (or CxC), given as COCO image
and caption ids, as a vlp relevance file (:mod:`vlp.data.relevance`) of a Karpathy 5k test file.

The ``eccv-caption`` package (PyPI, MIT; its CxC files: Apache-2.0) ships the id files
``{eccv,cxc}_image_to_caption.json`` (COCO image id -> the COCO caption ids relevant to it) and
``{eccv,cxc}_caption_to_image.json`` (caption id -> image ids), only for the queries its annotators
judged. They are read from a folder, from the package's wheel, or (``auto``) from the installed
package, which is not imported. COCO's ``captions_val2014.json`` gives each caption id its image id
and text. A Karpathy image is found by its file name (``images[].file_name``; else the digits that
end it are its COCO id) and a caption among its image's captions by its text, whitespace
normalised; identical captions of one image pair up in order.
"""

from __future__ import annotations

import json
import re
import zipfile
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from vlp.data.formats import RetrievalSplit, load_retrieval_split
from vlp.data.json_entries import read_json, write_json_atomic
from vlp.data.relevance import relevance_record
from vlp.errors import DataError
from vlp.prepare.common import required_key, top_list

#: benchmark name -> the prefix of its id files in the eccv-caption package
ECCV_BENCHMARKS = {"eccv-caption": "eccv", "cxc": "cxc"}
ECCV_PACKAGE = "eccv_caption"

IdMap = dict[int, list[int]]


def normalise_caption(text: str) -> str:
    """``text`` with runs of whitespace made one space and the ends stripped (nothing else)."""
    return " ".join(text.split())


def _package_folder() -> Path:
    """The data folder of the installed ``eccv_caption`` package, found without importing it."""
    spec = find_spec(ECCV_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise DataError(
            "--eccv auto: the eccv-caption package is not installed (pip install eccv-caption), "
            "or give the folder or wheel holding eccv_image_to_caption.json"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def read_id_file(source: Path, name: str) -> tuple[str, Any]:
    """(origin, parsed JSON) of the id file ``name`` in ``source``: a wheel, or a folder holding it
    directly, in ``data/`` or in ``eccv_caption/data/``."""
    if not source.exists():
        raise DataError(f"--eccv {source}: no such file or folder (expected the eccv-caption wheel or its data folder)")
    if source.is_file() and source.suffix in (".whl", ".zip"):
        with zipfile.ZipFile(source) as whl:
            member = next((m for m in whl.namelist() if m == name or m.endswith(f"/{name}")), None)
            if member is None:
                raise DataError(f"{source}: no {name} in this archive (expected the eccv-caption wheel)")
            origin, raw = f"{source}:{member}", whl.read(member)
        try:
            return origin, json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise DataError(f"{origin}: invalid JSON ({e})") from None
    for folder in (source, source / "data", source / ECCV_PACKAGE / "data"):
        if (folder / name).is_file():
            return str(folder / name), read_json(folder / name)
    raise DataError(f"{source}: no {name} there, in data/ or in {ECCV_PACKAGE}/data/ (expected the eccv-caption files)")


def _id_map(origin: str, data: Any, values: str) -> IdMap:
    """A ``{"<id>": [id, ...]}`` object as ints; one error naming the file and key otherwise."""
    if not isinstance(data, dict) or not data:
        raise DataError(f"{origin}: expected a non-empty object of COCO id -> list of {values}")
    out: IdMap = {}
    for k, v in data.items():
        if not (isinstance(k, str) and k.isdigit()):
            raise DataError(f"{origin}: key {k!r} is not a COCO id (expected digits)")
        if not isinstance(v, list) or not v or not all(type(x) is int for x in v):
            raise DataError(f"{origin}: key {k!r}: expected a non-empty list of {values}")
        out[int(k)] = v
    return out


def eccv_id_maps(source: str | Path, benchmark: str = "eccv-caption") -> tuple[tuple[str, IdMap], tuple[str, IdMap]]:
    """``((origin, image id -> caption ids), (origin, caption id -> image ids))`` of ``benchmark``
    (``eccv-caption`` or ``cxc``) from ``source``: a folder, the package's wheel, or ``auto``."""
    if benchmark not in ECCV_BENCHMARKS:
        raise DataError(f"unknown benchmark {benchmark!r}; expected one of {', '.join(ECCV_BENCHMARKS)}")
    folder = _package_folder() if str(source) == "auto" else Path(source)
    prefix = ECCV_BENCHMARKS[benchmark]
    i2t_origin, i2t = read_id_file(folder, f"{prefix}_image_to_caption.json")
    t2i_origin, t2i = read_id_file(folder, f"{prefix}_caption_to_image.json")
    return (i2t_origin, _id_map(i2t_origin, i2t, "caption ids")), (t2i_origin, _id_map(t2i_origin, t2i, "image ids"))


def coco_captions(path: str | Path) -> tuple[dict[str, int], dict[int, tuple[int, str]]]:
    """COCO's ``captions_*.json`` -> (image file name -> image id, caption id -> (image id, text))."""
    path = Path(path)
    data = read_json(path)
    names = {}
    for i, img in enumerate(top_list(path, data, "images")):
        where = f"images[{i}]"
        names[required_key(path, where, img, "file_name", (str,), "the image file name")] = required_key(
            path, where, img, "id", (int,), "the COCO image id"
        )
    captions = {}
    for i, ann in enumerate(top_list(path, data, "annotations")):
        where = f"annotations[{i}]"
        cid = required_key(path, where, ann, "id", (int,), "the COCO caption id")
        captions[cid] = (
            required_key(path, where, ann, "image_id", (int,), "the COCO image id"),
            required_key(path, where, ann, "caption", (str,), "the caption text"),
        )
    return names, captions


def karpathy_image_ids(split: RetrievalSplit, names: dict[str, int]) -> list[int]:
    """The COCO image id of each image of ``split``: by file name in ``names``, else the digits
    that end the file name (``COCO_val2014_000000391895.jpg`` -> 391895)."""
    ids = []
    for i, image in enumerate(split.images):
        name = Path(image).name
        digits = re.search(r"(\d+)$", Path(name).stem)
        if name in names:
            ids.append(names[name])
        elif digits is not None:
            ids.append(int(digits.group(1)))
        else:
            raise DataError(
                f"{split.source}: entry {i}: image {name!r} is not in the COCO captions file and its name "
                "ends in no COCO id (expected e.g. val2014/COCO_val2014_000000391895.jpg)"
            )
    return ids


def caption_positions(
    split: RetrievalSplit, image_ids: list[int], captions: dict[int, tuple[int, str]]
) -> dict[int, int]:
    """COCO caption id -> its text index in ``split``, for every COCO caption found there: same
    image, same text up to whitespace (:func:`normalise_caption`); the k-th COCO caption (in file
    order) of an image with a given text takes the k-th such caption of the Karpathy entry."""
    free: dict[tuple[int, str], list[int]] = {}
    for t, text in enumerate(split.texts):
        free.setdefault((image_ids[split.txt2img[t]], normalise_caption(text)), []).append(t)
    for slots in free.values():
        slots.reverse()  # popped from the end: first caption first
    out = {}
    for cid, (iid, text) in captions.items():
        left = free.get((iid, normalise_caption(text)))
        if left:
            out[cid] = left.pop()
    return out


class _Lookup:
    """COCO ids -> indices of the Karpathy split, each miss one :class:`DataError` naming the id."""

    def __init__(
        self,
        split: RetrievalSplit,
        image_ids: list[int],
        coco_path: Path,
        captions: dict[int, tuple[int, str]],
        positions: dict[int, int],
    ) -> None:
        self.split, self.coco_path, self.captions, self.positions = split, coco_path, captions, positions
        self.images = {iid: i for i, iid in enumerate(image_ids)}

    def image(self, origin: str, iid: int) -> int:
        if iid not in self.images:
            raise DataError(f"{origin}: image id {iid} is not an image of {self.split.source}")
        return self.images[iid]

    def text(self, origin: str, cid: int) -> int:
        if cid not in self.captions:
            raise DataError(f"{origin}: caption id {cid} is not in {self.coco_path} (annotations[].id)")
        iid, text = self.captions[cid]
        if cid not in self.positions:
            where = f"entry {self.images[iid]}" if iid in self.images else "no entry: its image is not there"
            raise DataError(
                f"{origin}: caption id {cid} (image {iid}, {text.strip()!r}) is not a caption of "
                f"{self.split.source} ({where})"
            )
        return self.positions[cid]


def eccv_caption(
    karpathy_test: str | Path,
    coco_captions_json: str | Path,
    eccv: str | Path,
    out: str | Path,
    benchmark: str = "eccv-caption",
) -> dict[str, int]:
    """ECCV Caption's (``benchmark="cxc"``: CxC's) positives of the Karpathy test file
    ``karpathy_test`` (one entry per image, ALBEF's ``coco_test.json``) -> the relevance file ``out``
    (``vlp-relevance-v2``: ``relevant_images`` per caption, ``relevant_texts`` per image, empty for
    the captions and images that are not the benchmark's queries).

    ``eccv``: the id files' folder, the eccv-caption wheel, or ``auto`` (:func:`eccv_id_maps`).
    Returns counts: the split's images and captions, ``captions_matched`` (its captions found in
    ``coco_captions_json``), and per direction the queries and positive pairs written."""
    (i2t_origin, i2t), (t2i_origin, t2i) = eccv_id_maps(eccv, benchmark)
    split = load_retrieval_split(karpathy_test)
    names, captions = coco_captions(coco_captions_json)
    image_ids = karpathy_image_ids(split, names)
    positions = caption_positions(split, image_ids, captions)
    find = _Lookup(split, image_ids, Path(coco_captions_json), captions, positions)
    relevant_texts: list[list[int]] = [[] for _ in split.images]
    for iid, cids in i2t.items():
        relevant_texts[find.image(f"{i2t_origin}: key '{iid}'", iid)] = [
            find.text(f"{i2t_origin}: key '{iid}'", c) for c in cids
        ]
    relevant_images: list[list[int]] = [[] for _ in split.texts]
    for cid, iids in t2i.items():
        relevant_images[find.text(f"{t2i_origin}: key '{cid}'", cid)] = [
            find.image(f"{t2i_origin}: key '{cid}'", i) for i in iids
        ]
    record = relevance_record(
        Path(karpathy_test).name, split.texts, len(split.images), relevant_images, relevant_texts, benchmark
    )
    write_json_atomic(Path(out), record)
    return {
        "images": len(split.images),
        "captions": len(split.texts),
        "captions_matched": len(positions),
        "i2t_queries": len(i2t),
        "i2t_positives": sum(len(r) for r in record["relevant_texts"]),
        "t2i_queries": len(t2i),
        "t2i_positives": sum(len(r) for r in record["relevant_images"]),
    }

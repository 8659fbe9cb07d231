"""``vlp prepare``: convert official dataset releases into vlp's (ALBEF's) annotation files.

One function per source; each reads the official release files, writes our JSON files atomically
(:func:`vlp.data.json_entries.write_json_atomic`), returns a dict of counts, and raises
:class:`~vlp.errors.DataError` naming the file and key of malformed input. Karpathy and
img2dataset sources are converted here; Visual Genome in :mod:`vlp.data.prepare_vg`, VQA v2 in
:mod:`vlp.data.prepare_vqa`, NLVR2 in :mod:`vlp.data.prepare_nlvr` (their functions are importable
from here too), with the shared helpers of :mod:`vlp.data.prepare_common`.

- :func:`coco_karpathy`, :func:`flickr30k_karpathy`: Karpathy's ``dataset_coco.json`` /
  ``dataset_flickr30k.json`` -> ``{coco,flickr30k}_{train,val,test}.json`` (train: one entry per
  caption with ``image_id``, train + restval; val/test: one entry per image with its caption list).
  Image paths are relative to the image root (``data.image_root``).
- :func:`cc3m`, :func:`sbu`: caption files + images downloaded by img2dataset (``00000/000000012.jpg``
  with a sidecar ``000000012.json`` holding ``url``, ``caption``, ``key``, ``status``) -> pretraining
  pairs; rows whose image is missing are counted and left out. Images are matched by URL through the
  sidecars, so the row order, a header line or img2dataset's shard size do not matter.
- :func:`visual_genome`: ``region_descriptions.json`` + ``image_data.json`` -> one pretraining entry
  per image with its region phrases as a caption list.
- :func:`visual_genome_qa`: ``question_answers.json`` + ``image_data.json`` -> VG-QA entries
  (ALBEF's ``vg_qa.json``), answers normalised, optionally only those in the VQA answer list.
- :func:`vqa_v2`, :func:`answer_list`: official VQA v2 questions / annotations -> ``vqa_*.json``
  entries and the most frequent answers (``answer_list.json``).
- :func:`nlvr2`: official NLVR2 JSON-lines files -> ``nlvr_*.json``.
- :func:`snli_ve`: official SNLI-VE JSON-lines files -> ``ve_*.json`` (:mod:`vlp.data.prepare_ve`).

Pretraining pairs (CC3M, SBU, VG) hold absolute image paths (the resolved image folder joined with
the file's place in it), so several of them can go into one ``data.train`` with any
``data.image_root``; the downstream files hold paths relative to the dataset's image root, as ALBEF's.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Optional, Sequence

from vlp.data.json_entries import read_json, write_json_atomic
from vlp.data.prepare_common import _absolute, _check_images, _key, _lines, _text, _top_list
from vlp.data.prepare_nlvr import NLVR_SPLITS, nlvr2, nlvr_images
from vlp.data.prepare_ve import VE_SPLITS, snli_ve, snli_ve_split
from vlp.data.prepare_vg import VG_FOLDERS, visual_genome, visual_genome_qa
from vlp.data.prepare_vqa import VQA_SPLITS, answer_list, vqa_image, vqa_v2
from vlp.errors import DataError

__all__ = [
    "IMAGE_SUFFIXES",
    "KARPATHY_SPLITS",
    "NLVR_SPLITS",
    "VE_SPLITS",
    "VG_FOLDERS",
    "VQA_SPLITS",
    "add_prepare_parser",
    "answer_list",
    "cc3m",
    "coco_karpathy",
    "flickr30k_karpathy",
    "img2dataset_index",
    "nlvr2",
    "nlvr_images",
    "sbu",
    "snli_ve",
    "snli_ve_split",
    "visual_genome",
    "visual_genome_qa",
    "vqa_image",
    "vqa_v2",
]


# --------------------------------------------------------------------------
# Karpathy splits (COCO, Flickr30k)
# --------------------------------------------------------------------------

KARPATHY_SPLITS = {"train": "train", "restval": "train", "val": "val", "test": "test"}


def _karpathy(
    dataset_json: str | Path, out_dir: str | Path, name: str, image_path, image_id, image_root: Optional[str | Path]
) -> dict[str, int]:
    path = Path(dataset_json)
    images = _top_list(path, read_json(path), "images")
    out: dict[str, list] = {"train": [], "val": [], "test": []}
    counts = {f"{s}_{k}": 0 for s in out for k in ("images", "captions")}
    paths = []
    for i, img in enumerate(images):
        where = f"images[{i}]"
        split = _key(path, where, img, "split", (str,), "one of train, restval, val, test")
        if split not in KARPATHY_SPLITS:
            raise DataError(f"{path}: {where}: key 'split' is {split!r}, expected one of train, restval, val, test")
        split = KARPATHY_SPLITS[split]
        rel = image_path(path, where, img)
        sentences = _key(path, where, img, "sentences", (list,), 'a non-empty list of {"raw": caption}')
        if not sentences:
            raise DataError(f"{path}: {where}: key 'sentences' is an empty list, expected captions")
        caps = [_text(path, f"{where}.sentences[{k}]", s, "raw", "a caption string") for k, s in enumerate(sentences)]
        paths.append(rel)
        counts[f"{split}_images"] += 1
        counts[f"{split}_captions"] += len(caps)
        if split == "train":
            iid = image_id(path, where, img)
            out["train"].extend({"image": rel, "caption": c, "image_id": iid} for c in caps)
        else:
            out[split].append({"image": rel, "caption": caps})
    _check_images(paths, image_root, path)
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
            _text(path, where, img, "filepath", "the image folder, e.g. val2014")
            + "/"
            + _text(path, where, img, "filename", "the image file name")
        )

    def image_id(path: Path, where: str, img: dict) -> str:
        return f"coco_{_key(path, where, img, 'cocoid', (int, str), 'the COCO image id')}"

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
        name = _text(path, where, img, "filename", "the image file name")
        return f"{prefix.rstrip('/')}/{name}" if prefix else name

    def image_id(path: Path, where: str, img: dict) -> str:
        return f"flickr30k_{Path(_text(path, where, img, 'filename', 'the image file name')).stem}"

    return _karpathy(dataset_flickr30k_json, out_dir, "flickr30k", image_path, image_id, image_root)


# --------------------------------------------------------------------------
# img2dataset downloads (CC3M, SBU)
# --------------------------------------------------------------------------

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")


def img2dataset_index(image_dir: str | Path) -> dict[str, str]:
    """URL -> image path (relative to ``image_dir``) of every successful img2dataset download:
    the sidecar ``SHARD/KEY.json`` files (``{"url", "caption", "key", "status"}``) whose status is
    ``success`` and whose image ``SHARD/KEY.jpg`` (or .jpeg/.png/.webp) exists."""
    root = Path(image_dir)
    if not root.is_dir():
        raise DataError(f"image folder not found: {root}")
    index: dict[str, str] = {}
    for side in sorted(root.glob("*/*.json")):
        try:
            meta = json.loads(side.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise DataError(f"{side}: invalid JSON sidecar ({e})") from None
        if not isinstance(meta, dict):
            raise DataError(f"{side}: expected an img2dataset sidecar object, got {type(meta).__name__}")
        if meta.get("status", "success") != "success":
            continue
        url = _key(side, "sidecar", meta, "url", (str,), "the image URL")
        image = next((side.with_suffix(s) for s in IMAGE_SUFFIXES if side.with_suffix(s).is_file()), None)
        if image is not None:
            index.setdefault(url, image.relative_to(root).as_posix())
    return index


def _pairs_from_urls(rows: list[tuple[str, str, str]], image_dir: str | Path, out: str | Path) -> dict[str, int]:
    """rows: (caption, url, where) -> pairs of the downloaded images; the others are counted."""
    index = img2dataset_index(image_dir)
    root = Path(image_dir)
    entries, missing = [], 0
    for caption, url, _ in rows:
        rel = index.get(url)
        if rel is None:
            missing += 1
        else:
            entries.append({"image": _absolute(root, rel), "caption": caption})
    if not entries:
        raise DataError(
            f"none of the {len(rows)} images was found in {root} (img2dataset output with sidecar .json files)"
        )
    write_json_atomic(Path(out), entries)
    return {"rows": len(rows), "entries": len(entries), "missing_images": missing}


def cc3m(tsv: str | Path, image_dir: str | Path, out: str | Path) -> dict[str, int]:
    """CC3M ``Train_GCC-training.tsv`` (``caption<TAB>url`` per line; a ``caption<TAB>url`` header, as
    img2dataset wants, is skipped) + the img2dataset download in ``image_dir`` -> pretraining pairs
    ``[{"image": absolute path, "caption": str}]``. Returns ``rows``, ``entries``, ``missing_images``."""
    path = Path(tsv)
    rows = []
    for n, line in enumerate(_lines(path), 1):
        if n == 1 and line.strip().lower() == "caption\turl":
            continue
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 2:
            raise DataError(f"{path}: line {n}: expected 2 tab-separated fields (caption, url), got {len(fields)}")
        caption, url = fields[0].strip(), fields[1].strip()
        if not caption:
            raise DataError(f"{path}: line {n}: empty caption")
        if not url:
            raise DataError(f"{path}: line {n}: empty url")
        rows.append((caption, url, f"line {n}"))
    if not rows:
        raise DataError(f"{path}: no rows")
    return _pairs_from_urls(rows, image_dir, out)


def sbu(captions_txt: str | Path, urls_txt: str | Path, image_dir: str | Path, out: str | Path) -> dict[str, int]:
    """SBU ``SBU_captioned_photo_dataset_captions.txt`` + ``SBU_captioned_photo_dataset_urls.txt``
    (line-aligned) + the img2dataset download in ``image_dir`` -> pretraining pairs."""
    cpath, upath = Path(captions_txt), Path(urls_txt)
    caps, urls = _lines(cpath), _lines(upath)
    # a trailing empty line at the end of either file is not a row
    while caps and not caps[-1].strip():
        caps.pop()
    while urls and not urls[-1].strip():
        urls.pop()
    if len(caps) != len(urls):
        raise DataError(f"{cpath} has {len(caps)} lines but {upath} has {len(urls)}: the files must be line-aligned")
    rows = []
    for n, (c, u) in enumerate(zip(caps, urls), 1):
        if not c.strip():
            raise DataError(f"{cpath}: line {n}: empty caption")
        if not u.strip():
            raise DataError(f"{upath}: line {n}: empty url")
        rows.append((c.strip(), u.strip(), f"line {n}"))
    if not rows:
        raise DataError(f"{cpath}: no rows")
    return _pairs_from_urls(rows, image_dir, out)


# --------------------------------------------------------------------------
# command line: vlp prepare ...
# --------------------------------------------------------------------------


def _print_counts(what: str, counts: dict[str, int], outs: Sequence[str | Path]) -> None:
    print(f"{what}: " + ", ".join(f"{k}={v}" for k, v in counts.items()))
    for o in outs:
        print(f"wrote {o}")


def _run(a: argparse.Namespace) -> None:
    d = a.dataset
    if d in ("coco", "flickr30k"):
        if d == "coco":
            counts = coco_karpathy(a.karpathy_json, a.image_root, a.out)
        else:
            counts = flickr30k_karpathy(a.karpathy_json, a.image_root, a.out, a.prefix)
        _print_counts(d, counts, [Path(a.out) / f"{d}_{s}.json" for s in ("train", "val", "test")])
        return
    if d == "cc3m":
        counts = cc3m(a.tsv, a.images, a.out)
    elif d == "sbu":
        counts = sbu(a.captions, a.urls, a.images, a.out)
    elif d == "vg":
        counts = visual_genome(a.region_descriptions, a.image_data, a.image_root, a.out)
    elif d == "vg-qa":
        counts = visual_genome_qa(a.question_answers, a.image_data, a.image_root, a.out, a.answer_list)
    elif d == "vqa":
        counts = vqa_v2(a.questions, a.annotations, a.split, a.image_root, a.out)
    elif d == "vqa-answers":
        counts = answer_list(a.annotations, a.top_k, a.out)
    elif d == "refcoco+":
        from vlp.data.prepare_refcoco import prepare_refcoco

        paths = prepare_refcoco(a.refs, a.instances, a.out, a.dataset, a.dets, a.dets_by, a.image_prefix, a.image_root)
        counts = {split: len(json.loads(p.read_text())) for split, p in paths.items()}
        _print_counts(f"{a.dataset} (entries)", counts, list(paths.values()))
        return
    elif d == "snli-ve":
        for src in a.jsonl:  # every name checked before any file is written
            snli_ve_split(src)
        for src in a.jsonl:
            out = Path(a.out) / f"ve_{snli_ve_split(src)}.json"
            _print_counts(f"{d} {Path(src).name}", snli_ve(src, out, a.image_root), [out])
        return
    else:
        counts = nlvr2(a.jsonl, a.split, a.out, a.image_root)
    _print_counts(d, counts, [a.out])


def add_prepare_parser(sub: Any) -> None:
    """Add ``vlp prepare coco|flickr30k|cc3m|sbu|vg|vg-qa|vqa|vqa-answers|nlvr2|snli-ve|refcoco+`` to the subparsers ``sub``."""
    s = sub.add_parser("prepare", help="convert official dataset releases into vlp's (ALBEF's) annotation files")
    pp = s.add_subparsers(dest="dataset", required=True)
    for name, text in (
        ("coco", "Karpathy dataset_coco.json -> coco_{train,val,test}.json"),
        ("flickr30k", "Karpathy dataset_flickr30k.json -> flickr30k_{train,val,test}.json"),
    ):
        c = pp.add_parser(name, help=text)
        c.add_argument("karpathy_json", metavar="KARPATHY_JSON")
        c.add_argument("--out", required=True, metavar="DIR", help="output folder")
        c.add_argument("--image-root", metavar="ROOT", help="if given, check that every image exists under it")
        if name == "flickr30k":
            c.add_argument(
                "--prefix", default="flickr30k-images", help="folder put before each file name ('' for none)"
            )
    c = pp.add_parser("cc3m", help="CC3M Train_GCC-training.tsv + img2dataset images -> pretraining pairs")
    c.add_argument("tsv", metavar="TSV")
    c.add_argument("--images", required=True, metavar="DIR", help="img2dataset output folder (00000/, 00001/, ...)")
    c.add_argument("--out", required=True, metavar="JSON")
    c = pp.add_parser("sbu", help="SBU captions + urls files + img2dataset images -> pretraining pairs")
    c.add_argument("captions", metavar="CAPTIONS_TXT")
    c.add_argument("urls", metavar="URLS_TXT")
    c.add_argument("--images", required=True, metavar="DIR", help="img2dataset output folder")
    c.add_argument("--out", required=True, metavar="JSON")
    for name, source, text in (
        ("vg", "region_descriptions", "region_descriptions.json + image_data.json -> pretraining entries"),
        ("vg-qa", "question_answers", "question_answers.json + image_data.json -> vg_qa.json (VQA training)"),
    ):
        c = pp.add_parser(name, help=f"Visual Genome {text}")
        c.add_argument(source, metavar=source.upper() + "_JSON")
        c.add_argument("image_data", metavar="IMAGE_DATA_JSON")
        c.add_argument("--image-root", required=True, metavar="ROOT", help="folder holding VG_100K/ and VG_100K_2/")
        if name == "vg-qa":
            c.add_argument(
                "--answer-list", metavar="JSON", help="keep only answers in this answer_list.json (vqa-answers)"
            )
        c.add_argument("--out", required=True, metavar="JSON")
    c = pp.add_parser("vqa", help="official VQA v2 questions (+ annotations) -> vqa_*.json")
    c.add_argument("questions", metavar="QUESTIONS_JSON")
    c.add_argument("--annotations", metavar="ANNOTATIONS_JSON", help="omit for the test splits")
    c.add_argument("--split", required=True, choices=list(VQA_SPLITS), help="the split of the files (image folder)")
    c.add_argument("--image-root", metavar="ROOT", help="if given, check that every image exists under it")
    c.add_argument("--out", required=True, metavar="JSON")
    c = pp.add_parser("vqa-answers", help="official VQA v2 annotations -> answer_list.json (most frequent answers)")
    c.add_argument("annotations", nargs="+", metavar="ANNOTATIONS_JSON")
    c.add_argument("--top-k", type=int, default=3128, help="number of answers (ALBEF's list has 3128)")
    c.add_argument("--out", required=True, metavar="JSON")
    c = pp.add_parser("nlvr2", help="official NLVR2 train.json / dev.json / test1.json -> nlvr_*.json")
    c.add_argument("jsonl", metavar="NLVR2_JSON")
    c.add_argument("--split", required=True, choices=list(NLVR_SPLITS))
    c.add_argument("--image-root", metavar="ROOT", help="if given, check that every image exists under it")
    c.add_argument("--out", required=True, metavar="JSON")
    c = pp.add_parser("snli-ve", help="official snli_ve_{train,dev,test}.jsonl -> ve_{train,dev,test}.json")
    c.add_argument("jsonl", nargs="+", metavar="SNLI_VE_JSONL", help="snli_ve_train.jsonl, snli_ve_dev.jsonl, ...")
    c.add_argument("--image-root", metavar="ROOT", help="if given, check that every <Flickr30K_ID>.jpg exists under it")
    c.add_argument("--out", required=True, metavar="DIR", help="output folder")
    c = pp.add_parser(
        "refcoco+",
        help="refer toolkit refs(unc).p + COCO instances.json -> refcoco+_{train,val,testA,testB}.json (grounding)",
    )
    c.add_argument("refs", metavar="REFS_PICKLE", help="refs(unc).p (read with a restricted unpickler: data only)")
    c.add_argument("instances", metavar="INSTANCES_JSON", help="COCO instances.json of the refs' images")
    c.add_argument("--out", required=True, metavar="DIR", help="output folder")
    c.add_argument("--dataset", default="refcoco+", help="file-name prefix (refcoco, refcoco+, refcocog)")
    c.add_argument(
        "--dets", metavar="JSON", help="detections replacing the gold candidate boxes (ALBEF used MAttNet's)"
    )
    c.add_argument("--dets-by", default="image_id", choices=["image_id", "ref_id"], help="the detections' keys")
    c.add_argument("--image-prefix", default="", help="put before each COCO file_name, e.g. train2014/")
    c.add_argument("--image-root", metavar="ROOT", help="if given, check that every image exists under it")
    s.set_defaults(func=_run)

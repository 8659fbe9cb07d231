"""``vlp prepare``: convert official dataset releases into vlp's (ALBEF's) annotation files.

One function per source; each reads the official release files, writes our JSON files atomically
(:func:`vlp.data.formats.write_json_atomic`), returns a dict of counts, and raises
:class:`~vlp.data.formats.DataError` naming the file and key of malformed input.

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

Pretraining pairs (CC3M, SBU, VG) hold absolute image paths (the resolved image folder joined with
the file's place in it), so several of them can go into one ``data.train`` with any
``data.image_root``; the downstream files hold paths relative to the dataset's image root, as ALBEF's.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence
from urllib.parse import urlparse

from vlp.data.formats import DataError, read_json, write_json_atomic

# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def _key(path: Path, where: str, obj: Any, key: str, types: tuple[type, ...], what: str) -> Any:
    """``obj[key]`` of ``where`` in ``path``; a missing key or a wrong type is a DataError naming both."""
    if not isinstance(obj, dict):
        raise DataError(f"{path}: {where}: expected an object, got {type(obj).__name__}")
    if key not in obj:
        raise DataError(f"{path}: {where}: missing key '{key}' (expected {what})")
    v = obj[key]
    if not isinstance(v, types) or isinstance(v, bool):
        raise DataError(f"{path}: {where}: key '{key}' is {type(v).__name__}, expected {what}")
    return v


def _text(path: Path, where: str, obj: Any, key: str, what: str) -> str:
    """A non-empty string ``obj[key]``, stripped."""
    v = _key(path, where, obj, key, (str,), what)
    if not v.strip():
        raise DataError(f"{path}: {where}: key '{key}' is empty, expected {what}")
    return v.strip()


def _top_list(path: Path, data: Any, key: Optional[str]) -> list:
    """``data[key]`` (or ``data`` itself when ``key`` is None), which must be a list."""
    if key is not None:
        if not isinstance(data, dict) or key not in data:
            raise DataError(f"{path}: missing top-level key '{key}' (expected an object with a list under '{key}')")
        data = data[key]
        if not isinstance(data, list):
            raise DataError(f"{path}: key '{key}' is {type(data).__name__}, expected a list")
    elif not isinstance(data, list):
        raise DataError(f"{path}: expected a JSON list, got {type(data).__name__}")
    return data


def _check_images(rel_paths: Iterable[str], image_root: Optional[str | Path], source: Path) -> None:
    """With an ``image_root``, every (relative) image must exist under it; one error with the count."""
    if image_root is None:
        return
    root = Path(image_root)
    distinct = list(dict.fromkeys(rel_paths))
    missing = [p for p in distinct if not (root / p).is_file()]
    if missing:
        raise DataError(f"{source}: {len(missing)} of {len(distinct)} images not found under {root}, e.g. "
                        + ", ".join(missing[:3]))


def _absolute(root: Path, rel: str) -> str:
    return str(root.resolve() / rel)


# --------------------------------------------------------------------------
# Karpathy splits (COCO, Flickr30k)
# --------------------------------------------------------------------------

KARPATHY_SPLITS = {"train": "train", "restval": "train", "val": "val", "test": "test"}


def _karpathy(dataset_json: str | Path, out_dir: str | Path, name: str, image_path, image_id,
              image_root: Optional[str | Path]) -> dict[str, int]:
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
        sentences = _key(path, where, img, "sentences", (list,), "a non-empty list of {\"raw\": caption}")
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
            raise DataError(f"{path}: no images of split {split!r}" + (" (train or restval)" if split == "train" else ""))
        write_json_atomic(out_dir / f"{name}_{split}.json", entries)
    return counts


def coco_karpathy(dataset_coco_json: str | Path, image_root: Optional[str | Path], out_dir: str | Path) -> dict[str, int]:
    """Karpathy's ``dataset_coco.json`` -> ``out_dir/coco_{train,val,test}.json``.

    Image paths are ``filepath/filename`` (``val2014/COCO_val2014_000000391895.jpg``), relative to the
    COCO folder holding ``train2014/`` and ``val2014/``; ``image_id`` is ``coco_<cocoid>``. With an
    ``image_root`` every image must exist there. Returns ``{split}_images`` / ``{split}_captions``.
    """
    def image_path(path: Path, where: str, img: dict) -> str:
        return (_text(path, where, img, "filepath", "the image folder, e.g. val2014") + "/"
                + _text(path, where, img, "filename", "the image file name"))

    def image_id(path: Path, where: str, img: dict) -> str:
        return f"coco_{_key(path, where, img, 'cocoid', (int, str), 'the COCO image id')}"

    return _karpathy(dataset_coco_json, out_dir, "coco", image_path, image_id, image_root)


def flickr30k_karpathy(dataset_flickr30k_json: str | Path, image_root: Optional[str | Path], out_dir: str | Path,
                       prefix: str = "flickr30k-images") -> dict[str, int]:
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
        raise DataError(f"none of the {len(rows)} images was found in {root} (img2dataset output with sidecar .json files)")
    write_json_atomic(Path(out), entries)
    return {"rows": len(rows), "entries": len(entries), "missing_images": missing}


def _lines(path: Path) -> list[str]:
    if not path.is_file():
        raise DataError(f"file not found: {path}")
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason})") from None


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
# Visual Genome
# --------------------------------------------------------------------------

VG_FOLDERS = ("VG_100K", "VG_100K_2")


def _vg_images(ipath: Path) -> dict[Any, str]:
    """VG ``image_data.json`` -> image id -> ``VG_100K[_2]/NAME`` (the folder from the image's URL)."""
    folder: dict[Any, str] = {}
    for i, img in enumerate(_top_list(ipath, read_json(ipath), None)):
        where = f"entry {i}"
        iid = _key(ipath, where, img, "image_id", (int, str), "the VG image id")
        url = _text(ipath, where, img, "url", "the image URL (.../VG_100K/ID.jpg or .../VG_100K_2/ID.jpg)")
        parts = urlparse(url).path.rstrip("/").split("/")
        if len(parts) < 2 or parts[-2] not in VG_FOLDERS:
            raise DataError(f"{ipath}: {where}: key 'url' is {url!r}, expected a URL ending in VG_100K/NAME or VG_100K_2/NAME")
        folder[iid] = f"{parts[-2]}/{parts[-1]}"
    return folder


def visual_genome(region_descriptions_json: str | Path, image_data_json: str | Path, image_root: str | Path,
                  out: str | Path) -> dict[str, int]:
    """VG ``region_descriptions.json`` + ``image_data.json`` -> one pretraining entry per image
    ``{"image": IMAGE_ROOT/VG_100K[_2]/ID.jpg (absolute), "caption": [region phrases]}``.

    The folder comes from the image's URL in ``image_data.json``. Phrases are stripped; empty ones
    and exact repeats within an image are left out (counted); images without phrases are left out.
    """
    rpath, ipath = Path(region_descriptions_json), Path(image_data_json)
    folder = _vg_images(ipath)
    root = Path(image_root)
    captions: dict[Any, list[str]] = {}
    dropped = regions = 0
    for i, item in enumerate(_top_list(rpath, read_json(rpath), None)):
        for k, r in enumerate(_key(rpath, f"entry {i}", item, "regions", (list,), "a list of regions")):
            where = f"entry {i} regions[{k}]"
            iid = _key(rpath, where, r, "image_id", (int, str), "the VG image id")
            phrase = _key(rpath, where, r, "phrase", (str,), "the region description")
            if iid not in folder:
                raise DataError(f"{rpath}: {where}: image_id {iid!r} is not in {ipath}")
            regions += 1
            caps = captions.setdefault(iid, [])
            if not phrase.strip() or phrase.strip() in caps:
                dropped += 1
            else:
                caps.append(phrase.strip())
    entries = [{"image": _absolute(root, folder[iid]), "caption": caps} for iid, caps in captions.items() if caps]
    if not entries:
        raise DataError(f"{rpath}: no region phrases")
    write_json_atomic(Path(out), entries)
    return {"images": len(entries), "captions": sum(len(e["caption"]) for e in entries), "regions": regions,
            "dropped_phrases": dropped}


def visual_genome_qa(question_answers_json: str | Path, image_data_json: str | Path, image_root: str | Path,
                     out: str | Path, answer_list_json: Optional[str | Path] = None) -> dict[str, int]:
    """VG ``question_answers.json`` + ``image_data.json`` -> VG-QA entries ``{"question", "answer",
    "image": IMAGE_ROOT/VG_100K[_2]/ID.jpg (absolute), "dataset": "vg", "question_id": "vg_<qa_id>"}``
    (ALBEF's ``vg_qa.json``: one answer, weight 0.5 in training).

    Answers are normalised as VQA answers are compared (:func:`vlp.eval.vqa.normalize_answer`:
    ``"Black."`` -> ``"black"``). With ``answer_list_json`` (the VQA ``answer_list.json``) only
    questions whose answer is in that list are kept, as VQA fine-tuning can only rank those; the
    others are counted (``not_in_answer_list``). Empty questions or answers are counted and left out.
    """
    from vlp.eval.vqa import normalize_answer

    qpath, ipath = Path(question_answers_json), Path(image_data_json)
    folder = _vg_images(ipath)
    allowed = None
    if answer_list_json is not None:
        apath = Path(answer_list_json)
        allowed = set()
        for i, a in enumerate(_top_list(apath, read_json(apath), None)):
            if not isinstance(a, str):
                raise DataError(f"{apath}: entry {i} is {type(a).__name__}, expected an answer string")
            allowed.add(normalize_answer(a))
    root = Path(image_root)
    entries: list[dict[str, Any]] = []
    qas = empty = outside = 0
    for i, item in enumerate(_top_list(qpath, read_json(qpath), None)):
        for k, qa in enumerate(_key(qpath, f"entry {i}", item, "qas", (list,), "a list of question-answer objects")):
            where = f"entry {i} qas[{k}]"
            iid = _key(qpath, where, qa, "image_id", (int, str), "the VG image id")
            question = _key(qpath, where, qa, "question", (str,), "the question").strip()
            answer = normalize_answer(_key(qpath, where, qa, "answer", (str,), "the answer"))
            qa_id = _key(qpath, where, qa, "qa_id", (int, str), "the question-answer id")
            if iid not in folder:
                raise DataError(f"{qpath}: {where}: image_id {iid!r} is not in {ipath}")
            qas += 1
            if not question or not answer:
                empty += 1
            elif allowed is not None and answer not in allowed:
                outside += 1
            else:
                entries.append({"question": question, "answer": answer, "image": _absolute(root, folder[iid]),
                                "dataset": "vg", "question_id": f"vg_{qa_id}"})
    if not entries:
        raise DataError(f"{qpath}: no question-answer pairs kept (of {qas})")
    write_json_atomic(Path(out), entries)
    counts = {"questions": len(entries), "images": len({e["image"] for e in entries}), "qas": qas, "empty": empty}
    return counts | ({"not_in_answer_list": outside} if allowed is not None else {})


# --------------------------------------------------------------------------
# VQA v2
# --------------------------------------------------------------------------

#: split name (of the official file names) -> COCO image folder
VQA_SPLITS = {"train2014": "train2014", "val2014": "val2014", "test2015": "test2015", "test-dev2015": "test2015",
              "train": "train2014", "val": "val2014", "test": "test2015", "test-dev": "test2015"}


def vqa_image(split_name: str, image_id: int) -> str:
    """``train2014/COCO_train2014_000000458752.jpg`` for split ``train2014`` and image 458752."""
    d = VQA_SPLITS[split_name]
    return f"{d}/COCO_{d}_{int(image_id):012d}.jpg"


def vqa_v2(questions_json: str | Path, annotations_json: Optional[str | Path], split_name: str,
           image_root: Optional[str | Path], out: str | Path) -> dict[str, int]:
    """Official VQA v2 ``v2_OpenEnded_mscoco_{split}_questions.json`` (+ ``v2_mscoco_{split}_annotations.json``,
    None for the test splits) -> ``[{"question_id", "question", "answer": [10 annotator answers],
    "image": "train2014/COCO_train2014_....jpg", "dataset": "vqa", "question_type": answer type}]``.

    ``question_type`` holds the annotation's ``answer_type`` (yes/no, number, other) so that
    evaluation reports accuracy per answer type, as the official evaluation does. With an
    ``image_root`` (the folder holding train2014/ val2014/ test2015/) every image must exist.
    """
    if split_name not in VQA_SPLITS:
        raise DataError(f"unknown VQA split {split_name!r}, expected one of {list(VQA_SPLITS)}")
    qpath = Path(questions_json)
    questions = _top_list(qpath, read_json(qpath), "questions")
    answers: Optional[dict] = None
    if annotations_json is not None:
        apath = Path(annotations_json)
        answers = {}
        for i, a in enumerate(_top_list(apath, read_json(apath), "annotations")):
            where = f"annotations[{i}]"
            qid = _key(apath, where, a, "question_id", (int, str), "the question id")
            raw = _key(apath, where, a, "answers", (list,), "a non-empty list of {\"answer\": str}")
            if not raw:
                raise DataError(f"{apath}: {where}: key 'answers' is an empty list, expected annotator answers")
            texts = [_key(apath, f"{where}.answers[{k}]", x, "answer", (str,), "an answer string") for k, x in enumerate(raw)]
            atype = a.get("answer_type")
            answers[qid] = (texts, atype if isinstance(atype, str) else None)
    entries = []
    for i, q in enumerate(questions):
        where = f"questions[{i}]"
        qid = _key(qpath, where, q, "question_id", (int, str), "the question id")
        image_id = _key(qpath, where, q, "image_id", (int,), "the COCO image id (int)")
        e: dict[str, Any] = {"question_id": qid, "question": _text(qpath, where, q, "question", "a question string"),
                             "image": vqa_image(split_name, image_id), "dataset": "vqa"}
        if answers is not None:
            if qid not in answers:
                raise DataError(f"{annotations_json}: no annotation with question_id {qid!r} ({qpath} {where})")
            e["answer"], atype = answers[qid]
            if atype is not None:
                e["question_type"] = atype
        entries.append(e)
    if not entries:
        raise DataError(f"{qpath}: key 'questions' is an empty list")
    _check_images((e["image"] for e in entries), image_root, qpath)
    write_json_atomic(Path(out), entries)
    return {"questions": len(entries), "images": len({e["image"] for e in entries}),
            "answered": len(entries) if answers is not None else 0}


def answer_list(annotations: Sequence[str | Path], top_k: int, out: str | Path) -> dict[str, int]:
    """The ``top_k`` most frequent answers of official VQA v2 annotation files -> ``answer_list.json``
    (a JSON list of distinct strings, most frequent first, ties by the answer's text).

    Each question counts once, with its ``multiple_choice_answer`` (the official most frequent of its
    10 answers), or, where that key is absent, the most frequent of its ``answers``."""
    if top_k < 1:
        raise DataError(f"top_k must be >= 1, got {top_k}")
    counts: Counter[str] = Counter()
    for apath in map(Path, annotations):
        for i, a in enumerate(_top_list(apath, read_json(apath), "annotations")):
            where = f"annotations[{i}]"
            if isinstance(a, dict) and "multiple_choice_answer" in a:
                ans = _key(apath, where, a, "multiple_choice_answer", (str,), "an answer string")
            else:
                raw = _key(apath, where, a, "answers", (list,), "a non-empty list of {\"answer\": str}")
                texts = [_key(apath, f"{where}.answers[{k}]", x, "answer", (str,), "an answer string")
                         for k, x in enumerate(raw)]
                if not texts:
                    raise DataError(f"{apath}: {where}: key 'answers' is an empty list, expected annotator answers")
                ans = Counter(texts).most_common(1)[0][0]
            if ans.strip():
                counts[ans.strip()] += 1
    if not counts:
        raise DataError(f"no answers in {[str(p) for p in annotations]}")
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:top_k]
    write_json_atomic(Path(out), [a for a, _ in ranked])
    return {"answers": len(ranked), "distinct": len(counts), "questions": sum(counts.values()),
            "covered": sum(c for _, c in ranked)}


# --------------------------------------------------------------------------
# NLVR2
# --------------------------------------------------------------------------

NLVR_SPLITS = ("train", "dev", "test1", "test2")


def nlvr_images(split: str, identifier: str, directory: Optional[int | str] = None) -> list[str]:
    """The two image paths of an NLVR2 example, relative to the NLVR2 folder: identifier
    ``train-10171-0-0`` -> ``images/train/{directory}/train-10171-0-img0.png`` (the train images
    come in 100 numbered folders), ``dev-850-0-3`` -> ``dev/dev-850-0-img0.png`` (dev, test1, test2:
    one folder, as in ALBEF's files)."""
    prefix = identifier.rsplit("-", 1)[0]
    folder = f"images/train/{directory}" if split == "train" else split
    return [f"{folder}/{prefix}-img0.png", f"{folder}/{prefix}-img1.png"]


def nlvr2(jsonl: str | Path, split: str, out: str | Path, image_root: Optional[str | Path] = None) -> dict[str, int]:
    """Official NLVR2 ``train.json`` / ``dev.json`` / ``test1.json`` (one JSON object per line:
    ``identifier``, ``sentence``, ``label`` "True"/"False", ``directory`` (train), URLs ...) ->
    ``[{"images": [img0, img1], "sentence", "label": "True"/"False", "identifier"}]``.
    With an ``image_root`` (the NLVR2 folder) every image must exist."""
    if split not in NLVR_SPLITS:
        raise DataError(f"unknown NLVR2 split {split!r}, expected one of {list(NLVR_SPLITS)}")
    path = Path(jsonl)
    entries = []
    for n, line in enumerate(_lines(path), 1):
        if not line.strip():
            continue
        where = f"line {n}"
        try:
            e = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(f"{path}: {where}: invalid JSON ({err.msg})") from None
        ident = _text(path, where, e, "identifier", "an identifier like train-10171-0-0")
        parts = ident.split("-")
        if len(parts) != 4 or parts[0] != split:
            raise DataError(f"{path}: {where}: key 'identifier' is {ident!r}, expected {split}-N-N-N (split {split!r})")
        label = _key(path, where, e, "label", (str,), '"True" or "False"')
        if label not in ("True", "False"):
            raise DataError(f"{path}: {where}: key 'label' is {label!r}, expected \"True\" or \"False\"")
        directory = _key(path, where, e, "directory", (int, str), "the train image folder number") if split == "train" else None
        entries.append({"images": nlvr_images(split, ident, directory),
                        "sentence": _text(path, where, e, "sentence", "a sentence string"),
                        "label": label, "identifier": ident})
    if not entries:
        raise DataError(f"{path}: no examples")
    _check_images((p for e in entries for p in e["images"]), image_root, path)
    write_json_atomic(Path(out), entries)
    return {"examples": len(entries), "true": sum(e["label"] == "True" for e in entries),
            "false": sum(e["label"] == "False" for e in entries)}


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
    else:
        counts = nlvr2(a.jsonl, a.split, a.out, a.image_root)
    _print_counts(d, counts, [a.out])


def add_prepare_parser(sub: Any) -> None:
    """Add ``vlp prepare coco|flickr30k|cc3m|sbu|vg|vg-qa|vqa|vqa-answers|nlvr2`` to the subparsers ``sub``."""
    s = sub.add_parser("prepare", help="convert official dataset releases into vlp's (ALBEF's) annotation files")
    pp = s.add_subparsers(dest="dataset", required=True)
    for name, text in (("coco", "Karpathy dataset_coco.json -> coco_{train,val,test}.json"),
                       ("flickr30k", "Karpathy dataset_flickr30k.json -> flickr30k_{train,val,test}.json")):
        c = pp.add_parser(name, help=text)
        c.add_argument("karpathy_json", metavar="KARPATHY_JSON")
        c.add_argument("--out", required=True, metavar="DIR", help="output folder")
        c.add_argument("--image-root", metavar="ROOT", help="if given, check that every image exists under it")
        if name == "flickr30k":
            c.add_argument("--prefix", default="flickr30k-images", help="folder put before each file name ('' for none)")
    c = pp.add_parser("cc3m", help="CC3M Train_GCC-training.tsv + img2dataset images -> pretraining pairs")
    c.add_argument("tsv", metavar="TSV")
    c.add_argument("--images", required=True, metavar="DIR", help="img2dataset output folder (00000/, 00001/, ...)")
    c.add_argument("--out", required=True, metavar="JSON")
    c = pp.add_parser("sbu", help="SBU captions + urls files + img2dataset images -> pretraining pairs")
    c.add_argument("captions", metavar="CAPTIONS_TXT")
    c.add_argument("urls", metavar="URLS_TXT")
    c.add_argument("--images", required=True, metavar="DIR", help="img2dataset output folder")
    c.add_argument("--out", required=True, metavar="JSON")
    for name, source, text in (("vg", "region_descriptions", "region_descriptions.json + image_data.json -> pretraining entries"),
                               ("vg-qa", "question_answers", "question_answers.json + image_data.json -> vg_qa.json (VQA training)")):
        c = pp.add_parser(name, help=f"Visual Genome {text}")
        c.add_argument(source, metavar=source.upper() + "_JSON")
        c.add_argument("image_data", metavar="IMAGE_DATA_JSON")
        c.add_argument("--image-root", required=True, metavar="ROOT", help="folder holding VG_100K/ and VG_100K_2/")
        if name == "vg-qa":
            c.add_argument("--answer-list", metavar="JSON", help="keep only answers in this answer_list.json (vqa-answers)")
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
    s.set_defaults(func=_run)

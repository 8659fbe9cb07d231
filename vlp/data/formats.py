"""Annotation formats (ALBEF/Karpathy JSON lists) with validation that names file, entry and key.

Formats (see ``docs/data.md``):

- pretraining: ``[{"image": path, "caption": str | [str, ...]}, ...]``
- retrieval train: one entry per caption ``[{"image": path, "caption": str, "image_id": id}, ...]``
- retrieval val/test: one entry per image ``[{"image": path, "caption": [str, ...]}, ...]``
- relevance (vlp): ``{"format": "vlp-relevance-v1", "texts": [...], "relevant_images": [[int]]}``
- graded relevance (vlp): a ``.npy`` array [N_texts, N_images] of gains >= 0 (rows: the split's
  flattened captions, columns: its images)
- VQA v2 train/val: ``[{"question_id": id, "question": str, "answer": [str x 10], "image": path,
  "dataset": "vqa", "question_type": str (optional, vlp)}, ...]``; VQA test: the same without
  ``"answer"``; VG-QA: ``[{"question": str, "answer": str, "image": path, "dataset": "vg"}, ...]``
- VQA answer list: ``[str, ...]`` (distinct candidate answers)
- VQA predictions (written): ``[{"question_id": id, "answer": str}, ...]``
- NLVR2: ``[{"images": [path, path], "sentence": str, "label": "True" | "False"}, ...]``

Relative image paths are resolved against ``image_root`` (default: the annotation file's folder);
VG-QA images against ``vg_root`` (default: like the VQA images).
"""

from __future__ import annotations

import json
import numbers
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Callable, Optional, Sequence

if TYPE_CHECKING:
    import torch


class DataError(ValueError):
    """Bad input data: the message names the file, the entry and what was expected."""


@dataclass(frozen=True)
class Sample:
    """One training item: an image, its caption(s), and a key identifying the image."""

    image: str  # resolved path
    captions: tuple[str, ...]
    image_key: str  # image_id when given, else the image path
    origin: str  # "file.json entry 12", for error messages


@dataclass
class RetrievalSplit:
    """A Karpathy val/test split: images, flattened texts and the ground-truth maps."""

    images: list[str]  # resolved paths, image index = list position
    texts: list[str]  # captions flattened in annotation order
    txt2img: list[int]  # [N_txt] ground-truth image of each text
    img2txt: list[list[int]]  # [N_img] text indices of each image
    source: str


@dataclass(frozen=True)
class VQAQuestion:
    """One VQA v2 / VG-QA question (``docs/data.md``)."""

    question: str
    image: str  # resolved path
    answers: tuple[str, ...]  # distinct answers (empty for test questions)
    weights: tuple[float, ...]  # one per distinct answer: VQA count / #annotators, VG-QA 0.5
    raw_answers: tuple[str, ...]  # annotator answers as given (10 for VQA v2; empty for test)
    question_id: Optional[int | str]
    question_type: Optional[str]  # optional vlp key (e.g. "color", "count", "yes/no")
    dataset: str  # "vqa" | "vg"
    origin: str  # "file.json entry 12"


@dataclass(frozen=True)
class NLVRItem:
    """One NLVR2 example: a sentence about an ordered pair of images."""

    images: tuple[str, str]  # resolved paths (left, right)
    sentence: str
    label: int  # 1 = "True", 0 = "False"
    origin: str


def read_json(path: str | Path) -> Any:
    """Parse a JSON file; errors name the file (and line/column for syntax errors)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"annotation file not found: {path}")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: line {e.lineno} column {e.colno}: invalid JSON ({e.msg})") from None


def _entries(path: Path, data: Any) -> list[dict]:
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a JSON list of entries, got {type(data).__name__}")
    for i, e in enumerate(data):
        if not isinstance(e, dict):
            raise DataError(f"{path}: entry {i}: expected an object, got {type(e).__name__}")
    return data


def _field(path: Path, i: int, e: dict, key: str, types: tuple[type, ...], what: str) -> Any:
    if key not in e:
        raise DataError(f"{path}: entry {i}: missing key '{key}' (expected {what})")
    v = e[key]
    if not isinstance(v, types) or isinstance(v, bool):
        raise DataError(f"{path}: entry {i}: key '{key}' is {type(v).__name__}, expected {what}")
    return v


def _captions(path: Path, i: int, e: dict, allow_str: bool = True) -> tuple[str, ...]:
    what = "a string or a non-empty list of strings" if allow_str else "a non-empty list of strings"
    v = _field(path, i, e, "caption", (str, list) if allow_str else (list,), what)
    caps = [v] if isinstance(v, str) else v
    if not caps or not all(isinstance(c, str) for c in caps):
        raise DataError(f"{path}: entry {i}: key 'caption' must be {what}")
    return tuple(caps)


def resolve_image(image: str, root: Path) -> str:
    p = Path(image)
    return str(p if p.is_absolute() else root / p)


def load_pairs(paths: Sequence[str | Path], image_root: Optional[str | Path] = None) -> list[Sample]:
    """Load pretraining or retrieval-train files (the format is read per entry) into samples."""
    samples: list[Sample] = []
    for path in map(Path, paths):
        root = Path(image_root) if image_root else path.parent
        for i, e in enumerate(_entries(path, read_json(path))):
            image = _field(path, i, e, "image", (str,), "an image path string")
            caps = _captions(path, i, e)
            key = e.get("image_id", image)
            if not isinstance(key, (str, int)) or isinstance(key, bool):
                raise DataError(f"{path}: entry {i}: key 'image_id' is {type(key).__name__}, expected a string or int")
            samples.append(Sample(resolve_image(image, root), caps, f"{path}:{key}", f"{path} entry {i}"))
    if not samples:
        raise DataError(f"no training entries in {[str(p) for p in paths]}")
    return samples


def load_retrieval_split(path: str | Path, image_root: Optional[str | Path] = None) -> RetrievalSplit:
    """Load a Karpathy-style val/test file (one entry per image with a list of captions)."""
    path = Path(path)
    root = Path(image_root) if image_root else path.parent
    images, texts, txt2img, img2txt = [], [], [], []
    for i, e in enumerate(_entries(path, read_json(path))):
        images.append(resolve_image(_field(path, i, e, "image", (str,), "an image path string"), root))
        caps = _captions(path, i, e, allow_str=False)
        img2txt.append(list(range(len(texts), len(texts) + len(caps))))
        texts.extend(caps)
        txt2img.extend([i] * len(caps))
    if not images:
        raise DataError(f"{path}: no entries")
    return RetrievalSplit(images, texts, txt2img, img2txt, str(path))


def load_relevance(path: str | Path, split: RetrievalSplit) -> list[list[int]]:
    """Read a relevance file and check it against ``split``: one list of image indices per text."""
    path = Path(path)
    data = read_json(path)
    if not isinstance(data, dict) or data.get("format") != "vlp-relevance-v1":
        raise DataError(f"{path}: expected an object with \"format\": \"vlp-relevance-v1\"")
    rel = data.get("relevant_images")
    if not isinstance(rel, list) or len(rel) != len(split.texts):
        n = len(rel) if isinstance(rel, list) else "no"
        raise DataError(f"{path}: key 'relevant_images' has {n} entries, expected {len(split.texts)} (texts in {split.source})")
    texts = data.get("texts")
    if texts is not None and list(texts) != [t for t in split.texts]:
        bad = next(i for i, (a, b) in enumerate(zip(texts, split.texts)) if a != b) if len(texts) == len(split.texts) else -1
        raise DataError(f"{path}: key 'texts' does not match the captions of {split.source} (first difference at text {bad})")
    n = len(split.images)
    for k, r in enumerate(rel):
        if not isinstance(r, list) or not all(isinstance(j, int) and 0 <= j < n for j in r):
            raise DataError(f"{path}: relevant_images[{k}]: expected a list of image indices in [0, {n})")
        if split.txt2img[k] not in r:
            raise DataError(f"{path}: relevant_images[{k}] does not contain the text's own image {split.txt2img[k]}")
    return rel


def load_graded_relevance(path: str | Path, split: RetrievalSplit) -> "torch.Tensor":
    """Read a graded relevance ``.npy`` file and check it against ``split`` -> float32 [N_txt, N_img].

    Row ``t`` is text ``t`` of ``split.texts`` (the Karpathy entries' captions flattened in order),
    column ``i`` is image ``i``; values are gains >= 0 (0 = irrelevant, higher = more relevant).
    Each problem (missing or unreadable file, not numeric, not 2-D, wrong shape, a non-finite or
    negative value) raises one :class:`DataError` naming the file.
    """
    import numpy as np
    import torch

    path = Path(path)
    if not path.is_file():
        raise DataError(f"graded relevance file not found: {path}")
    try:
        arr = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise DataError(f"{path}: cannot read a .npy array ({e})") from None
    if not isinstance(arr, np.ndarray):  # an .npz archive
        arr.close()
        raise DataError(f"{path}: expected a .npy array (numpy.save), got a .npz archive")
    if arr.dtype.kind not in "biuf":
        raise DataError(f"{path}: expected numbers, got dtype {arr.dtype}")
    expected = (len(split.texts), len(split.images))
    if arr.ndim != 2:
        raise DataError(f"{path}: expected a 2-D array [texts, images] of shape {expected}, "
                        f"got a {arr.ndim}-D array of shape {arr.shape}")
    if arr.shape != expected:
        raise DataError(f"{path}: shape {arr.shape} does not match {split.source}: expected {expected} "
                        f"({expected[0]} texts x {expected[1]} images)")
    arr = arr.astype(np.float32)
    for bad, what in ((~np.isfinite(arr), "non-finite"), (arr < 0, "negative")):
        if bad.any():
            r, c = np.argwhere(bad)[0]
            raise DataError(f"{path}: {what} value {arr[r, c]} at row {r} (text), column {c} (image); "
                            "gains must be finite and >= 0")
    return torch.from_numpy(arr)


# --------------------------------------------------------------------------
# VQA and NLVR2
# --------------------------------------------------------------------------

VQA_DATASETS: tuple[str, ...] = ("vqa", "vg")
#: weight of the single answer of a VG-QA question (as in ALBEF)
VG_ANSWER_WEIGHT = 0.5


def _text(path: Path, i: int, e: dict, key: str, what: str) -> str:
    """A string field that is not empty or blank."""
    v = _field(path, i, e, key, (str,), what)
    if not v.strip():
        raise DataError(f"{path}: entry {i}: key '{key}' is an empty string, expected {what}")
    return v


def _question_id(path: Path, i: int, e: dict, required: bool) -> Optional[int | str]:
    if "question_id" not in e and not required:
        return None
    return _field(path, i, e, "question_id", (int, str), "an int or string question id")


def _dataset(path: Path, i: int, e: dict) -> str:
    v = e.get("dataset", "vqa")
    if v not in VQA_DATASETS:
        raise DataError(f"{path}: entry {i}: key 'dataset' is {v!r}, expected \"vqa\" or \"vg\"")
    return v


def _vqa_weights(raw: Sequence[str]) -> tuple[tuple[str, ...], tuple[float, ...]]:
    """Distinct answers in order of first appearance and count / number of answers for each."""
    counts: dict[str, int] = {}
    for a in raw:
        counts[a] = counts.get(a, 0) + 1
    return tuple(counts), tuple(c / len(raw) for c in counts.values())


def _vqa_answers(path: Path, i: int, e: dict, dataset: str) -> tuple[tuple[str, ...], tuple[float, ...], tuple[str, ...]]:
    """(answers, weights, raw answers) of a VQA v2 (list of annotator answers) or VG-QA (one string) entry."""
    if dataset == "vg":
        a = _field(path, i, e, "answer", (str,), "an answer string (VG-QA)")
        return (a,), (VG_ANSWER_WEIGHT,), (a,)
    what = "a non-empty list of annotator answer strings (VQA)"
    raw = _field(path, i, e, "answer", (list,), what)
    if not raw or not all(isinstance(a, str) for a in raw):
        raise DataError(f"{path}: entry {i}: key 'answer' must be {what}")
    answers, weights = _vqa_weights(raw)
    return answers, weights, tuple(raw)


def _vqa_question(path: Path, i: int, e: dict, roots: dict[str, Path], require_answers: bool) -> VQAQuestion:
    dataset = _dataset(path, i, e)
    question = _text(path, i, e, "question", "a non-empty question string")
    image = _field(path, i, e, "image", (str,), "an image path string")
    qid = _question_id(path, i, e, required=dataset == "vqa")
    qtype = e.get("question_type")
    if qtype is not None and not isinstance(qtype, str):
        raise DataError(f"{path}: entry {i}: key 'question_type' is {type(qtype).__name__}, expected a string")
    if "answer" in e or require_answers:
        answers, weights, raw = _vqa_answers(path, i, e, dataset)
    else:
        answers, weights, raw = (), (), ()
    return VQAQuestion(question, resolve_image(image, roots[dataset]), answers, weights, raw, qid, qtype,
                       dataset, f"{path} entry {i}")


def load_vqa(paths: Sequence[str | Path], image_root: Optional[str | Path] = None,
             vg_root: Optional[str | Path] = None, require_answers: bool = True) -> list[VQAQuestion]:
    """Load VQA v2 / VG-QA question files (ALBEF ``vqa_*.json``, ``vg_qa.json``).

    VQA entries need a ``question_id`` and (unless ``require_answers=False``, for test files)
    the annotator answers; their weights are count / number of answers. VG-QA entries have one
    answer of weight 0.5. Images resolve against ``image_root`` (VQA) and ``vg_root`` (VG-QA),
    by default the file's folder.
    """
    questions: list[VQAQuestion] = []
    for path in map(Path, paths):
        vqa_root = Path(image_root) if image_root else path.parent
        roots = {"vqa": vqa_root, "vg": Path(vg_root) if vg_root else vqa_root}
        for i, e in enumerate(_entries(path, read_json(path))):
            questions.append(_vqa_question(path, i, e, roots, require_answers))
    if not questions:
        raise DataError(f"no VQA questions in {[str(p) for p in paths]}")
    return questions


def load_answer_list(path: str | Path) -> list[str]:
    """Load a VQA answer list: a JSON list of distinct non-empty strings."""
    path = Path(path)
    data = read_json(path)
    if not isinstance(data, list) or not data:
        raise DataError(f"{path}: expected a non-empty JSON list of answer strings")
    first: dict[str, int] = {}
    for i, a in enumerate(data):
        if not isinstance(a, str) or not a.strip():
            raise DataError(f"{path}: entry {i}: {a!r} is not an answer (expected a non-empty string)")
        if a in first:
            raise DataError(f"{path}: entry {i}: duplicate answer {a!r} (first at entry {first[a]})")
        first[a] = i
    return data


def _nlvr_label(path: Path, i: int, e: dict) -> int:
    what = '"True", "False", true or false'
    if "label" not in e:
        raise DataError(f"{path}: entry {i}: missing key 'label' (expected {what})")
    v = e["label"]
    if v in ("True", "False") or isinstance(v, bool):
        return int(v in ("True", True))
    raise DataError(f"{path}: entry {i}: key 'label' is {v!r}, expected {what}")


def _nlvr_images(path: Path, i: int, e: dict, root: Path) -> tuple[str, str]:
    what = "a list of exactly 2 image path strings"
    v = _field(path, i, e, "images", (list,), what)
    if len(v) != 2 or not all(isinstance(x, str) for x in v):
        raise DataError(f"{path}: entry {i}: key 'images' must be {what}, got {len(v)} items")
    return resolve_image(v[0], root), resolve_image(v[1], root)


def load_nlvr(path: str | Path, image_root: Optional[str | Path] = None) -> list[NLVRItem]:
    """Load an NLVR2 file (ALBEF ``nlvr_{train,dev,test}.json``); ``identifier`` keys are ignored."""
    path = Path(path)
    root = Path(image_root) if image_root else path.parent
    items = []
    for i, e in enumerate(_entries(path, read_json(path))):
        images = _nlvr_images(path, i, e, root)
        sentence = _text(path, i, e, "sentence", "a non-empty sentence string")
        items.append(NLVRItem(images, sentence, _nlvr_label(path, i, e), f"{path} entry {i}"))
    if not items:
        raise DataError(f"{path}: no entries")
    return items


def _prediction_id(qid: Any, k: int) -> int | str:
    if isinstance(qid, numbers.Integral) and not isinstance(qid, bool):
        return int(qid)
    if isinstance(qid, str):
        return qid
    raise DataError(f"prediction {k}: question id {qid!r} is {type(qid).__name__}, expected an int or string")


def write_vqa_predictions(path: str | Path, question_ids: Sequence[int | str], answers: Sequence[str]) -> Path:
    """Write the official VQA result file ``[{"question_id": id, "answer": str}, ...]`` atomically.

    Refuses (:class:`DataError`) to overwrite an existing file, and inputs of different lengths.
    """
    path = Path(path)
    if path.exists():
        raise DataError(f"{path}: refusing to overwrite an existing predictions file")
    if len(question_ids) != len(answers):
        raise DataError(f"{path}: {len(question_ids)} question ids but {len(answers)} answers")
    results = []
    for k, (qid, a) in enumerate(zip(question_ids, answers)):
        if not isinstance(a, str):
            raise DataError(f"{path}: prediction {k}: answer is {type(a).__name__}, expected a string")
        results.append({"question_id": _prediction_id(qid, k), "answer": a})
    write_json_atomic(path, results)
    return path


def write_atomic(path: Path, write: Callable[[IO], Any], binary: bool = False) -> None:
    """Call ``write(file)`` on a temporary file in ``path``'s folder, then ``os.replace`` it into
    place (mode 0644): a reader never sees a half-written file, a failure leaves nothing behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8"})) as f:
            write(f)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600 files
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json_atomic(path: Path, obj: Any, **dump_kwargs: Any) -> None:
    """Write JSON (plus a newline) atomically; ``dump_kwargs`` go to ``json.dump``."""

    def write(f: IO) -> None:
        json.dump(obj, f, **dump_kwargs)
        f.write("\n")

    write_atomic(path, write)

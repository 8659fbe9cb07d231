"""Downstream annotation formats (``docs/data.md``): VQA v2 / VG-QA questions, the VQA answer list,
the VQA predictions file, NLVR2 and SNLI-VE examples.

- VQA v2 train/val: ``[{"question_id": id, "question": str, "answer": [str x 10], "image": path,
  "dataset": "vqa", "question_type": str (optional, vlp)}, ...]``; VQA test: the same without
  ``"answer"``; VG-QA: ``[{"question": str, "answer": str, "image": path, "dataset": "vg"}, ...]``
- VQA answer list: ``[str, ...]`` (distinct candidate answers)
- VQA predictions (written): ``[{"question_id": id, "answer": str}, ...]``
- NLVR2: ``[{"images": [path, path], "sentence": str, "label": "True" | "False"}, ...]``
- SNLI-VE (ALBEF ``ve_*.json``): ``[{"image": id or path, "sentence": str, "label": "entailment" |
  "neutral" | "contradiction"}, ...]``; an ``image`` without a file suffix is a Flickr30k id and
  gets ALBEF's ``.jpg``

Relative image paths are resolved against ``image_root`` (default: the annotation file's folder);
VG-QA images against ``vg_root`` (default: like the VQA images). The entry parsers
(:func:`parse_vqa_question`, :func:`parse_nlvr_item`, ``_ve_item``) use the shared rules of
:mod:`vlp.data.json_entries`; :func:`vlp.data.formats.entry_problems` runs them for ``vlp data check``.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from vlp.data.json_entries import (
    Issues,
    entry_field,
    entry_image,
    entry_text,
    read_entries,
    read_json,
    resolve_image,
    write_json_atomic,
)
from vlp.errors import DataError, EntryError


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


@dataclass(frozen=True)
class VEItem:
    """One SNLI-VE example: a hypothesis about an image premise."""

    image: str  # resolved path
    sentence: str  # the hypothesis
    label: int  # index into VE_LABELS: 0 contradiction, 1 neutral, 2 entailment
    origin: str


# --------------------------------------------------------------------------
# VQA and NLVR2
# --------------------------------------------------------------------------

#: the ``"dataset"`` tags of ALBEF's VQA files: a VQA v2 question, a Visual Genome QA pair
VQA_V2, VG_QA = "vqa", "vg"
VQA_DATASETS: tuple[str, ...] = (VQA_V2, VG_QA)
#: weight of the single answer of a VG-QA question (as in ALBEF)
VG_ANSWER_WEIGHT = 0.5


def _question_id(path: Path, i: int, e: dict, required: bool) -> Optional[int | str]:
    if "question_id" not in e and not required:
        return None
    return entry_field(path, i, e, "question_id", (int, str), "an int or string question id")


def _question_type(path: Path, i: int, e: dict) -> Optional[str]:
    """The optional vlp key ``question_type`` (a string)."""
    v = e.get("question_type")
    if v is not None and not isinstance(v, str):
        raise EntryError(path, i, "question_type", f"key 'question_type' is {type(v).__name__}, expected a string")
    return v


def _dataset(path: Path, i: int, e: dict) -> str:
    v = e.get("dataset", VQA_V2)
    if v not in VQA_DATASETS:
        raise EntryError(path, i, "dataset", f'key \'dataset\' is {v!r}, expected "{VQA_V2}" or "{VG_QA}"')
    return v


def _vqa_weights(raw: Sequence[str]) -> tuple[tuple[str, ...], tuple[float, ...]]:
    """Distinct answers in order of first appearance and count / number of answers for each."""
    counts: dict[str, int] = {}
    for a in raw:
        counts[a] = counts.get(a, 0) + 1
    return tuple(counts), tuple(c / len(raw) for c in counts.values())


def _vqa_answers(
    path: Path, i: int, e: dict, dataset: str
) -> tuple[tuple[str, ...], tuple[float, ...], tuple[str, ...]]:
    """(answers, weights, raw answers) of a VQA v2 (list of annotator answers) or VG-QA (one string) entry."""
    if dataset == VG_QA:
        a = entry_field(path, i, e, "answer", (str,), "an answer string (VG-QA)")
        return (a,), (VG_ANSWER_WEIGHT,), (a,)
    what = "a non-empty list of annotator answer strings (VQA)"
    raw = entry_field(path, i, e, "answer", (list,), what)
    if not raw or not all(isinstance(a, str) for a in raw):
        raise EntryError(path, i, "answer", f"key 'answer' must be {what}")
    answers, weights = _vqa_weights(raw)
    return answers, weights, tuple(raw)


def parse_vqa_question(
    path: Path, i: int, e: Any, roots: dict[str, Path], require_answers: bool, issues: Issues
) -> Optional[VQAQuestion]:
    """Entry ``i`` (``e``) of the VQA / VG-QA file ``path`` as a :class:`VQAQuestion` (its image resolved
    against ``roots[dataset]``), or None when it has a problem: problems go to ``issues``, so the first
    raises :class:`EntryError` unless ``issues`` collects them."""
    if (entry := issues.entry(path, i, e)) is None:
        return None
    dataset = entry.get(_dataset)
    question = entry.get(entry_text, "question", "a non-empty question string")
    image = entry.get(entry_image)
    qid = entry.get(_question_id, dataset != VG_QA)  # a bad dataset is checked as "vqa"
    qtype = entry.get(_question_type)
    answers, weights, raw = (), (), ()
    if "answer" in entry or require_answers:
        answers, weights, raw = entry.get(_vqa_answers, dataset or VQA_V2) or ((), (), ())
    if not entry.ok:
        return None
    return VQAQuestion(
        question, resolve_image(image, roots[dataset]), answers, weights, raw, qid, qtype, dataset, entry.origin
    )


def load_vqa(
    paths: Sequence[str | Path],
    image_root: Optional[str | Path] = None,
    vg_root: Optional[str | Path] = None,
    require_answers: bool = True,
) -> list[VQAQuestion]:
    """Load VQA v2 / VG-QA question files (ALBEF ``vqa_*.json``, ``vg_qa.json``).

    VQA entries need a ``question_id`` and (unless ``require_answers=False``, for test files)
    the annotator answers; their weights are count / number of answers. VG-QA entries have one
    answer of weight 0.5. Images resolve against ``image_root`` (VQA) and ``vg_root`` (VG-QA),
    by default the file's folder.
    """
    questions: list[VQAQuestion] = []
    for path in map(Path, paths):
        vqa_root = Path(image_root) if image_root else path.parent
        roots = {VQA_V2: vqa_root, VG_QA: Path(vg_root) if vg_root else vqa_root}
        for i, e in enumerate(read_entries(path)):
            questions.append(parse_vqa_question(path, i, e, roots, require_answers, Issues()))
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
        raise EntryError(path, i, "label", f"missing key 'label' (expected {what})")
    v = e["label"]
    if v in ("True", "False") or isinstance(v, bool):
        return int(v in ("True", True))
    raise EntryError(path, i, "label", f"key 'label' is {v!r}, expected {what}")


def _nlvr_images(path: Path, i: int, e: dict, root: Path) -> tuple[str, str]:
    what = "a list of exactly 2 image path strings"
    v = entry_field(path, i, e, "images", (list,), what)
    if len(v) != 2 or not all(isinstance(x, str) for x in v):
        raise EntryError(path, i, "images", f"key 'images' must be {what}, got {len(v)} items")
    return resolve_image(v[0], root), resolve_image(v[1], root)


def parse_nlvr_item(path: Path, i: int, e: Any, root: Path, issues: Issues) -> Optional[NLVRItem]:
    """Entry ``i`` (``e``) of the NLVR2 file ``path`` as an :class:`NLVRItem` (images resolved against
    ``root``), or None when it has a problem: problems go to ``issues``, so the first raises
    :class:`EntryError` unless ``issues`` collects them."""
    if (entry := issues.entry(path, i, e)) is None:
        return None
    images = entry.get(_nlvr_images, root)
    sentence = entry.get(entry_text, "sentence", "a non-empty sentence string")
    label = entry.get(_nlvr_label)
    if not entry.ok:
        return None
    return NLVRItem(images, sentence, label, entry.origin)


def load_nlvr(path: str | Path, image_root: Optional[str | Path] = None) -> list[NLVRItem]:
    """Load an NLVR2 file (ALBEF ``nlvr_{train,dev,test}.json``); ``identifier`` keys are ignored."""
    path = Path(path)
    root = Path(image_root) if image_root else path.parent
    items = [parse_nlvr_item(path, i, e, root, Issues()) for i, e in enumerate(read_entries(path))]
    if not items:
        raise DataError(f"{path}: no entries")
    return items


#: SNLI-VE class index -> label (ALBEF's classes 0 / 1 / 2)
VE_LABELS: tuple[str, ...] = ("contradiction", "neutral", "entailment")
#: what ALBEF's VE dataset appends to an image id (``'%s.jpg' % ann['image']``)
VE_IMAGE_SUFFIX = ".jpg"


def _ve_label(path: Path, i: int, e: dict) -> int:
    what = '"entailment", "neutral" or "contradiction"'
    if "label" not in e:
        raise EntryError(path, i, "label", f"missing key 'label' (expected {what})")
    v = e["label"]
    if v not in VE_LABELS:
        raise EntryError(path, i, "label", f"key 'label' is {v!r}, expected {what}")
    return VE_LABELS.index(v)


def ve_image_path(image: str, root: Path) -> str:
    """An entry's ``image`` resolved against ``root``; a bare Flickr30k id (no file suffix) gets ``.jpg``."""
    return resolve_image(image if Path(image).suffix else image + VE_IMAGE_SUFFIX, root)


def _ve_item(path: Path, i: int, e: Any, root: Path, issues: Issues) -> Optional[VEItem]:
    """Entry ``i`` of an SNLI-VE file, or None when it has a problem (they go to ``issues``)."""
    if (entry := issues.entry(path, i, e)) is None:
        return None
    image = entry.get(entry_image)
    sentence = entry.get(entry_text, "sentence", "a non-empty hypothesis string")
    label = entry.get(_ve_label)
    if not entry.ok or image is None or sentence is None or label is None:
        return None
    return VEItem(ve_image_path(image, root), sentence, label, entry.origin)


def load_ve(path: str | Path, image_root: Optional[str | Path] = None) -> list[VEItem]:
    """Load an SNLI-VE file (ALBEF ``ve_{train,dev,test}.json``); the first bad entry raises
    :class:`EntryError` naming file, entry and key."""
    path = Path(path)
    root = Path(image_root) if image_root else path.parent
    parsed = (_ve_item(path, i, e, root, Issues()) for i, e in enumerate(read_entries(path)))
    items = [it for it in parsed if it is not None]  # never None: the first problem raises
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

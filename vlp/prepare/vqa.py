"""``vlp prepare vqa|vqa-answers``: official VQA v2 questions / annotations -> ``vqa_*.json``
entries, and the most frequent answers -> ``answer_list.json``."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Optional, Sequence

from vlp.data.downstream_formats import VQA_V2
from vlp.data.json_entries import read_json, write_json_atomic
from vlp.errors import DataError
from vlp.prepare.common import check_images_exist, required_key, required_text, top_list

# --------------------------------------------------------------------------
# VQA v2
# --------------------------------------------------------------------------

#: split name (of the official file names) -> COCO image folder
VQA_SPLITS = {
    "train2014": "train2014",
    "val2014": "val2014",
    "test2015": "test2015",
    "test-dev2015": "test2015",
    "train": "train2014",
    "val": "val2014",
    "test": "test2015",
    "test-dev": "test2015",
}


def vqa_image(split_name: str, image_id: int) -> str:
    """``train2014/COCO_train2014_000000458752.jpg`` for split ``train2014`` and image 458752."""
    d = VQA_SPLITS[split_name]
    return f"{d}/COCO_{d}_{int(image_id):012d}.jpg"


def vqa_v2(
    questions_json: str | Path,
    annotations_json: Optional[str | Path],
    split_name: str,
    image_root: Optional[str | Path],
    out: str | Path,
) -> dict[str, int]:
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
    questions = top_list(qpath, read_json(qpath), "questions")
    answers: Optional[dict] = None
    if annotations_json is not None:
        apath = Path(annotations_json)
        answers = {}
        for i, a in enumerate(top_list(apath, read_json(apath), "annotations")):
            where = f"annotations[{i}]"
            qid = required_key(apath, where, a, "question_id", (int, str), "the question id")
            raw = required_key(apath, where, a, "answers", (list,), 'a non-empty list of {"answer": str}')
            if not raw:
                raise DataError(f"{apath}: {where}: key 'answers' is an empty list, expected annotator answers")
            texts = [
                required_key(apath, f"{where}.answers[{k}]", x, "answer", (str,), "an answer string")
                for k, x in enumerate(raw)
            ]
            atype = a.get("answer_type")
            answers[qid] = (texts, atype if isinstance(atype, str) else None)
    entries = []
    for i, q in enumerate(questions):
        where = f"questions[{i}]"
        qid = required_key(qpath, where, q, "question_id", (int, str), "the question id")
        image_id = required_key(qpath, where, q, "image_id", (int,), "the COCO image id (int)")
        e: dict[str, Any] = {
            "question_id": qid,
            "question": required_text(qpath, where, q, "question", "a question string"),
            "image": vqa_image(split_name, image_id),
            "dataset": VQA_V2,
        }
        if answers is not None:
            if qid not in answers:
                raise DataError(f"{annotations_json}: no annotation with question_id {qid!r} ({qpath} {where})")
            e["answer"], atype = answers[qid]
            if atype is not None:
                e["question_type"] = atype
        entries.append(e)
    if not entries:
        raise DataError(f"{qpath}: key 'questions' is an empty list")
    check_images_exist((e["image"] for e in entries), image_root, qpath)
    write_json_atomic(Path(out), entries)
    return {
        "questions": len(entries),
        "images": len({e["image"] for e in entries}),
        "answered": len(entries) if answers is not None else 0,
    }


def answer_list(annotations: Sequence[str | Path], top_k: int, out: str | Path) -> dict[str, int]:
    """The ``top_k`` most frequent answers of official VQA v2 annotation files -> ``answer_list.json``
    (a JSON list of distinct strings, most frequent first, ties by the answer's text).

    Each question counts once, with its ``multiple_choice_answer`` (the official most frequent of its
    10 answers), or, where that key is absent, the most frequent of its ``answers``."""
    if top_k < 1:
        raise DataError(f"top_k must be >= 1, got {top_k}")
    counts: Counter[str] = Counter()
    for apath in map(Path, annotations):
        for i, a in enumerate(top_list(apath, read_json(apath), "annotations")):
            where = f"annotations[{i}]"
            if isinstance(a, dict) and "multiple_choice_answer" in a:
                ans = required_key(apath, where, a, "multiple_choice_answer", (str,), "an answer string")
            else:
                raw = required_key(apath, where, a, "answers", (list,), 'a non-empty list of {"answer": str}')
                texts = [
                    required_key(apath, f"{where}.answers[{k}]", x, "answer", (str,), "an answer string")
                    for k, x in enumerate(raw)
                ]
                if not texts:
                    raise DataError(f"{apath}: {where}: key 'answers' is an empty list, expected annotator answers")
                ans = Counter(texts).most_common(1)[0][0]
            if ans.strip():
                counts[ans.strip()] += 1
    if not counts:
        raise DataError(f"no answers in {[str(p) for p in annotations]}")
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:top_k]
    write_json_atomic(Path(out), [a for a, _ in ranked])
    return {
        "answers": len(ranked),
        "distinct": len(counts),
        "questions": sum(counts.values()),
        "covered": sum(c for _, c in ranked),
    }

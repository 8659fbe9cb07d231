"""``vlp prepare vg|vg-qa``: Visual Genome region descriptions -> pretraining entries, and
question-answer pairs -> VG-QA entries (ALBEF's ``vg_qa.json``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlparse

from vlp.data.answers import normalize_answer
from vlp.data.downstream_formats import VG_QA
from vlp.data.json_entries import read_json, write_json_atomic
from vlp.errors import DataError
from vlp.prepare.common import absolute_path, required_key, required_text, top_list

# --------------------------------------------------------------------------
# Visual Genome
# --------------------------------------------------------------------------

VG_FOLDERS = ("VG_100K", "VG_100K_2")


def _vg_images(ipath: Path) -> dict[Any, str]:
    """VG ``image_data.json`` -> image id -> ``VG_100K[_2]/NAME`` (the folder from the image's URL)."""
    folder: dict[Any, str] = {}
    for i, img in enumerate(top_list(ipath, read_json(ipath), None)):
        where = f"entry {i}"
        iid = required_key(ipath, where, img, "image_id", (int, str), "the VG image id")
        url = required_text(ipath, where, img, "url", "the image URL (.../VG_100K/ID.jpg or .../VG_100K_2/ID.jpg)")
        parts = urlparse(url).path.rstrip("/").split("/")
        if len(parts) < 2 or parts[-2] not in VG_FOLDERS:
            raise DataError(
                f"{ipath}: {where}: key 'url' is {url!r}, expected a URL ending in VG_100K/NAME or VG_100K_2/NAME"
            )
        folder[iid] = f"{parts[-2]}/{parts[-1]}"
    return folder


def visual_genome(
    region_descriptions_json: str | Path, image_data_json: str | Path, image_root: str | Path, out: str | Path
) -> dict[str, int]:
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
    for i, item in enumerate(top_list(rpath, read_json(rpath), None)):
        for k, r in enumerate(required_key(rpath, f"entry {i}", item, "regions", (list,), "a list of regions")):
            where = f"entry {i} regions[{k}]"
            iid = required_key(rpath, where, r, "image_id", (int, str), "the VG image id")
            phrase = required_key(rpath, where, r, "phrase", (str,), "the region description")
            if iid not in folder:
                raise DataError(f"{rpath}: {where}: image_id {iid!r} is not in {ipath}")
            regions += 1
            caps = captions.setdefault(iid, [])
            if not phrase.strip() or phrase.strip() in caps:
                dropped += 1
            else:
                caps.append(phrase.strip())
    entries = [{"image": absolute_path(root, folder[iid]), "caption": caps} for iid, caps in captions.items() if caps]
    if not entries:
        raise DataError(f"{rpath}: no region phrases")
    write_json_atomic(Path(out), entries)
    return {
        "images": len(entries),
        "captions": sum(len(e["caption"]) for e in entries),
        "regions": regions,
        "dropped_phrases": dropped,
    }


def visual_genome_qa(
    question_answers_json: str | Path,
    image_data_json: str | Path,
    image_root: str | Path,
    out: str | Path,
    answer_list_json: Optional[str | Path] = None,
) -> dict[str, int]:
    """VG ``question_answers.json`` + ``image_data.json`` -> VG-QA entries ``{"question", "answer",
    "image": IMAGE_ROOT/VG_100K[_2]/ID.jpg (absolute), "dataset": "vg", "question_id": "vg_<qa_id>"}``
    (ALBEF's ``vg_qa.json``: one answer, weight 0.5 in training).

    Answers are normalised as VQA answers are compared (:func:`vlp.data.answers.normalize_answer`:
    ``"Black."`` -> ``"black"``). With ``answer_list_json`` (the VQA ``answer_list.json``) only
    questions whose answer is in that list are kept, as VQA fine-tuning can only rank those; the
    others are counted (``not_in_answer_list``). Empty questions or answers are counted and left out.
    """
    qpath, ipath = Path(question_answers_json), Path(image_data_json)
    folder = _vg_images(ipath)
    allowed = None
    if answer_list_json is not None:
        apath = Path(answer_list_json)
        allowed = set()
        for i, a in enumerate(top_list(apath, read_json(apath), None)):
            if not isinstance(a, str):
                raise DataError(f"{apath}: entry {i} is {type(a).__name__}, expected an answer string")
            allowed.add(normalize_answer(a))
    root = Path(image_root)
    entries: list[dict[str, Any]] = []
    qas = empty = outside = 0
    for i, item in enumerate(top_list(qpath, read_json(qpath), None)):
        for k, qa in enumerate(
            required_key(qpath, f"entry {i}", item, "qas", (list,), "a list of question-answer objects")
        ):
            where = f"entry {i} qas[{k}]"
            iid = required_key(qpath, where, qa, "image_id", (int, str), "the VG image id")
            question = required_key(qpath, where, qa, "question", (str,), "the question").strip()
            answer = normalize_answer(required_key(qpath, where, qa, "answer", (str,), "the answer"))
            qa_id = required_key(qpath, where, qa, "qa_id", (int, str), "the question-answer id")
            if iid not in folder:
                raise DataError(f"{qpath}: {where}: image_id {iid!r} is not in {ipath}")
            qas += 1
            if not question or not answer:
                empty += 1
            elif allowed is not None and answer not in allowed:
                outside += 1
            else:
                entries.append(
                    {
                        "question": question,
                        "answer": answer,
                        "image": absolute_path(root, folder[iid]),
                        "dataset": VG_QA,
                        "question_id": f"vg_{qa_id}",
                    }
                )
    if not entries:
        raise DataError(f"{qpath}: no question-answer pairs kept (of {qas})")
    write_json_atomic(Path(out), entries)
    counts = {"questions": len(entries), "images": len({e["image"] for e in entries}), "qas": qas, "empty": empty}
    return counts | ({"not_in_answer_list": outside} if allowed is not None else {})

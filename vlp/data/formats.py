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

Validation: each format's entries go through one parser per kind (``_pair``, ``_split_entry``,
``_vqa_question``, ``_nlvr_item``) built from per-key rules that raise :class:`EntryError`. The
parsers report through an :class:`Issues` sink that either raises the first problem (the loaders)
or collects them all (:func:`entry_problems` for ``vlp data check``, ``load_pairs(on_bad="skip")``),
so checking and loading share one set of rules.
"""

from __future__ import annotations

import json
import numbers
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Callable, Optional, Sequence, TypeVar

if TYPE_CHECKING:
    import torch


class DataError(ValueError):
    """Bad input data: the message names the file, the entry and what was expected."""


class BadJSON(DataError):
    """A file that is not valid JSON; ``line`` and ``column`` (1-based) locate the syntax error."""

    def __init__(self, path: str | Path, line: int, column: int, reason: str) -> None:
        super().__init__(f"{path}: line {line} column {column}: invalid JSON ({reason})")
        self.path, self.line, self.column, self.reason = str(path), line, column, reason

    def __reduce__(self) -> tuple:
        return type(self), (self.path, self.line, self.column, self.reason)


class EntryError(DataError):
    """A problem of entry ``entry`` (0-based) of the annotation file ``path`` at ``key`` (None: the
    entry as a whole); ``detail`` says what is wrong and what was expected."""

    def __init__(self, path: str | Path, entry: int, key: Optional[str], detail: str) -> None:
        super().__init__(f"{path}: entry {entry}: {detail}")
        self.path, self.entry, self.key, self.detail = str(path), entry, key, detail

    def __reduce__(self) -> tuple:
        return type(self), (self.path, self.entry, self.key, self.detail)


T = TypeVar("T")


class Issues:
    """Where the entry parsers below put the problems they find: raised at once (the loaders'
    default: the first problem stops the file) or, with ``collect=True``, recorded in ``found``
    while parsing goes on (``vlp data check``, ``load_pairs(on_bad="skip")``). One set of rules,
    two ways of reporting."""

    def __init__(self, collect: bool = False) -> None:
        self.collect = collect
        self.found: list[EntryError] = []

    def add(self, err: EntryError) -> None:
        """Raise ``err``, or record it when collecting."""
        if not self.collect:
            raise err
        self.found.append(err)

    def get(self, rule: Callable[..., T], *args: Any) -> Optional[T]:
        """``rule(*args)``; when collecting, the :class:`EntryError` it raises is recorded and None returned."""
        try:
            return rule(*args)
        except EntryError as err:
            if not self.collect:
                raise
            self.found.append(err)
            return None


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
    """Parse a JSON file; errors name the file (:class:`BadJSON`, with line and column, for syntax errors)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"annotation file not found: {path}")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise BadJSON(path, e.lineno, e.colno, e.msg) from None
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: invalid JSON (not UTF-8 text: byte {e.start}: {e.reason})") from None
    except RecursionError:
        raise DataError(f"{path}: invalid JSON (nested too deeply to parse)") from None
    except ValueError as e:  # e.g. an integer of more than 4300 digits
        raise DataError(f"{path}: invalid JSON ({e})") from None


def entry_list(path: Path, data: Any) -> list:
    """The entries of an annotation file: its top level must be a JSON list."""
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a JSON list of entries, got {type(data).__name__}")
    return data


def _object(path: Path, i: int, e: Any) -> dict:
    """Entry ``i`` itself, which must be a JSON object."""
    if not isinstance(e, dict):
        raise EntryError(path, i, None, f"expected an object, got {type(e).__name__}")
    return e


def _field(path: Path, i: int, e: dict, key: str, types: tuple[type, ...], what: str) -> Any:
    """``e[key]``, which must exist and be one of ``types`` (never a bool); ``what`` names the expectation."""
    if key not in e:
        raise EntryError(path, i, key, f"missing key '{key}' (expected {what})")
    v = e[key]
    if not isinstance(v, types) or isinstance(v, bool):
        raise EntryError(path, i, key, f"key '{key}' is {type(v).__name__}, expected {what}")
    return v


def _text(path: Path, i: int, e: dict, key: str, what: str) -> str:
    """A string field that is not empty or blank."""
    v = _field(path, i, e, key, (str,), what)
    if not v.strip():
        raise EntryError(path, i, key, f"key '{key}' is an empty string, expected {what}")
    return v


def _image(path: Path, i: int, e: dict) -> str:
    """The entry's ``image`` path as written (not empty)."""
    return _text(path, i, e, "image", "an image path string")


def _captions(path: Path, i: int, e: dict, issues: Issues, allow_str: bool = True) -> Optional[tuple[str, ...]]:
    """The entry's good captions: ``caption`` is a string or (only, with ``allow_str=False``) a
    non-empty list of strings. Each bad caption (not a string, empty or whitespace-only) goes to
    ``issues`` and is left out; None when the key is bad or no caption is left."""
    what = "a string or a non-empty list of strings" if allow_str else "a non-empty list of strings"
    v = issues.get(_field, path, i, e, "caption", (str, list) if allow_str else (list,), what)
    if v is None:
        return None
    if isinstance(v, list) and not v:
        issues.add(EntryError(path, i, "caption", f"key 'caption' must be {what}, got an empty list"))
        return None
    good = []
    for k, c in ([(None, v)] if isinstance(v, str) else enumerate(v)):
        where = "key 'caption'" if k is None else f"key 'caption' item {k}"
        if not isinstance(c, str):
            issues.add(EntryError(path, i, "caption", f"{where} is {type(c).__name__}, expected a caption string"))
        elif not c.strip():
            blank = "an empty string" if not c else f"empty (whitespace only: {c!r})"
            issues.add(EntryError(path, i, "caption", f"{where} is {blank}, expected a caption with words"))
        else:
            good.append(c)
    return tuple(good) or None


def _image_key(path: Path, i: int, e: dict, image: Optional[str]) -> Optional[str | int]:
    """The entry's ``image_id`` (a string or int) when given, else its image path."""
    if "image_id" not in e:
        return image
    return _field(path, i, e, "image_id", (str, int), "a string or int")


def resolve_image(image: str, root: Path) -> str:
    p = Path(image)
    return str(p if p.is_absolute() else root / p)


def _pair(path: Path, i: int, e: Any, root: Path, issues: Issues) -> Optional[Sample]:
    """Entry ``i`` of a pretraining / retrieval-train file as a :class:`Sample` holding its good
    captions, or None when a key is bad or no caption is good (the problems go to ``issues``)."""
    e = issues.get(_object, path, i, e)
    if e is None:
        return None
    image = issues.get(_image, path, i, e)
    captions = _captions(path, i, e, issues)
    key = issues.get(_image_key, path, i, e, image)
    if image is None or captions is None or key is None:
        return None
    return Sample(resolve_image(image, root), captions, f"{path}:{key}", f"{path} entry {i}")


#: ``load_pairs(on_bad=...)``: raise at the first bad entry, or leave bad entries and captions out
ON_BAD = ("raise", "skip")


def plural(n: int, one: str, many: str = "") -> str:
    """``"1 entry"``, ``"2 entries"``: ``n`` and the noun, plural ``many`` (default ``one + "s"``)."""
    return f"{n} {one if n == 1 else many or one + 's'}"


@dataclass(frozen=True)
class Dropped:
    """What ``on_bad="skip"`` left out: whole ``entries``, single ``captions`` of entries that were
    kept, and every problem found (in file order). All zero with ``on_bad="raise"``."""

    entries: int = 0
    captions: int = 0
    problems: tuple[EntryError, ...] = ()

    def message(self, shown: int = 3) -> str:
        """One line: the counts and the first ``shown`` problems."""
        more = len(self.problems) - shown
        return (f"on_bad=skip left out {plural(self.entries, 'entry', 'entries')} and "
                f"{plural(self.captions, 'caption')} of kept entries with bad annotations: "
                + "; ".join(str(p) for p in self.problems[:shown])
                + (f"; and {more} more (`vlp data check` lists them all)" if more > 0 else ""))


def load_pairs_checked(paths: Sequence[str | Path], image_root: Optional[str | Path] = None,
                       on_bad: str = "raise") -> tuple[list[Sample], Dropped]:
    """:func:`load_pairs`, also returning what ``on_bad="skip"`` left out (see there)."""
    if on_bad not in ON_BAD:
        raise ValueError(f"on_bad must be one of {list(ON_BAD)}, got {on_bad!r}")
    issues = Issues(collect=on_bad == "skip")
    samples: list[Sample] = []
    entries = captions = 0
    for path in map(Path, paths):
        root = Path(image_root) if image_root else path.parent
        for i, e in enumerate(entry_list(path, read_json(path))):
            before = len(issues.found)
            sample = _pair(path, i, e, root, issues)
            if sample is None:
                entries += 1
            else:
                samples.append(sample)
                captions += len(issues.found) - before
    dropped = Dropped(entries, captions, tuple(issues.found))
    if dropped.problems:
        print(f"vlp: warning: {dropped.message()}", file=sys.stderr)
    if not samples:
        left_out = f" ({plural(entries, 'bad entry', 'bad entries')} left out)" if entries else ""
        raise DataError(f"no training entries in {[str(p) for p in paths]}{left_out}")
    return samples, dropped


def load_pairs(paths: Sequence[str | Path], image_root: Optional[str | Path] = None,
               on_bad: str = "raise") -> list[Sample]:
    """Load pretraining or retrieval-train files (the format is read per entry) into samples.

    ``on_bad="raise"``: the first bad entry raises a :class:`DataError` naming file, entry and key
    (a missing key, a wrong type, an empty or whitespace-only caption). ``on_bad="skip"``: bad
    entries are left out, a caption list keeps its good captions (an entry with none left is left
    out), and one warning line on stderr gives the counts and the first problems;
    :func:`load_pairs_checked` also returns them. A file that is not a JSON list raises either way.
    """
    return load_pairs_checked(paths, image_root, on_bad)[0]


def _split_entry(path: Path, i: int, e: Any, issues: Issues) -> Optional[tuple[str, tuple[str, ...]]]:
    """Entry ``i`` of a Karpathy val/test file: (image path as written, its captions), or None."""
    e = issues.get(_object, path, i, e)
    if e is None:
        return None
    image = issues.get(_image, path, i, e)
    captions = _captions(path, i, e, issues, allow_str=False)
    return None if image is None or captions is None else (image, captions)


def load_retrieval_split(path: str | Path, image_root: Optional[str | Path] = None) -> RetrievalSplit:
    """Load a Karpathy-style val/test file (one entry per image with a list of captions)."""
    path = Path(path)
    root = Path(image_root) if image_root else path.parent
    images, texts, txt2img, img2txt = [], [], [], []
    for i, e in enumerate(entry_list(path, read_json(path))):
        image, caps = _split_entry(path, i, e, Issues())
        images.append(resolve_image(image, root))
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


def _question_id(path: Path, i: int, e: dict, required: bool) -> Optional[int | str]:
    if "question_id" not in e and not required:
        return None
    return _field(path, i, e, "question_id", (int, str), "an int or string question id")


def _question_type(path: Path, i: int, e: dict) -> Optional[str]:
    """The optional vlp key ``question_type`` (a string)."""
    v = e.get("question_type")
    if v is not None and not isinstance(v, str):
        raise EntryError(path, i, "question_type", f"key 'question_type' is {type(v).__name__}, expected a string")
    return v


def _dataset(path: Path, i: int, e: dict) -> str:
    v = e.get("dataset", "vqa")
    if v not in VQA_DATASETS:
        raise EntryError(path, i, "dataset", f"key 'dataset' is {v!r}, expected \"vqa\" or \"vg\"")
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
        raise EntryError(path, i, "answer", f"key 'answer' must be {what}")
    answers, weights = _vqa_weights(raw)
    return answers, weights, tuple(raw)


def _vqa_question(path: Path, i: int, e: Any, roots: dict[str, Path], require_answers: bool,
                  issues: Issues) -> Optional[VQAQuestion]:
    """Entry ``i`` of a VQA / VG-QA file, or None when it has a problem (they go to ``issues``)."""
    e = issues.get(_object, path, i, e)
    if e is None:
        return None
    n = len(issues.found)
    dataset = issues.get(_dataset, path, i, e)
    question = issues.get(_text, path, i, e, "question", "a non-empty question string")
    image = issues.get(_image, path, i, e)
    qid = issues.get(_question_id, path, i, e, dataset != "vg")  # a bad dataset is checked as "vqa"
    qtype = issues.get(_question_type, path, i, e)
    answers, weights, raw = (), (), ()
    if "answer" in e or require_answers:
        answers, weights, raw = issues.get(_vqa_answers, path, i, e, dataset or "vqa") or ((), (), ())
    if len(issues.found) > n:
        return None
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
        for i, e in enumerate(entry_list(path, read_json(path))):
            questions.append(_vqa_question(path, i, e, roots, require_answers, Issues()))
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
    v = _field(path, i, e, "images", (list,), what)
    if len(v) != 2 or not all(isinstance(x, str) for x in v):
        raise EntryError(path, i, "images", f"key 'images' must be {what}, got {len(v)} items")
    return resolve_image(v[0], root), resolve_image(v[1], root)


def _nlvr_item(path: Path, i: int, e: Any, root: Path, issues: Issues) -> Optional[NLVRItem]:
    """Entry ``i`` of an NLVR2 file, or None when it has a problem (they go to ``issues``)."""
    e = issues.get(_object, path, i, e)
    if e is None:
        return None
    n = len(issues.found)
    images = issues.get(_nlvr_images, path, i, e, root)
    sentence = issues.get(_text, path, i, e, "sentence", "a non-empty sentence string")
    label = issues.get(_nlvr_label, path, i, e)
    if len(issues.found) > n:
        return None
    return NLVRItem(images, sentence, label, f"{path} entry {i}")


def load_nlvr(path: str | Path, image_root: Optional[str | Path] = None) -> list[NLVRItem]:
    """Load an NLVR2 file (ALBEF ``nlvr_{train,dev,test}.json``); ``identifier`` keys are ignored."""
    path = Path(path)
    root = Path(image_root) if image_root else path.parent
    items = [_nlvr_item(path, i, e, root, Issues()) for i, e in enumerate(entry_list(path, read_json(path)))]
    if not items:
        raise DataError(f"{path}: no entries")
    return items


#: annotation kinds whose entries :func:`entry_problems` checks (``vlp data check --kind``)
KINDS: tuple[str, ...] = ("pairs", "retrieval", "vqa", "nlvr")

_ENTRY_PARSERS: dict[str, Callable[[Path, int, Any, Issues], Any]] = {
    "pairs": lambda path, i, e, issues: _pair(path, i, e, path.parent, issues),
    "retrieval": _split_entry,
    "vqa": lambda path, i, e, issues: _vqa_question(path, i, e, {"vqa": path.parent, "vg": path.parent}, False, issues),
    "nlvr": lambda path, i, e, issues: _nlvr_item(path, i, e, path.parent, issues),
}


def entry_problems(kind: str, path: str | Path, i: int, entry: Any) -> list[EntryError]:
    """Every problem of entry ``i`` of a ``kind`` file, by the rules of its loader: ``pairs``
    :func:`load_pairs`, ``retrieval`` :func:`load_retrieval_split`, ``vqa`` :func:`load_vqa` (answers
    checked where present, as for test files), ``nlvr`` :func:`load_nlvr`. Images are not opened."""
    if kind not in _ENTRY_PARSERS:
        raise ValueError(f"kind must be one of {list(KINDS)}, got {kind!r}")
    issues = Issues(collect=True)
    _ENTRY_PARSERS[kind](Path(path), i, entry, issues)
    return issues.found


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

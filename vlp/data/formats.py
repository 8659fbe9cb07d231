"""Annotation formats (ALBEF/Karpathy JSON lists) with validation that names file, entry and key.

Formats (see ``docs/data.md``):

- pretraining: ``[{"image": path, "caption": str | [str, ...]}, ...]``
- retrieval train: one entry per caption ``[{"image": path, "caption": str, "image_id": id}, ...]``
- retrieval val/test: one entry per image ``[{"image": path, "caption": [str, ...]}, ...]``
- relevance (vlp): ``{"format": "vlp-relevance-v1", "texts": [...], "relevant_images": [[int]]}``;
  v2 adds ``"relevant_texts": [[int]]`` and lists left empty for non-queries (:mod:`vlp.data.relevance`)
- graded relevance (vlp): a ``.npy`` array [N_texts, N_images] of gains >= 0 (rows: the split's
  flattened captions, columns: its images)
- VQA v2 / VG-QA questions, the VQA answer list and predictions, NLVR2: see
  :mod:`vlp.data.downstream_formats` (their loaders are importable from here too)

Relative image paths are resolved against ``image_root`` (default: the annotation file's folder).

Validation: each format's entries go through one parser per kind (``_pair``, ``_split_entry``,
:func:`parse_vqa_question`, :func:`parse_nlvr_item`) built from per-key rules that raise
:class:`EntryError` (:mod:`vlp.data.json_entries`). The parsers report through an :class:`Issues`
sink that either raises the first problem (the loaders) or collects them all (:func:`entry_problems`
for ``vlp data check``, ``load_pairs(on_bad="skip")``), so checking and loading share one set of rules.
"""

from __future__ import annotations

import logging
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

# The VQA / NLVR2 formats and the shared JSON rules live in their own modules; their public names
# stay importable from here.
from vlp.data.downstream_formats import (
    VG_ANSWER_WEIGHT,
    VG_QA,
    VQA_DATASETS,
    VQA_V2,
    NLVRItem,
    VQAQuestion,
    load_answer_list,
    load_nlvr,
    load_vqa,
    parse_nlvr_item,
    parse_vqa_question,
    write_vqa_predictions,
)
from vlp.data.json_entries import (
    Entry,
    Issues,
    entry_field,
    entry_image,
    entry_list,
    plural,
    read_entries,
    read_json,
    resolve_image,
    write_atomic,
    write_json_atomic,
)
from vlp.data.relevance import RELEVANCE_FORMAT, load_relevance
from vlp.data.sample_table import Sample, SampleTable, TableBuilder
from vlp.errors import BadJSON, DataError, EntryError

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    import torch

__all__ = [
    "CAPTION_GROUPS_FORMAT",
    "KINDS",
    "RELEVANCE_FORMAT",
    "ON_BAD",
    "VG_ANSWER_WEIGHT",
    "VQA_DATASETS",
    "BadJSON",
    "DataError",
    "Dropped",
    "EntryError",
    "Issues",
    "NLVRItem",
    "RetrievalSplit",
    "Sample",
    "SampleTable",
    "VQAQuestion",
    "entry_list",
    "entry_problems",
    "load_answer_list",
    "load_graded_relevance",
    "load_nlvr",
    "MAX_CAPTION_CHARS",
    "caption_problem",
    "no_words_problem",
    "load_pairs",
    "load_pairs_checked",
    "load_relevance",
    "load_retrieval_split",
    "load_vqa",
    "plural",
    "read_json",
    "resolve_image",
    "write_atomic",
    "write_json_atomic",
    "write_vqa_predictions",
]

#: caption groups (``vlp evaluate retrieval --caption-groups``; a shapes world's ``caption_kinds_<split>.json``):
#: a label per caption of a retrieval split and named unions of labels
CAPTION_GROUPS_FORMAT = "vlp-caption-groups-v1"


@dataclass
class RetrievalSplit:
    """A Karpathy val/test split: images, flattened texts and the ground-truth maps."""

    images: list[str]  # resolved paths, image index = list position
    texts: list[str]  # captions flattened in annotation order
    txt2img: list[int]  # [N_txt] ground-truth image of each text
    img2txt: list[list[int]]  # [N_img] text indices of each image
    source: str


#: a caption longer than this (in characters) is refused: a page or a dump, not a caption
MAX_CAPTION_CHARS = 10_000


def caption_problem(c: str) -> Optional[str]:
    """Why caption ``c`` cannot be trained on (completing "is ..."), or None: empty or whitespace
    only, not encodable as UTF-8 (a lone surrogate, which JSON's ``\\ud800`` escapes can carry and
    the tokenizer refuses), or longer than :data:`MAX_CAPTION_CHARS`."""
    if not c.strip():
        return ("an empty string" if not c else f"empty (whitespace only: {c!r})") + ", expected a caption with words"
    try:
        c.encode("utf-8")
    except UnicodeEncodeError as err:
        return f"not text the tokenizer can encode: a lone surrogate {c[err.start]!r} at character {err.start}"
    if len(c) > MAX_CAPTION_CHARS:
        return f"{len(c)} characters long, longer than {MAX_CAPTION_CHARS} characters"
    return None


def _is_word_char(ch: str) -> bool:
    """Whether the tokenizer keeps ``ch`` as (part of) a word: BERT's normaliser drops whitespace,
    control and format characters (Unicode categories Cc, Cf: NUL, zero-width space) and U+FFFD."""
    return not ch.isspace() and ch != "\ufffd" and unicodedata.category(ch) not in ("Cc", "Cf")


#: printable ASCII that :func:`vlp.preprocess.transforms.pre_caption` keeps as a word character:
#: all but the space, the characters it deletes and ``-`` / ``/`` (made spaces); ``<person>`` keeps
#: letters. An ASCII printable text has words after cleaning iff it holds one of these.
_ASCII_WORD = re.compile(r"[^ ,.'!?\"()*#:;~/-]")
_NO_WORDS = "has no words left after ALBEF cleaning ({name}), expected a text with words"


def no_words_problem(text: str, clean: Optional[Callable[[str], str]] = None) -> Optional[str]:
    """Why ``text`` would train as an empty text (``[CLS][SEP]``), completing "the text ...", or None:
    ALBEF's cleaning ``clean`` (default :func:`vlp.preprocess.transforms.pre_caption`) leaves no
    character the tokenizer keeps (:func:`_is_word_char`): ``"..."``, ``"?!"``, NUL bytes. The one
    rule of ``vlp data check`` (JSON files) and of the shard reader (checks and training)."""
    if clean is None and text.isascii() and text.isprintable():  # the fast path of ordinary captions
        return None if _ASCII_WORD.search(text) else _NO_WORDS.format(name="pre_caption")
    if clean is None:
        from vlp.preprocess.transforms import pre_caption

        clean = pre_caption
    if any(map(_is_word_char, clean(text))):
        return None
    return _NO_WORDS.format(name=clean.__name__)


def _captions(entry: Entry, allow_str: bool = True) -> Optional[tuple[str, ...]]:
    """The entry's good captions: ``caption`` is a string or (only, with ``allow_str=False``) a
    non-empty list of strings. Each bad caption (not a string, empty or whitespace-only) goes to
    the entry's issues and is left out; None when the key is bad or no caption is left."""
    path, i, issues = entry.path, entry.i, entry.issues
    what = "a string or a non-empty list of strings" if allow_str else "a non-empty list of strings"
    v = entry.get(entry_field, "caption", (str, list) if allow_str else (list,), what)
    if v is None:
        return None
    if isinstance(v, list) and not v:
        issues.add(EntryError(path, i, "caption", f"key 'caption' must be {what}, got an empty list"))
        return None
    good = []
    for k, c in [(None, v)] if isinstance(v, str) else enumerate(v):
        where = "key 'caption'" if k is None else f"key 'caption' item {k}"
        problem = caption_problem(c) if isinstance(c, str) else None
        if not isinstance(c, str):
            issues.add(EntryError(path, i, "caption", f"{where} is {type(c).__name__}, expected a caption string"))
        elif problem is not None:
            issues.add(EntryError(path, i, "caption", f"{where} is {problem}"))
        elif (empty := no_words_problem(c)) is not None:
            issues.add(EntryError(path, i, "caption", f"{where} {c!r} {empty}"))
        else:
            good.append(c)
    return tuple(good) or None


def _image_key(path: Path, i: int, e: dict, image: Optional[str]) -> Optional[str | int]:
    """The entry's ``image_id`` (a string or int) when given, else its image path."""
    if "image_id" not in e:
        return image
    return entry_field(path, i, e, "image_id", (str, int), "a string or int")


def _pair(path: Path, i: int, e: Any, root: Path, issues: Issues) -> Optional[tuple[str, tuple[str, ...], str]]:
    """Entry ``i`` of a pretraining / retrieval-train file: (resolved image path, its good captions,
    its key: ``image_id`` or the image as written), or None when a key is bad or no caption is
    good (the problems go to ``issues``). The sample's ``image_key`` is ``f"{path}:{key}"``."""
    if (entry := issues.entry(path, i, e)) is None:
        return None
    image = entry.get(entry_image)
    captions = _captions(entry)
    key = entry.get(_image_key, image)
    if image is None or captions is None or key is None:
        return None
    return resolve_image(image, root), captions, str(key)


#: ``load_pairs(on_bad=...)``: raise at the first bad entry, or leave bad entries and captions out
ON_BAD = ("raise", "skip")


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
        return (
            f"on_bad=skip left out {plural(self.entries, 'entry', 'entries')} and "
            f"{plural(self.captions, 'caption')} of kept entries with bad annotations: "
            + "; ".join(str(p) for p in self.problems[:shown])
            + (f"; and {more} more (`vlp data check` lists them all)" if more > 0 else "")
        )


def load_pairs_checked(
    paths: Sequence[str | Path], image_root: Optional[str | Path] = None, on_bad: str = "raise"
) -> tuple[SampleTable, Dropped]:
    """:func:`load_pairs`, also returning what ``on_bad="skip"`` left out (see there)."""
    if on_bad not in ON_BAD:
        raise ValueError(f"on_bad must be one of {list(ON_BAD)}, got {on_bad!r}")
    issues = Issues(collect=on_bad == "skip")
    table = TableBuilder()
    entries = captions = 0
    for path in map(Path, paths):
        root = Path(image_root) if image_root else path.parent
        source = table.source(f"{path}:", f"{path} entry ")
        data = read_entries(path)
        for i in range(len(data)):
            e, data[i] = data[i], None  # the parsed entry is freed once it is in the table
            before = len(issues.found)
            pair = _pair(path, i, e, root, issues)
            if pair is None:
                entries += 1
            else:
                table.add(source, *pair, str(i))
                captions += len(issues.found) - before
        del data
    dropped = Dropped(entries, captions, tuple(issues.found))
    if dropped.problems:
        logger.warning(f"vlp: warning: {dropped.message()}")
    if not len(table):
        left_out = f" ({plural(entries, 'bad entry', 'bad entries')} left out)" if entries else ""
        raise DataError(f"no training entries in {[str(p) for p in paths]}{left_out}")
    return table.build(), dropped


def load_pairs(
    paths: Sequence[str | Path], image_root: Optional[str | Path] = None, on_bad: str = "raise"
) -> SampleTable:
    """Load pretraining or retrieval-train files (the format is read per entry) into samples: a
    :class:`SampleTable` (a ``Sequence[Sample]`` packed in numpy arrays, which forked loader
    workers share without copying).

    ``on_bad="raise"``: the first bad entry raises a :class:`DataError` naming file, entry and key
    (a missing key, a wrong type, an empty or whitespace-only caption). ``on_bad="skip"``: bad
    entries are left out, a caption list keeps its good captions (an entry with none left is left
    out), and one warning line on stderr gives the counts and the first problems;
    :func:`load_pairs_checked` also returns them. A file that is not a JSON list raises either way.
    """
    return load_pairs_checked(paths, image_root, on_bad)[0]


def _split_entry(path: Path, i: int, e: Any, issues: Issues) -> Optional[tuple[str, tuple[str, ...]]]:
    """Entry ``i`` of a Karpathy val/test file: (image path as written, its captions), or None."""
    if (entry := issues.entry(path, i, e)) is None:
        return None
    image = entry.get(entry_image)
    captions = _captions(entry, allow_str=False)
    return None if image is None or captions is None else (image, captions)


def load_retrieval_split(path: str | Path, image_root: Optional[str | Path] = None) -> RetrievalSplit:
    """Load a Karpathy-style val/test file (one entry per image with a list of captions)."""
    path = Path(path)
    root = Path(image_root) if image_root else path.parent
    images, texts, txt2img, img2txt = [], [], [], []
    for i, e in enumerate(read_entries(path)):
        image, caps = _split_entry(path, i, e, Issues())
        images.append(resolve_image(image, root))
        img2txt.append(list(range(len(texts), len(texts) + len(caps))))
        texts.extend(caps)
        txt2img.extend([i] * len(caps))
    if not images:
        raise DataError(f"{path}: no entries")
    return RetrievalSplit(images, texts, txt2img, img2txt, str(path))


def load_graded_relevance(path: str | Path, split: RetrievalSplit) -> torch.Tensor:
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
        raise DataError(
            f"{path}: expected a 2-D array [texts, images] of shape {expected}, "
            f"got a {arr.ndim}-D array of shape {arr.shape}"
        )
    if arr.shape != expected:
        raise DataError(
            f"{path}: shape {arr.shape} does not match {split.source}: expected {expected} "
            f"({expected[0]} texts x {expected[1]} images)"
        )
    arr = arr.astype(np.float32)
    for bad, what in ((~np.isfinite(arr), "non-finite"), (arr < 0, "negative")):
        if bad.any():
            r, c = np.argwhere(bad)[0]
            raise DataError(
                f"{path}: {what} value {arr[r, c]} at row {r} (text), column {c} (image); gains must be finite and >= 0"
            )
    return torch.from_numpy(arr)


#: the annotation-file kinds (``vlp data check --kind``): image-caption pairs, a Karpathy-style
#: retrieval split, VQA questions, NLVR2 statements
PAIRS, RETRIEVAL_SPLIT, VQA_QUESTIONS, NLVR_STATEMENTS = "pairs", "retrieval", "vqa", "nlvr"
#: annotation kinds whose entries :func:`entry_problems` checks, in ``--kind``'s order
KINDS: tuple[str, ...] = (PAIRS, RETRIEVAL_SPLIT, VQA_QUESTIONS, NLVR_STATEMENTS)

_ENTRY_PARSERS: dict[str, Callable[[Path, int, Any, Issues], Any]] = {
    PAIRS: lambda path, i, e, issues: _pair(path, i, e, path.parent, issues),
    RETRIEVAL_SPLIT: _split_entry,
    VQA_QUESTIONS: lambda path, i, e, issues: parse_vqa_question(
        path, i, e, {VQA_V2: path.parent, VG_QA: path.parent}, False, issues
    ),
    NLVR_STATEMENTS: lambda path, i, e, issues: parse_nlvr_item(path, i, e, path.parent, issues),
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

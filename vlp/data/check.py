"""``vlp data check``: validate annotation files (and their images) up front, reporting every problem.

The entry rules are the loaders' own (:func:`vlp.data.formats.entry_problems` runs the parsers of
:mod:`vlp.data.formats` collecting problems instead of raising the first), and images are opened
with :func:`vlp.preprocess.images.open_image`, as training opens them, so a file that passes here loads.
On top of the loaders' rules this flags texts that ALBEF's cleaning empties (``"..."``), and
images whose shorter side is below :data:`vlp.preprocess.images.MIN_SIDE` (a warning: training
upscales them). Each distinct image file is opened once, however many entries use it.
"""

from __future__ import annotations

import os
import random
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Sequence, TypeVar

from vlp.data.formats import (
    KINDS,
    NLVR_STATEMENTS,
    PAIRS,
    RETRIEVAL_SPLIT,
    VQA_QUESTIONS,
    entry_problems,
    no_words_problem,
)
from vlp.data.json_entries import plural, read_entries, resolve_image
from vlp.errors import BadImage, BadJSON, DataError
from vlp.preprocess.images import MAX_PIXELS, MIN_SIDE, open_image

if TYPE_CHECKING:
    from vlp.data.shard_format import ShardInfo

#: ``--kind`` values: ``auto`` (:func:`detect_kind`) or one of the annotation kinds
CHECK_KINDS: tuple[str, ...] = ("auto", *KINDS)
#: the key holding each kind's image path(s)
IMAGE_KEY = {PAIRS: "image", RETRIEVAL_SPLIT: "image", VQA_QUESTIONS: "image", NLVR_STATEMENTS: "images"}
#: images opened per batch handed to the worker threads
_CHUNK = 256

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class Problem:
    """One problem: in ``file`` at ``entry`` (None: the file as a whole) and ``key``."""

    file: str
    entry: Optional[int]
    key: Optional[str]
    message: str  # what is wrong and what was expected
    severity: str = "error"  # or "warning"
    count: int = 1  # entries it concerns (an image used by several entries)
    line: Optional[int] = None  # invalid JSON: where
    column: Optional[int] = None

    def __str__(self) -> str:
        where = self.file if self.entry is None else f"{self.file} entry {self.entry}"
        return f"{where}: {'warning: ' if self.severity == 'warning' else ''}{self.message}"


@dataclass(frozen=True)
class FileSummary:
    """One checked file: its kind (None when it could not be read), whether the kind was detected, its entries."""

    file: str
    kind: Optional[str]
    detected: bool
    entries: int

    def __str__(self) -> str:
        if self.kind is None:
            return f"{self.file}: not checked further"
        return f"{self.file}: {plural(self.entries, 'entry', 'entries')} ({self.kind}{', detected' if self.detected else ''})"


@dataclass
class CheckReport:
    """Everything :func:`check_annotations` found."""

    files: list[FileSummary] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    images_checked: Optional[int] = None  # distinct image files opened; None: images not checked
    sampled: Optional[tuple[int, int, int]] = None  # shards checked, of how many, drawn with which seed

    @property
    def entries(self) -> int:
        """Entries in all the checked files together."""
        return sum(f.entries for f in self.files)

    @property
    def errors(self) -> int:
        """How many problems are errors."""
        return sum(p.severity == "error" for p in self.problems)

    @property
    def warnings(self) -> int:
        """How many problems are warnings."""
        return sum(p.severity == "warning" for p in self.problems)

    @property
    def ok(self) -> bool:
        """No errors (warnings allowed)."""
        return self.errors == 0

    def summary(self) -> str:
        """The report's last line: files, entries and images checked, errors and warnings (and :meth:`sampled_note`)."""
        images = "images not checked" if self.images_checked is None else plural(self.images_checked, "image")
        return (
            f"checked {plural(len(self.files), 'file')}, {plural(self.entries, 'entry', 'entries')}, {images}: "
            f"{plural(self.errors, 'error')}, {plural(self.warnings, 'warning')}"
        ) + self.sampled_note()

    def sampled_note(self) -> str:
        """The summary's note of a ``--sample`` check: how many shards of how many, and the seed."""
        if self.sampled is None:
            return ""
        n, total, seed = self.sampled
        return f"; {n} of {plural(total, 'shard')} checked, drawn at random with --seed {seed}"

    def lines(self) -> list[str]:
        """The report as printed: one line per problem, one per file, then the summary."""
        return [*map(str, self.problems), *map(str, self.files), self.summary()]

    def to_json(self) -> dict[str, Any]:
        """The report as a JSON-ready dict (format ``vlp-data-check-v1``; what ``--json`` writes)."""
        return {
            "format": "vlp-data-check-v1",
            "ok": self.ok,
            "entries": self.entries,
            "images_checked": self.images_checked,
            "errors": self.errors,
            "warnings": self.warnings,
            "sampled": None if self.sampled is None else dict(zip(("shards", "of", "seed"), self.sampled)),
            "files": [asdict(f) for f in self.files],
            "problems": [asdict(p) for p in self.problems],
        }


def detect_kind(entries: Sequence[Any]) -> str:
    """The kind of a file from its entries' keys, by majority over the object entries: an entry
    with ``images`` or ``sentence`` votes ``nlvr``, one with ``question`` votes ``vqa``, any other
    ``pairs``; ties go to ``pairs``, then ``vqa``. Karpathy val/test files have the keys of pairs
    files and pass as ``pairs`` (a caption list is a valid pairs caption): ``kind="retrieval"``
    also requires every caption to be a list."""

    def vote(e: dict) -> str:
        return NLVR_STATEMENTS if "images" in e or "sentence" in e else VQA_QUESTIONS if "question" in e else PAIRS

    votes = Counter(vote(e) for e in entries if isinstance(e, dict))
    return max((PAIRS, VQA_QUESTIONS, NLVR_STATEMENTS), key=lambda k: votes[k])


def _cleaners() -> dict[str, tuple[str, Callable[[str], str]]]:
    """Each kind's text key and the ALBEF cleaning training applies to it (captions of ``pairs`` and
    ``retrieval`` files: their loader applies the rule itself, :func:`vlp.data.formats._captions`)."""
    from vlp.data.vqa import pre_question
    from vlp.preprocess.transforms import pre_caption

    return {
        VQA_QUESTIONS: ("question", pre_question),
        NLVR_STATEMENTS: ("sentence", pre_caption),
    }


def _emptied_texts(file: str, i: int, e: Any, key: str, clean: Callable[[str], str]) -> list[Problem]:
    """Texts of ``e[key]`` (a string or the strings of a list) that ``clean`` leaves no words of
    (:func:`vlp.data.formats.no_words_problem`, the shard reader's rule too); blank texts and wrong
    types are the loaders' rules, not repeated here."""
    v = e.get(key) if isinstance(e, dict) else None
    texts = [(None, v)] if isinstance(v, str) else list(enumerate(v)) if isinstance(v, list) else []
    found = [(k, t, no_words_problem(t, clean)) for k, t in texts if isinstance(t, str) and t.strip()]
    return [
        Problem(file, i, key, f"key '{key}'{'' if k is None else f' item {k}'} {t!r} {problem}")
        for k, t, problem in found
        if problem is not None
    ]


def _image_paths(e: Any, key: str) -> list[str]:
    """The image path strings of ``e[key]`` (one string, or a list), whatever else is wrong with it."""
    v = e.get(key) if isinstance(e, dict) else None
    paths = [v] if isinstance(v, str) else v if isinstance(v, list) else []
    return [p for p in paths if isinstance(p, str) and p.strip()]


def _check_file(
    path: Path, root: Path, kind: str, report: CheckReport, images: dict[str, list[tuple[str, int, str]]]
) -> None:
    """Check one file's JSON and entries into ``report``; add its image uses to ``images``
    (resolved path -> [(file, entry, key), ...])."""
    file = str(path)
    try:
        entries = read_entries(path)
    except BadJSON as e:
        report.problems.append(
            Problem(
                file,
                None,
                None,
                f"line {e.line} column {e.column}: invalid JSON ({e.reason})",
                line=e.line,
                column=e.column,
            )
        )
        report.files.append(FileSummary(file, None, False, 0))
        return
    except DataError as e:
        message = str(e).removeprefix(f"{file}: ")
        message = "annotation file not found" if message == f"annotation file not found: {file}" else message
        report.problems.append(Problem(file, None, None, message))
        report.files.append(FileSummary(file, None, False, 0))
        return
    detected = kind == "auto"
    kind = detect_kind(entries) if detected else kind
    report.files.append(FileSummary(file, kind, detected, len(entries)))
    if not entries:
        report.problems.append(Problem(file, None, None, "no entries (an empty list)"))
    cleaner = _cleaners().get(kind)
    for i, e in enumerate(entries):
        report.problems.extend(Problem(file, i, p.key, p.detail) for p in entry_problems(kind, path, i, e))
        if cleaner is not None:
            report.problems.extend(_emptied_texts(file, i, e, *cleaner))
        for image in _image_paths(e, IMAGE_KEY[kind]):
            images.setdefault(resolve_image(image, root), []).append((file, i, IMAGE_KEY[kind]))


def _map(fn: Callable[[T], R], items: Sequence[T], workers: int) -> Iterator[R]:
    """``map(fn, items)`` in order, on ``workers`` threads (Pillow decodes without the GIL)."""
    if workers <= 1:
        yield from map(fn, items)
        return
    with ThreadPoolExecutor(workers) as pool:
        for start in range(0, len(items), _CHUNK):
            yield from pool.map(fn, items[start : start + _CHUNK])


def _image_problem(image: str, users: list[tuple[str, int, str]], max_pixels: int) -> Optional[Problem]:
    """Open ``image`` as training does: an error if it cannot be used, a warning if it is tiny, else None."""
    file, i, key = users[0]
    origin = f"{file} entry {i}"
    try:
        w, h = open_image(image, origin, max_pixels=max_pixels, min_side=0).size
    except BadImage as e:
        message, severity = str(e).removeprefix(f"{origin}: "), "error"
    else:
        if min(w, h) >= MIN_SIDE:
            return None
        message = f"image {image} is {w}x{h}, shorter side below {MIN_SIDE} pixels (training upscales it)"
        severity = "warning"
    if len(users) > 1:
        shown = [f"entry {j}" if f == file else f"{f} entry {j}" for f, j, _ in users[:5]]
        message += f" (used by {len(users)} entries: {', '.join(shown)}{', ...' if len(users) > 5 else ''})"
    return Problem(file, i, key, message, severity, count=len(users))


def check_annotations(
    path: str | Path | Sequence[str | Path],
    image_root: Optional[str | Path] = None,
    images: bool = True,
    max_pixels: int = MAX_PIXELS,
    kind: str = "auto",
    workers: int = 1,
    show_progress: bool = False,
) -> CheckReport:
    """Check one annotation file (or several) and return every problem found.

    Per file: it exists and is valid JSON (else one problem with line and column, and the file is
    not checked further), its top level is a non-empty list, and each entry follows the rules of
    the loader of ``kind`` (``auto``: :func:`detect_kind`; see :func:`vlp.data.formats.entry_problems`),
    with every problem of every entry reported; texts that ALBEF's cleaning empties are errors too.
    With ``images``, each distinct image file (relative paths resolved against ``image_root``,
    default each file's folder, as in training) is fully decoded once with ``open_image``: missing,
    unreadable or truncated files and files over ``max_pixels`` (0: no limit) are errors, images
    with a side below ``MIN_SIDE`` warnings. ``workers`` threads open images; ``show_progress``
    shows a progress bar of that pass.
    """
    if kind not in CHECK_KINDS:
        raise ValueError(f"kind must be one of {list(CHECK_KINDS)}, got {kind!r}")
    paths = [Path(path)] if isinstance(path, (str, Path)) else [Path(p) for p in path]
    report = CheckReport()
    uses: dict[str, list[tuple[str, int, str]]] = {}
    for p in paths:
        _check_file(p, Path(image_root) if image_root else p.parent, kind, report, uses)
    if images:
        from vlp.progress import progress

        items = list(uses.items())
        bar = progress(len(items), "checking images", enabled=show_progress)
        for problem in _map(lambda item: _image_problem(item[0], item[1], max_pixels), items, workers):
            if problem is not None:
                report.problems.append(problem)
            bar.update(1)
        bar.close()
        report.images_checked = len(items)
    order = {str(p): k for k, p in enumerate(paths)}
    report.problems.sort(key=lambda p: (order[p.file], -1 if p.entry is None else p.entry))
    return report


def is_shard_entry(arg: str | Path) -> bool:
    """Whether a ``vlp data check`` argument names shards (a folder, a brace pattern of tars, or a
    URL entry: ``s3://``, ``gs://``, ``http(s)://``, ``pipe:``) rather than an annotation file."""
    from vlp.data.shard_format import is_brace_pattern
    from vlp.remote.shard_urls import is_url

    text = str(arg)
    return is_url(text) or Path(text).is_dir() or (is_brace_pattern(text) and text.endswith(".tar"))


def check_shards(
    entries: Sequence[str | Path],
    images: bool = True,
    max_pixels: int = MAX_PIXELS,
    caption_key: str = "caption",
    show_progress: bool = False,
    sample: Optional[int] = None,
    seed: int = 0,
) -> CheckReport:
    """Check shard folders (vlp's or img2dataset's), brace patterns of tars or URL entries, every
    member of every shard: each malformed sample (its JSON, its captions, a missing image or caption
    member) is one problem naming the shard and the sample; with ``images`` each image is decoded as
    training does (:func:`open_image`); a shard whose sample count is not its index's (or stats')
    is a problem, and so is a shard that cannot be read to its end (named with the member it broke
    in; the check goes on). A URL entry needs no count: without stats or an index its samples are
    counted while read. A local folder that is not a shard folder at all is one problem; a URL entry
    that cannot be reached (no such bucket, no credentials) raises one :class:`DataError`.
    ``sample``: check that many shards of all the entries', drawn at random with ``seed`` (the
    summary says how many of how many). One summary line per entry; a progress bar over the shards."""
    from vlp.progress import progress

    report = CheckReport(images_checked=0 if images else None)
    plans = _shard_plans(entries, caption_key, report)
    total = sum(len(shards) for _, shards in plans)
    chosen = set(range(total)) if sample is None else set(random.Random(seed).sample(range(total), min(sample, total)))
    if sample is not None:
        report.sampled = (len(chosen), total, seed)
    bar = progress(len(chosen), "checking shards", enabled=show_progress)
    k = 0
    for entry, shards in plans:
        samples = checked = 0
        for info in shards:
            k += 1
            if k - 1 in chosen:
                samples += _check_shard(info, images, max_pixels, report)
                checked += 1
                bar.update(1)
        layout = shards[0].layout if shards else "vlp"
        count = (
            plural(len(shards), "shard") if checked == len(shards) else f"{checked} of {plural(len(shards), 'shard')}"
        )
        report.files.append(FileSummary(entry, f"{layout} shards: {count}", False, samples))
    bar.close()
    return report


def _shard_plans(
    entries: Sequence[str | Path], caption_key: str, report: CheckReport
) -> list[tuple[str, list[ShardInfo]]]:
    """Each entry with its shards (:class:`vlp.data.shard_format.ShardInfo`); a local entry that is
    not a shard set is a problem in ``report`` (a URL entry's :class:`DataError` is raised)."""
    from vlp.data.shard_format import read_sizes, url_shards_to_check
    from vlp.remote.shard_urls import is_url

    plans = []
    for entry in map(str, entries):
        if is_url(entry):
            plans.append((entry, url_shards_to_check(entry, caption_key)))
            continue
        try:
            plans.append((entry, read_sizes([entry], caption_key, on_bad="skip")))  # broken tars: checked later
        except DataError as e:
            report.problems.append(Problem(entry, None, None, str(e).removeprefix(f"{entry}: ")))
            report.files.append(FileSummary(entry, None, False, 0))
    return plans


def _check_shard(info: ShardInfo, images: bool, max_pixels: int, report: CheckReport) -> int:
    """Check every member of the shard ``info`` into ``report``; return its samples (malformed ones
    included). One problem per malformed sample; at the end, a broken tar or a count other than the
    index's."""
    from vlp.data.shard_format import ShardFault, iter_shard
    from vlp.preprocess.images import MemberFile

    prefix, errors, samples = f"{info.path}: ", list[DataError](), 0
    for raw in iter_shard(info, images=images, check_count=True, errors=errors):
        samples += 1
        if images:
            origin = f"{info.path}: sample {raw.key!r}"
            try:
                open_image(MemberFile(raw.image, raw.member), origin, max_pixels, min_side=0)  # type: ignore[arg-type]
            except BadImage as e:
                report.problems.append(Problem(str(info.path), None, raw.member, str(e).removeprefix(prefix)))
            report.images_checked = (report.images_checked or 0) + 1
    samples += sum(not isinstance(e, ShardFault) for e in errors)  # malformed samples count
    report.problems += [Problem(str(info.path), None, None, str(err).removeprefix(prefix)) for err in errors]
    return samples


def default_workers() -> int:
    """Image-checking threads by default: the CPUs this process may use, at most 8."""
    return max(1, min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))

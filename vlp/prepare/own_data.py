"""``vlp prepare folder|csv``: your own image-text pairs -> one annotation file of vlp's (ALBEF's) format.

- :func:`image_folder`: a folder of images, each with its caption in a same-name ``.txt`` file beside
  it (``000001.jpg`` + ``000001.txt``, as img2dataset's and LAION's folders hold them), searched
  recursively. Each non-empty line of a ``.txt`` is one caption of the image (COCO's several
  captions per image).
- :func:`csv_pairs`: open_clip's CSV (``--csv-img-key``, ``--csv-caption-key``, ``--csv-separator``):
  one row per image-caption pair; the rows of one image become one entry with their captions.
  Relative image paths are resolved against the CSV file's folder.

Both write ``[{"image": absolute path, "caption": [captions]}]``, one entry per image, with
:func:`~vlp.data.json_entries.write_json_atomic`. Absolute paths (as ``vlp prepare cc3m`` writes) load
from any working directory and with any ``data.image_root``; a caption list makes the file a
pretraining or retrieval-training file (one caption drawn per load) and a retrieval split for
``vlp evaluate retrieval`` alike. What cannot be used (an image without a caption file, an empty
caption, a file with an image's name that is not an image, a bad CSV row) is left out and reported
as one :class:`~vlp.data.check.Problem` (severity ``warning``) each, as ``vlp data check`` reports
entries, and counted in the returned :class:`Prepared`. Images are identified from their header
(Pillow), not decoded: ``vlp data check`` on the written file decodes each one.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from vlp.data.check import Problem
from vlp.data.formats import caption_problem, no_words_problem
from vlp.data.json_entries import plural, write_json_atomic
from vlp.errors import ConfigError, DataError
from vlp.prepare.common import absolute_path

#: the file suffixes taken as images (any case): what Pillow opens and training reads
FOLDER_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff")
#: a caption file's suffix
CAPTION_SUFFIX = ".txt"
#: open_clip's CSV defaults: ``--csv-img-key``, ``--csv-caption-key``, ``--csv-separator``
CSV_IMG_KEY, CSV_CAPTION_KEY, CSV_SEPARATOR = "filepath", "title", "\t"


@dataclass
class Prepared:
    """What a converter wrote: ``counts`` (printed by ``vlp prepare``) and every item it left out
    (``problems``, warnings in ``vlp data check``'s form: ``FILE: warning: MESSAGE``)."""

    counts: dict[str, int]
    problems: list[Problem] = field(default_factory=list)

    def skip(self, file: str | Path, message: str, count: str, line: Optional[int] = None) -> None:
        """Record one left-out item: a warning on ``file`` (at ``line``) and one more in ``counts[count]``."""
        self.problems.append(Problem(str(file), None, None, message, "warning", line=line))
        self.counts[count] += 1

    def nothing_left(self, source: str | Path, what: str, shown: int = 3) -> DataError:
        """The error of a source with no usable item: ``what`` and the first ``shown`` warnings."""
        more = len(self.problems) - shown
        found = "; ".join(map(str, self.problems[:shown])) + (f"; and {more} more" if more > 0 else "")
        return DataError(f"{source}: {what}" + (f"; left out: {found}" if found else ""))


def image_problem(path: Path) -> Optional[str]:
    """Why ``path`` cannot be used as an image (completing "PATH ..."), or None: not a regular file,
    unreadable, or not identified as an image by Pillow (only the header is read)."""
    from PIL import Image, UnidentifiedImageError

    if not path.is_file():
        return "is not a file" if path.exists() else "does not exist"
    try:
        with Image.open(path) as im:
            w, h = im.size
    except UnidentifiedImageError:
        return "is not an image Pillow can identify"
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    return None if w > 0 and h > 0 else f"has no pixels ({w}x{h})"


def caption_refusal(text: str) -> Optional[str]:
    """Why the stripped, non-empty caption ``text`` cannot be trained on, or None: the loaders' rule
    (:func:`~vlp.data.formats.caption_problem`) and ``vlp data check``'s (ALBEF's cleaning leaves no
    words: :func:`~vlp.data.formats.no_words_problem`)."""
    problem = caption_problem(text)
    return f"is {problem}" if problem else no_words_problem(text)


def _is_hidden(rel: Path) -> bool:
    return any(part.startswith(".") for part in rel.parts)


def _caption_lines(txt: Path, prepared: Prepared) -> Optional[list[str]]:
    """The lines of caption file ``txt`` (UTF-8, a byte-order mark allowed), or None with a warning."""
    try:
        return txt.read_text(encoding="utf-8-sig").splitlines()
    except UnicodeDecodeError as e:
        prepared.skip(txt, f"not UTF-8 text (byte {e.start}); its image is left out", "bad_caption_files")
    except OSError as e:
        prepared.skip(txt, f"cannot be read ({e.strerror or e}); its image is left out", "bad_caption_files")
    return None


def _line_captions(txt: Path, lines: list[str], prepared: Prepared) -> list[str]:
    """The captions of caption file ``txt``: its non-empty lines, stripped; a refused one
    (:func:`caption_refusal`) is a warning naming its line (``counts["bad_captions"]``)."""
    captions = []
    for n, line in enumerate(lines, 1):
        text = line.strip()
        why = caption_refusal(text) if text else None
        if why is not None:
            prepared.skip(txt, f"line {n}: caption {text[:80]!r} {why}; line left out", "bad_captions", line=n)
        elif text:
            captions.append(text)
    return captions


def image_folder(folder: str | Path, out: str | Path) -> Prepared:
    """Images of ``folder`` (recursively; suffixes :data:`FOLDER_IMAGE_SUFFIXES` in any case; hidden
    files and folders, whose names start with ``.``, are passed over) with a same-name ``.txt``
    caption file beside each -> ``out``: ``[{"image": absolute path, "caption": [one caption per
    non-empty line]}]``, in the order of the images' paths.

    Left out, each with a warning naming the file and counted: an image without a caption file
    (``no_caption``), one whose caption file has no usable line (``empty_caption``; a line is refused
    by the loaders' caption rules: ``bad_captions``) or is not UTF-8 (``bad_caption_files``), a file
    with an image suffix that is not an image (``bad_images``), a ``.txt`` with no image beside it
    (``captions_without_image``). Files of other suffixes are counted (``other_files``) and passed
    over. No usable image at all is one :class:`DataError`; so is a ``folder`` that is not a folder."""
    root = Path(folder)
    if not root.is_dir():
        raise DataError(f"image folder not found: {root}")
    files = sorted(p for p in root.rglob("*") if not _is_hidden(p.relative_to(root)) and p.is_file())
    names = ("images", "entries", "captions", "no_caption", "empty_caption", "bad_captions", "bad_caption_files")
    prepared = Prepared(dict.fromkeys((*names, "bad_images", "captions_without_image", "other_files"), 0))
    counts = prepared.counts
    stems_with_image = set()
    entries = []
    for path in files:
        if path.suffix.lower() not in FOLDER_IMAGE_SUFFIXES:
            counts["other_files"] += path.suffix.lower() != CAPTION_SUFFIX
            continue
        counts["images"] += 1
        stems_with_image.add(path.with_suffix(""))
        txt = path.with_suffix(CAPTION_SUFFIX)
        if not txt.is_file():
            prepared.skip(path, f"no caption file {txt.name} beside it; left out", "no_caption")
            continue
        lines = _caption_lines(txt, prepared)
        if lines is None:
            continue
        captions = _line_captions(txt, lines, prepared)
        if not captions:
            prepared.skip(txt, f"no caption in it (empty or refused lines); {path.name} left out", "empty_caption")
            continue
        problem = image_problem(path)
        if problem is not None:
            prepared.skip(path, f"{path.name} {problem}; left out", "bad_images")
            continue
        entries.append({"image": absolute_path(root, path.relative_to(root).as_posix()), "caption": captions})
        counts["captions"] += len(captions)
    for txt in (p for p in files if p.suffix.lower() == CAPTION_SUFFIX):
        if txt.with_suffix("") not in stems_with_image:
            prepared.skip(txt, "a caption file with no image of the same name beside it", "captions_without_image")
    counts["entries"] = len(entries)
    if not entries:
        raise prepared.nothing_left(
            root,
            f"no image with a caption found ({counts['images']} images; each needs a same-name .txt beside it, "
            "e.g. 000001.jpg + 000001.txt)",
        )
    write_json_atomic(Path(out), entries)
    return prepared


def csv_separator(text: str) -> str:
    """``--csv-separator``'s value as the one character :mod:`csv` takes: a tab is given as itself or
    as ``\\t`` (what ``--csv-separator "\\t"`` passes from a shell, as open_clip documents it)."""
    sep = "\t" if text == "\\t" else text
    if len(sep) != 1:
        raise ConfigError(f"--csv-separator: expected one character (or \\t for a tab), got {text!r}")
    return sep


def _columns(path: Path, header: list[str], keys: tuple[str, str], sep: str) -> tuple[int, int]:
    """The positions of the image and caption columns ``keys`` in ``header``; one :class:`DataError`
    naming the file, the missing column and the columns it has (and a likely separator) otherwise."""
    missing = [k for k in keys if k not in header]
    if not missing:
        return header.index(keys[0]), header.index(keys[1])
    hint = ""
    if len(header) == 1:
        other = next((s for s in ("\t", ",", ";", "|") if s != sep and s in header[0]), None)
        hint = "" if other is None else f"; the header holds {other!r}: is the separator --csv-separator {other!r}?"
    flags = {keys[0]: "--csv-img-key", keys[1]: "--csv-caption-key"}
    named = ", ".join(f"{k!r} ({flags[k]})" for k in missing)
    raise DataError(
        f"{path}: no {'columns' if len(missing) > 1 else 'column'} {named}; its columns are {header} (read with separator {sep!r}){hint}"
    )


def csv_pairs(
    csv_file: str | Path,
    out: str | Path,
    img_key: str = CSV_IMG_KEY,
    caption_key: str = CSV_CAPTION_KEY,
    separator: str = CSV_SEPARATOR,
) -> Prepared:
    """open_clip's CSV ``csv_file`` (a header row naming the columns; one image-caption pair per row;
    ``separator`` one character, default a tab as open_clip's) -> ``out``: one entry per image,
    ``[{"image": absolute path, "caption": [its rows' captions]}]``, in the order of first appearance.
    Relative paths in ``img_key`` are resolved against the CSV file's folder (open_clip opens them
    from the working directory: give absolute paths, or keep the CSV beside the images).

    A missing column is one :class:`DataError` naming the file and the columns it has. A row is left
    out with a warning naming its line (counted): fields more or fewer than the header's
    (``bad_rows``), an empty image path (``bad_rows``), an image that is missing or not an image
    (``bad_images``), a caption the loaders refuse (``bad_captions``). A file that is not UTF-8 or
    not CSV is one :class:`DataError` naming the line; so is one with no row left."""
    path = Path(csv_file)
    if not path.is_file():
        raise DataError(f"CSV file not found: {path}")
    sep = csv_separator(separator)
    names = ("rows", "entries", "captions", "bad_rows", "bad_images", "bad_captions")
    rows = _CsvRows(path, Prepared(dict.fromkeys(names, 0)))
    with open(path, encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f, delimiter=sep)
        try:
            header = next(reader, None)
            if header is None:
                raise DataError(f"{path}: empty file, expected a header row naming the columns")
            rows.width = len(header)
            rows.cols = _columns(path, [h.strip() for h in header], (img_key, caption_key), sep)
            for row in reader:
                if row:  # a blank line
                    rows.add(reader.line_num, row)
        except (csv.Error, UnicodeDecodeError) as e:
            raise DataError(f"{path}: line {reader.line_num + 1}: cannot read as CSV ({e})") from None
    prepared = rows.prepared
    entries = [{"image": image, "caption": caps} for image, caps in rows.by_image.items()]
    prepared.counts.update(entries=len(entries), captions=sum(len(c) for c in rows.by_image.values()))
    if not entries:
        raise prepared.nothing_left(path, f"no usable row ({prepared.counts['rows']} rows)")
    write_json_atomic(Path(out), entries)
    return prepared


@dataclass
class _CsvRows:
    """The rows of one CSV file read so far: the captions of each image (absolute path), in order."""

    path: Path
    prepared: Prepared
    width: int = 0  # the header's fields
    cols: tuple[int, int] = (0, 0)  # the image and caption columns
    by_image: dict[str, list[str]] = field(default_factory=dict)
    checked: dict[str, Optional[str]] = field(default_factory=dict)  # image -> its problem (opened once)

    def add(self, line: int, row: list[str]) -> None:
        """Data row ``row`` (ending at ``line``) into :attr:`by_image`, or a warning saying why it is left out."""
        prepared, path, where = self.prepared, self.path, f"line {line}"
        prepared.counts["rows"] += 1
        if len(row) != self.width:
            message = f"{where}: {plural(len(row), 'field')}, expected {self.width} (the header's); row left out"
            prepared.skip(path, message, "bad_rows", line=line)
            return
        rel, caption = row[self.cols[0]].strip(), row[self.cols[1]].strip()
        if not rel:
            prepared.skip(path, f"{where}: empty image path; row left out", "bad_rows", line=line)
            return
        image = rel if Path(rel).is_absolute() else absolute_path(path.parent, rel)
        if image not in self.checked:
            self.checked[image] = image_problem(Path(image))
        if self.checked[image] is not None:
            prepared.skip(path, f"{where}: image {image} {self.checked[image]}; row left out", "bad_images", line=line)
            return
        why = caption_refusal(caption) if caption else "is empty"
        if why is not None:
            prepared.skip(path, f"{where}: caption {caption[:80]!r} {why}; row left out", "bad_captions", line=line)
            return
        self.by_image.setdefault(image, []).append(caption)

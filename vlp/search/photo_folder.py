"""The images of a folder, as ``vlp index`` sees them: every file under it (recursively, symlinked
folders not followed) whose name ends in an image extension (:data:`IMAGE_EXTENSIONS`, any case),
in sorted order of their relative paths; the other files are counted as ignored."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from vlp.errors import DataError

#: the file name endings ``vlp index`` reads as images (compared lower-cased)
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")


@dataclass(frozen=True)
class PhotoFolder:
    """``root`` (absolute), ``files`` (the image files' paths relative to it, sorted as strings),
    ``ignored`` (how many other files) and ``digest``: SHA-256 of every image file's relative path,
    size and modification time, which changes when a file is added, removed or rewritten."""

    root: Path
    files: list[str]
    ignored: int
    digest: str


def scan_folder(folder: str | os.PathLike) -> PhotoFolder:
    """The images of ``folder``; a missing folder, or one without any image file, raises one
    :class:`~vlp.errors.DataError` naming it."""
    root = Path(folder).absolute()
    if not root.is_dir():
        raise DataError(f"{folder}: no such folder")
    files, ignored = [], 0
    for top, dirs, names in os.walk(root):
        dirs.sort()
        for name in names:
            if name.lower().endswith(IMAGE_EXTENSIONS):
                files.append(os.path.relpath(os.path.join(top, name), root))
            else:
                ignored += 1
    if not files:
        raise DataError(
            f"{folder}: no image files under it (names ending in {', '.join(IMAGE_EXTENSIONS)}; {ignored} other files)"
        )
    files.sort()
    return PhotoFolder(root, files, ignored, _digest(root, files))


def _digest(root: Path, files: list[str]) -> str:
    """SHA-256 over each file's relative path, size and modification time (ns); a file that cannot
    be stat'ed counts with size and time -1 (it will be skipped as unreadable)."""
    h = hashlib.sha256()
    for rel in files:
        try:
            st = os.stat(root / rel)
            size, mtime = st.st_size, st.st_mtime_ns
        except OSError:
            size, mtime = -1, -1
        h.update(f"{rel}\0{size}\0{mtime}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def shown_path(path: str | os.PathLike) -> str:
    """``path`` as the commands print it: relative to the working folder when it lies below it, else as
    it is."""
    rel = os.path.relpath(path)
    return str(path) if rel.startswith("..") else rel

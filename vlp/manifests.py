"""The manifest of a folder vlp wrote (a checkpoint, a ``save_pretrained`` folder, a helper feature
cache): ``manifest.json``, each file's size and SHA-256, written last by :func:`vlp.weights.publish`;
read here, by every reader of such a folder (:func:`verify_manifest`, :func:`refuse_unlisted`).

A manifest names files **inside its folder** only: an entry is a relative path without ``..``
parts, and the file it names, symlinks resolved, lies in the folder (:func:`listed_file`). An entry
``../../../../etc/hostname`` or ``/etc/hostname``, or a symlink out of the folder, is refused by name
whatever hash it lists: vlp never hashes or loads a file outside the folder it was asked to read.
One layout is the exception, as ``huggingface_hub`` writes it: a Hub cache snapshot
(``models--ORG--NAME/snapshots/REVISION/``) holds symlinks to ``models--ORG--NAME/blobs/``, and
they may point there (:func:`content_roots`).
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import json
from pathlib import Path, PurePosixPath
from typing import Iterable

from vlp.errors import CheckpointError

MANIFEST = "manifest.json"


def file_sha256(path: Path) -> str:
    """SHA-256 of a file, computed once per file version: a checkpoint read by several steps of one
    job (find, then load) is hashed once; a rewritten file (new size, mtime or inode) again."""
    st = path.stat()
    return _sha256_of(str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ino)


@functools.lru_cache(maxsize=256)
def _sha256_of(path: str, _size: int, _mtime_ns: int, _inode: int) -> str:
    digest = hashlib.sha256()  # hashlib.file_digest needs Python 3.11; vlp supports 3.10
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def content_roots(folder: Path) -> list[Path]:
    """Where the files of ``folder``'s manifest may lie, symlinks resolved: the folder; for a
    Hugging Face Hub cache snapshot (``REPO/snapshots/REVISION``, ``REPO`` named ``models--*``) also
    ``REPO/blobs``, where ``huggingface_hub``'s snapshot symlinks point."""
    real = folder.resolve()
    roots = [real]
    if real.parent.name == "snapshots" and real.parent.parent.name.startswith("models--"):
        roots.append(real.parent.parent / "blobs")
    return roots


def listed_file(folder: Path, rel: str, name: str) -> Path:
    """The file that the manifest entry ``rel`` of ``folder`` names, refused with one
    :class:`CheckpointError` (starting with ``name``, naming the manifest and the entry) unless it
    lies inside ``folder``: a relative path without ``..`` whose resolved target (symlinks
    followed) is in the resolved folder (or a Hub snapshot's blobs, :func:`content_roots`)."""
    parts = PurePosixPath(rel).parts
    if not rel or "\0" in rel or PurePosixPath(rel).is_absolute() or ".." in parts or "\\" in rel:
        why = "an absolute path" if rel.startswith("/") else "a path with '..'" if ".." in parts else "not a plain path"
    else:
        path = folder / rel
        target = path.resolve()
        if any(target.is_relative_to(root) for root in content_roots(folder)):
            return path
        why = "a symlink to a file outside it"
    raise CheckpointError(
        f"{name}: {folder / MANIFEST} lists {rel!r}, which is outside the folder ({why}); expected a path "
        "relative to the folder naming a file inside it (no '..', no absolute path, no symlink out of it): "
        "the manifest was edited, or the folder put together by hand"
    )


def verify_manifest(folder: Path, name: str, require: Iterable[str]) -> None:
    """:func:`vlp.weights.verify_checkpoint`'s check of any folder vlp wrote with
    :func:`vlp.weights.publish` (a checkpoint, a ``save_pretrained`` folder, a helper feature cache):
    the ``require``d files exist (the first must be listed), every listed file lies inside the folder
    (:func:`listed_file`) and has its size and SHA-256. Messages start with ``name`` (e.g.
    ``checkpoint DIR``)."""
    require = list(require)
    for rel in require:
        if not (folder / rel).exists():
            raise CheckpointError(f"{name}: missing {rel}")
    mf = folder / MANIFEST
    if not mf.is_file():
        raise CheckpointError(
            f"{name}: no {MANIFEST}, so vlp cannot tell whether its files are the ones it wrote (expected a folder "
            "written by vlp with its manifest: the manifest was deleted, or the folder was put together by hand)"
        )
    try:
        files = json.loads(mf.read_text())["files"]
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{name}: unreadable {MANIFEST} ({e})") from None
    well_formed = (
        isinstance(files, dict)
        and require[0] in files
        and all(
            isinstance(m, dict) and isinstance(m.get("bytes"), int) and isinstance(m.get("sha256"), str)
            for m in files.values()
        )
    )
    if not well_formed:
        raise CheckpointError(
            f"{name}: malformed {MANIFEST}: 'files' must map every file, {require[0]} "
            'included, to {"bytes": n, "sha256": "..."} (corrupted)'
        )
    paths = {rel: listed_file(folder, rel, name) for rel in files}  # every entry inside, before any is read
    for rel, meta in files.items():
        p = paths[rel]
        if not p.is_file():
            raise CheckpointError(f"{name}: {rel} is missing")
        size = p.stat().st_size
        if size != meta["bytes"]:
            what = "truncated" if size < meta["bytes"] else "changed since it was saved"
            raise CheckpointError(f"{name}: {rel} is {size} bytes, the manifest says {meta['bytes']} ({what})")
        if file_sha256(p) != meta["sha256"]:
            raise CheckpointError(
                f"{name}: {rel} does not match its SHA-256 in {MANIFEST} (changed since it was saved, or corrupted)"
            )


def refuse_unlisted(folder: Path, patterns: Iterable[str], reader: str) -> None:
    """With a manifest: each file of ``folder`` (relative path, subfolders included) that matches
    one of the fnmatch ``patterns`` but is not listed in it is refused by name
    (:class:`CheckpointError`): ``reader`` would read it, and nothing says where it came from (a file
    dropped in after the save). Files no pattern matches (a README) are left alone. Without a
    manifest (an older folder) nothing is checked."""
    mf = folder / MANIFEST
    if not mf.is_file():
        return
    listed = json.loads(mf.read_text())["files"]  # verify_manifest read it first
    patterns = list(patterns)
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder).as_posix()
        if rel not in listed and any(fnmatch.fnmatchcase(rel, pat) for pat in patterns) and p.is_file():
            raise CheckpointError(
                f"{folder}: {rel} is not in {MANIFEST}, and the {reader} would read it: a file added after the "
                "save can change what loads (special tokens, vocabulary, preprocessing, state); remove it, or "
                "save the folder again"
            )

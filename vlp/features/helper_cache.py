"""Cached features of the frozen SRCL helper: computed once, read by the training data path.

A cache is a folder with ``features.safetensors`` (``image`` [N_img, E], ``text`` [N_txt, E],
L2-normalised, fp32) and ``index.json`` (format, the image keys and caption strings in row order,
and where the features came from; built from shard entries, ``shards``: every shard read,
:mod:`vlp.data.shard_samples`). Images are looked up by their sample key (``image_id`` or
path), captions by their exact text, so one cache serves any subset or order of the data it was
built from. Loaded, the keys and captions are held in numpy arrays
(:class:`~vlp.features.row_index.StringRows`), which forked loader workers share without copying.

``index.json``'s ``kind`` says what the helper is: ``learned`` (a trained helper; the default when
absent) or an oracle, ``oracle-exact`` / ``oracle-graded``: the world's ground truth, or ``oracle-noisy``: the
exact truth corrupted to a chosen ROC-AUC (:func:`vlp.lab.oracle.noisy_relevance`). An oracle
cache also stores ``relevance`` [N_txt, N_img] (fp32 in [0, 1]) and its "features" are the row
indices themselves (``image`` [N_img, 1] = 0..N_img-1, ``text`` likewise, exact in fp32), so the
batch carries indices down the same data path and the regulator looks the relevance up
(:func:`vlp.losses.srcl.relevance_lookup`) instead of taking cosines. A learned cache's
``helper_init`` says how its helper got its weights, ``pretrained`` or ``random``
(:attr:`HelperCache.helper_init`).
"""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import torch
from safetensors.torch import load_file

from vlp.data.formats import Sample
from vlp.errors import CheckpointError, DataError
from vlp.features.row_index import StringRows, count_missing_strings, sample_strings
from vlp.features.store import refuse_existing
from vlp.weights import publish, refuse_unlisted, save_tensors, verify_manifest

CACHE_FORMAT = "vlp-helper-features-v1"
#: the files of a cache, all read by :meth:`HelperCache.load` (the features first)
CACHE_FILES = ("features.safetensors", "index.json")
LEARNED = "learned"
ORACLE_KINDS = ("oracle-exact", "oracle-graded", "oracle-noisy")
KINDS = (LEARNED, *ORACLE_KINDS)


@dataclass
class HelperCache:
    image: torch.Tensor  # [N_img, E]
    text: torch.Tensor  # [N_txt, E]
    image_index: Mapping[str, int]  # image key -> row of ``image`` (a StringRows when loaded)
    text_index: Mapping[str, int]  # caption -> row of ``text``
    meta: dict[str, Any]
    path: Path
    relevance: Optional[torch.Tensor] = None  # [N_txt, N_img] ground truth of an oracle cache

    @property
    def dim(self) -> int:
        """The feature width E (1 for an oracle cache, whose features are row indices)."""
        return int(self.image.shape[1])

    @property
    def kind(self) -> str:
        """``learned`` or one of :data:`ORACLE_KINDS`."""
        return str(self.meta.get("kind", LEARNED))

    @property
    def shards(self) -> Optional[list[str]]:
        """The shards (URLs as listed, local tars' resolved paths) the cache was built from,
        ``index.json``'s ``shards``; None for a cache of annotation files only."""
        shards = self.meta.get("shards")
        return None if shards is None else [str(s) for s in shards]

    @property
    def is_oracle(self) -> bool:
        """Whether :attr:`kind` is one of :data:`ORACLE_KINDS` (the features are row indices)."""
        return self.kind in ORACLE_KINDS

    @property
    def helper_init(self) -> Optional[str]:
        """How the helper of a ``learned`` cache got its weights, ``pretrained`` or ``random``
        (``index.json``'s ``helper_init``; a cache written before that key: ``random`` for an
        open_clip helper without weights, ``pretrained`` otherwise); None for an oracle."""
        if self.is_oracle:
            return None
        if "helper_init" in self.meta:
            return str(self.meta["helper_init"])
        return "random" if "pretrained" in self.meta and self.meta["pretrained"] is None else "pretrained"

    @classmethod
    def load(cls, path: str | Path) -> HelperCache:
        """Read a cache folder; a missing or inconsistent cache raises one :class:`DataError`."""
        path = Path(path)
        index_file, feat_file = path / "index.json", path / "features.safetensors"
        if not index_file.is_file() or not feat_file.is_file():
            raise DataError(
                f"helper feature cache {path}: expected index.json and features.safetensors "
                "(build it with `vlp cache-helper-features`)"
            )
        with ThreadPoolExecutor(1) as pool:  # SHA-256 releases the GIL: the manifest is checked beside the parsing
            verified = pool.submit(_verify, path)
            try:
                return _read(path, index_file, feat_file)
            finally:
                verified.result()  # files that differ from their manifest are reported first

    def check_covers(self, samples: Sequence[Sample], limit: int = 3) -> None:
        """Fail before training if a training image or caption has no cached feature."""
        keys, captions = sample_strings(samples)
        if count_missing_strings(self.image_index, keys) == 0 and count_missing_strings(self.text_index, captions) == 0:
            return
        missing_img = [s for s in samples if s.image_key not in self.image_index]
        missing_txt = [(s, c) for s in samples for c in s.captions if c not in self.text_index]
        if missing_img or missing_txt:
            ex = [f"{s.origin}: image {s.image_key}" for s in missing_img[:limit]]
            ex += [f"{s.origin}: caption {c!r}" for s, c in missing_txt[:limit]]
            how = "`vlp cache-helper-features` on the same annotation files"
            hint = self._spelling_hint(missing_img[0]) if missing_img else None
            raise DataError(
                f"helper feature cache {self.path} lacks {len(missing_img)} images and "
                f"{len(missing_txt)} captions of the training data, e.g. {'; '.join(ex)}. "
                + (
                    f"{hint}; name the file the same way in both, or rebuild it with {how}"
                    if hint
                    else f"Rebuild it with {how}"
                )
            )

    def _spelling_hint(self, missing: Sample) -> Optional[str]:
        """Where the cache holds ``missing``'s image under another spelling of its annotation file's
        path (an image's key starts with that path as it was given): that, else None."""
        file = missing.origin.rsplit(" entry ", 1)[0]
        if not missing.image_key.startswith(f"{file}:"):
            return None
        tail = missing.image_key[len(file) :]  # ":" + image_id or image path
        other = next((k[: -len(tail)] for k in self.image_index if k.endswith(tail)), None)
        if other is None:
            return None
        return (
            f"It holds that image as {other}{tail}: an image's key starts with its annotation file's path "
            f"as it was given, {other} to the cache and {file} here"
        )

    def lookup(self, image_key: str, caption: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The cached features (image [E], text [E]) of image ``image_key`` and of ``caption`` (its
        exact text); a key or caption not in the cache raises ``KeyError`` (see :meth:`check_covers`)."""
        return self.image[self.image_index[image_key]], self.text[self.text_index[caption]]


def _verify(path: Path) -> None:
    """The cache's files against its manifest (a cache without one, from before issue 41, is refused too)."""
    try:
        verify_manifest(path, f"helper feature cache {path}", CACHE_FILES)
        refuse_unlisted(path, CACHE_FILES, "helper cache reader")
    except CheckpointError as e:
        raise DataError(f"{e}; build the cache again with `vlp cache-helper-features`") from None


def _read(path: Path, index_file: Path, feat_file: Path) -> HelperCache:
    """The cache of ``index.json`` and ``features.safetensors``; one :class:`DataError` where they disagree."""
    try:
        index = json.loads(index_file.read_text())
    except json.JSONDecodeError as e:
        raise DataError(f"{index_file}: not valid JSON: {e}") from None
    if index.get("format") != CACHE_FORMAT:
        raise DataError(f"{index_file}: key 'format' is {index.get('format')!r}, expected {CACHE_FORMAT!r}")
    feats = load_file(str(feat_file))
    image, text = feats.get("image"), feats.get("text")
    keys, texts = index.get("image_keys", []), index.get("texts", [])
    if image is None or text is None or image.shape[0] != len(keys) or text.shape[0] != len(texts):
        raise DataError(
            f"{path}: features.safetensors does not match index.json ({len(keys)} image keys, {len(texts)} texts)"
        )
    meta = {k: v for k, v in index.items() if k not in ("image_keys", "texts")}
    relevance = feats.get("relevance")
    _check_kind(path, meta.get("kind", LEARNED), image, text, relevance)
    image_rows, text_rows = _rows(index_file, "image_keys", keys), _rows(index_file, "texts", texts)
    return HelperCache(image, text, image_rows, text_rows, meta, path, relevance)


def _rows(index_file: Path, key: str, strings: list) -> StringRows:
    """The row index of ``index.json``'s list ``key``; anything but strings in it is one :class:`DataError`."""
    try:
        return StringRows.of(strings)
    except TypeError:  # a non-string among them
        bad = next(s for s in strings if not isinstance(s, str))
        raise DataError(f"{index_file}: key {key!r} holds {bad!r}, expected strings") from None


def _check_kind(
    path: Path, kind: Any, image: torch.Tensor, text: torch.Tensor, relevance: Optional[torch.Tensor]
) -> None:
    """An oracle cache needs index features and a [N_txt, N_img] relevance table in [0, 1]."""
    if kind not in KINDS:
        raise DataError(f"{path}: key 'kind' is {kind!r}, expected one of {list(KINDS)}")
    if kind == LEARNED:
        return
    n_img, n_txt = image.shape[0], text.shape[0]
    if relevance is None or tuple(relevance.shape) != (n_txt, n_img):
        got = None if relevance is None else tuple(relevance.shape)
        raise DataError(
            f"{path}: an {kind} cache needs 'relevance' [{n_txt}, {n_img}] in features.safetensors, got {got}"
        )
    if not (torch.equal(image, index_features(n_img)) and torch.equal(text, index_features(n_txt))):
        raise DataError(f"{path}: an {kind} cache's features must be its row indices (index_features)")
    if relevance.numel() and not bool(((relevance >= 0) & (relevance <= 1)).all()):
        raise DataError(f"{path}: 'relevance' must lie in [0, 1]")


def index_features(n: int) -> torch.Tensor:
    """The "features" of an oracle cache: rows 0..n-1 as fp32 [n, 1] (exact below 2**24)."""
    if n >= 2**24:
        raise DataError(f"an oracle helper cache holds at most {2**24 - 1} rows, got {n}")
    return torch.arange(n, dtype=torch.float32)[:, None]


def cache_rows(samples: Sequence[Sample]) -> tuple[dict[str, str], list[str], list[str]]:
    """The rows of a cache of ``samples``: the image path of each key, the sorted image keys and
    the sorted distinct captions."""
    paths: dict[str, str] = {}
    for smp in samples:
        paths.setdefault(smp.image_key, smp.image)
    return paths, sorted(paths), sorted({c for smp in samples for c in smp.captions})


def write_cache(
    out: str | Path,
    image_keys: Sequence[str],
    image: torch.Tensor,
    texts: Sequence[str],
    text: torch.Tensor,
    meta: dict[str, Any],
    relevance: Optional[torch.Tensor] = None,
) -> Path:
    """Write a cache folder atomically; an existing folder is never overwritten. ``relevance``
    [N_txt, N_img]: the ground truth of an oracle cache (``meta["kind"]`` one of :data:`ORACLE_KINDS`)."""
    out = Path(out)
    refuse_existing(out)
    _check_kind(out, meta.get("kind", LEARNED), image, text, relevance)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    tensors = {"image": image.float().contiguous(), "text": text.float().contiguous()}
    if relevance is not None:
        tensors["relevance"] = relevance.float().contiguous()
    save_tensors(tensors, tmp / "features.safetensors")
    index = {
        "format": CACHE_FORMAT,
        **meta,
        "embed_dim": int(image.shape[1]),
        "num_images": len(image_keys),
        "num_texts": len(texts),
        "image_keys": list(image_keys),
        "texts": list(texts),
    }
    (tmp / "index.json").write_text(json.dumps(index))
    return publish(tmp, out)  # with a manifest (sizes, SHA-256) that HelperCache.load verifies

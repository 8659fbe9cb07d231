"""Relevance files (vlp): the positives of each query of a retrieval split, beyond its own pairs.

A Karpathy split knows one image per caption; a relevance file lists, per query, every candidate
that is relevant to it (docs/data.md, "Relevance file"). Two versions are read:

- ``vlp-relevance-v1``: ``relevant_images`` [N_txt] lists of image indices, each holding the
  text's own image; the image->text positives are its transpose (every text that lists the image).
- ``vlp-relevance-v2`` (``vlp prepare eccv-caption``): as v1, plus

  - an empty list marks a text that is not a text->image query (the benchmark did not annotate it);
  - an optional ``relevant_texts`` [N_img] lists of text indices: the image->text positives given
    on their own (an empty list: not an image->text query). Without it, the transpose of
    ``relevant_images`` as in v1;
  - a list need not hold the query's own pair (ECCV Caption judged 9 original COCO captions wrong
    for their images);
  - an optional ``benchmark`` name (``eccv-caption``, ``cxc``).

The shapes world writes v1: its lists are complete in both directions and hold every own pair.
Every relevance-aware metric averages over the queries with a non-empty list
(:func:`vlp.eval.metrics.relevance_metrics`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Protocol, Sequence

from vlp.data.json_entries import read_json
from vlp.errors import DataError

__all__ = [
    "RELEVANCE_FORMAT",
    "RELEVANCE_FORMAT_V2",
    "RELEVANCE_FORMATS",
    "Relevance",
    "load_relevance",
    "load_relevance_file",
    "relevance_record",
]

#: version 1 (the shapes world's): a list per text holding its own image; image->text = the transpose
RELEVANCE_FORMAT = "vlp-relevance-v1"
#: version 2 (``vlp prepare eccv-caption``): v1 + ``relevant_texts``, empty lists for non-queries
RELEVANCE_FORMAT_V2 = "vlp-relevance-v2"
RELEVANCE_FORMATS = (RELEVANCE_FORMAT, RELEVANCE_FORMAT_V2)


class _Split(Protocol):
    """What a relevance file is checked against (a :class:`vlp.data.formats.RetrievalSplit`)."""

    images: list[str]
    texts: list[str]
    txt2img: list[int]
    source: str


@dataclass
class Relevance:
    """The positives of a split's queries, in both directions.

    ``images`` [N_txt]: per text, the indices of its relevant images (empty: not a query).
    ``texts`` [N_img]: per image, the indices of its relevant texts (empty: not a query), or None
    for the transpose of ``images``. ``benchmark``: the file's ``benchmark`` name, if any.
    """

    images: list[list[int]]
    texts: Optional[list[list[int]]] = None
    benchmark: Optional[str] = None


def relevance_record(
    annotation: str,
    texts: Sequence[str],
    num_images: int,
    relevant_images: Sequence[Sequence[int]],
    relevant_texts: Optional[Sequence[Sequence[int]]] = None,
    benchmark: Optional[str] = None,
) -> dict[str, Any]:
    """The JSON object of a ``vlp-relevance-v2`` file (lists sorted, duplicates dropped).

    ``annotation``: the split file's name; ``texts`` [N_txt] its captions flattened in order;
    ``relevant_images`` [N_txt] and ``relevant_texts`` [N_img] (optional) as in :class:`Relevance`.
    """
    record: dict[str, Any] = {"format": RELEVANCE_FORMAT_V2, "annotation": annotation}
    if benchmark is not None:
        record["benchmark"] = benchmark
    record |= {
        "num_images": num_images,
        "texts": list(texts),
        "relevant_images": [sorted(set(r)) for r in relevant_images],
    }
    if relevant_texts is not None:
        record["relevant_texts"] = [sorted(set(r)) for r in relevant_texts]
    return record


def _index_lists(path: Path, data: dict, key: str, n_lists: int, n_items: int, what: str) -> list[list[int]]:
    """``data[key]``: ``n_lists`` lists of indices in [0, n_items); errors name file and key."""
    lists = data.get(key)
    if not isinstance(lists, list) or len(lists) != n_lists:
        n = len(lists) if isinstance(lists, list) else "no"
        raise DataError(f"{path}: key '{key}' has {n} entries, expected {n_lists} ({what})")
    for k, r in enumerate(lists):
        if not isinstance(r, list) or not all(type(j) is int and 0 <= j < n_items for j in r):
            kind = "image" if key == "relevant_images" else "text"
            raise DataError(f"{path}: {key}[{k}]: expected a list of {kind} indices in [0, {n_items})")
    return lists


def load_relevance_file(path: str | Path, split: _Split) -> Relevance:
    """Read a v1 or v2 relevance file and check it against ``split``; one :class:`DataError` names
    the file and key of the first problem (an unknown format, a list count that is not the split's,
    ``texts`` other than the split's captions, an index out of range; v1: a text whose list lacks
    its own image, or a ``relevant_texts`` key)."""
    path = Path(path)
    data = read_json(path)
    fmt = data.get("format") if isinstance(data, dict) else None
    if fmt not in RELEVANCE_FORMATS:
        raise DataError(f'{path}: expected an object with "format": one of {", ".join(RELEVANCE_FORMATS)}')
    n_img, n_txt = len(split.images), len(split.texts)
    images = _index_lists(path, data, "relevant_images", n_txt, n_img, f"texts in {split.source}")
    texts = data.get("texts")
    if texts is not None and list(texts) != list(split.texts):
        bad = next((i for i, (a, b) in enumerate(zip(texts, split.texts)) if a != b), -1) if len(texts) == n_txt else -1
        raise DataError(
            f"{path}: key 'texts' does not match the captions of {split.source} (first difference at text {bad})"
        )
    if fmt == RELEVANCE_FORMAT:
        if "relevant_texts" in data:
            raise DataError(f'{path}: key \'relevant_texts\' needs "format": "{RELEVANCE_FORMAT_V2}"')
        for k, r in enumerate(images):
            if split.txt2img[k] not in r:
                raise DataError(
                    f"{path}: relevant_images[{k}] does not contain the text's own image {split.txt2img[k]}"
                )
        return Relevance(images)
    by_image = None
    if "relevant_texts" in data:
        by_image = _index_lists(path, data, "relevant_texts", n_img, n_txt, f"images in {split.source}")
    benchmark = data.get("benchmark")
    return Relevance(images, by_image, benchmark if isinstance(benchmark, str) else None)


def load_relevance(path: str | Path, split: _Split) -> list[list[int]]:
    """The text->image lists of a relevance file (:func:`load_relevance_file`), one per text."""
    return load_relevance_file(path, split).images

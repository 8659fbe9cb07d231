"""Searching an index (``vlp search``): by text with the checkpoint's text tower, optionally re-ranked
by its ITM head, or by image ("more like this") with the image tower; the hits typed, for the
command line and any other caller (:class:`Searcher`, :class:`Hit`). An index built with an ONNX
export (``vlp index --onnx``) is searched with that export's towers under onnxruntime
(:class:`~vlp.search.onnx_embedder.OnnxEmbedder`: no ITM head, so no re-rank) unless a checkpoint
is given.

Text: the query's ITC feature (:meth:`~vlp.api.VLPModel.encode_text`, normalised) against every
row, the ``top`` highest cosines (:mod:`vlp.search.ranking`). ``rerank_itm=K`` follows ALBEF's
retrieval evaluation (:mod:`vlp.eval.retrieval`, ``eval.score=itm``): the top K by ITC are scored by
the ITM head's match logit (:meth:`~vlp.api.VLPModel.itm_score` with ``logit=True``) and put first in
the order of that logit (ties in ITC order); the rest follow in ITC order, without an ITM score.
Image: the image's feature through the same :class:`~vlp.search.embedder.ImageEmbedder` path the
index was built with, image-image cosine.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass
from typing import Optional, Union

import numpy as np

from vlp.api import ImageLike, UnsupportedKind, VLPModel
from vlp.api.inputs import image_tensor
from vlp.errors import ConfigError
from vlp.search.embedder import ImageEmbedder, ModelEmbedder
from vlp.search.index_format import ImageIndex, open_index
from vlp.search.onnx_embedder import OnnxEmbedder, export_of
from vlp.search.photo_folder import shown_path
from vlp.search.ranking import cosine_scores, top_k

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Hit:
    """One result: ``rank`` (1 = best), ``row`` of the index, ``path`` (the image file), ``itc``
    (cosine to the query) and ``itm`` (the ITM match logit of a re-ranked hit, else None)."""

    rank: int
    row: int
    path: str
    itc: float
    itm: Optional[float] = None

    def to_json(self) -> dict:
        """The hit as a JSON-ready dict (what ``vlp search --json`` prints a list of)."""
        return asdict(self)


def check_width(index: ImageIndex, width: int, what: str) -> None:
    """Refuse (:class:`~vlp.errors.ConfigError`) a query feature of another width than the rows."""
    if width != index.embed_dim:
        raise ConfigError(
            f"{what} gives {width}-dim features, but the index {index.folder} holds {index.embed_dim}-dim ones "
            f"(built with {index.meta.get('checkpoint')}); search it with the checkpoint that built it"
        )


def _hits(index: ImageIndex, rows: np.ndarray, scores: np.ndarray, itm: Optional[np.ndarray] = None) -> list[Hit]:
    n_itm = 0 if itm is None else len(itm)
    return [
        Hit(
            k + 1,
            int(r),
            index.file(int(r)),
            float(scores[r]),
            float(itm[k]) if itm is not None and k < n_itm else None,
        )
        for k, r in enumerate(rows)
    ]


def rerank_refusal(export: os.PathLike | str, exported_from: Optional[str]) -> ConfigError:
    """The error of ``--rerank-itm`` with no PyTorch checkpoint but the ONNX export ``export``."""
    origin = f" (it was exported from {exported_from})" if exported_from else ""
    return ConfigError(
        f"--rerank-itm needs the ITM head of a PyTorch ALBEF checkpoint, and the ONNX export {export} holds "
        f"the ITC towers only{origin}: give --checkpoint RUN"
    )


def search_text(
    index: ImageIndex, model: Union[VLPModel, OnnxEmbedder], query: str, top: int = 10, rerank_itm: int = 0
) -> list[Hit]:
    """The ``top`` rows of ``index`` for the text ``query`` (module doc; ``rerank_itm``: how many of
    the ITC top to re-rank by ITM, 0: none) with the text tower of ``model`` (a :class:`VLPModel`,
    or an :class:`~vlp.search.onnx_embedder.OnnxEmbedder`'s export). An empty query, or a model
    without ITM head asked to re-rank, raises :class:`~vlp.errors.ConfigError`."""
    if not query.strip():
        raise ConfigError("the query is empty: give a text to search for (or --image PATH)")
    q = model.encode_text([query])[0].numpy()
    tower = model.label if isinstance(model, OnnxEmbedder) else model.source.get("checkpoint", "the model")
    check_width(index, len(q), f"the text tower of {tower}")
    scores = cosine_scores(index.features, q)
    rows = top_k(scores, max(top, rerank_itm))
    if not rerank_itm:
        return _hits(index, rows[:top], scores)
    if isinstance(model, OnnxEmbedder):
        raise rerank_refusal(model.folder, model.meta()["exported_from"])
    head = rows[:rerank_itm]
    try:
        itm = model.itm_score([index.file(int(r)) for r in head], [query] * len(head), logit=True).numpy()
    except UnsupportedKind as e:
        raise ConfigError(f"--rerank-itm: {e}") from None
    order = np.lexsort((np.arange(len(head)), -itm))
    return _hits(index, np.concatenate([head[order], rows[rerank_itm:]])[:top], scores, itm[order])


def search_image(index: ImageIndex, embedder: ImageEmbedder, image: ImageLike, top: int = 10) -> list[Hit]:
    """The ``top`` rows of ``index`` closest to ``image`` (a path or PIL image) by image-image cosine,
    its feature from ``embedder`` (preprocessed as the index's images were). An unreadable image
    raises :class:`~vlp.errors.BadImage`."""
    pre = embedder.preprocessor
    pixels = image_tensor(image, pre.image_transform(), pre.min_side, "query image")
    q = embedder.embed_images(pixels[None])[0].float().numpy()
    check_width(index, len(q), "the image encoder")
    scores = cosine_scores(index.features, q)
    return _hits(index, top_k(scores, top), scores)


class Searcher:
    """An index with the checkpoint (or ONNX export) that queries it: :meth:`text` and :meth:`image`
    searches. ``note``: a line worth showing (the checkpoint's weights, or the export's image graph,
    differ from those that built the index), else None."""

    def __init__(self, index: ImageIndex, embedder: Union[ModelEmbedder, OnnxEmbedder]) -> None:
        self.index, self.embedder = index, embedder
        self.text_model = embedder.model if isinstance(embedder, ModelEmbedder) else embedder
        check_width(index, embedder.embed_dim, embedder.label)
        built_by = index.meta.get("embedder") or {}
        built = built_by.get("weights_sha256" if isinstance(embedder, ModelEmbedder) else "image_encoder_sha256")
        self.note = None
        if built is not None and built != embedder.sha256:
            self.note = (
                f"the index {index.folder} was built with other weights "
                f"({index.meta.get('checkpoint') or built_by.get('export')}); "
                f"its images were embedded by another image tower than {embedder.label}'s"
            )

    @classmethod
    def open(
        cls, index: str | os.PathLike | ImageIndex, checkpoint: Optional[str] = None, device: Optional[str] = None
    ) -> Searcher:
        """The index folder ``index`` (:func:`~vlp.search.index_format.open_index`; or an opened one) and
        the model of ``checkpoint`` on ``device``; without ``checkpoint``, the one recorded in the
        index's meta, or the ONNX export that built it (:func:`~vlp.search.onnx_embedder.export_of`)."""
        opened = index if isinstance(index, ImageIndex) else open_index(index)
        export = export_of(opened.meta)
        if checkpoint is None and export is not None:
            return cls(opened, OnnxEmbedder.load(export, device))
        source = checkpoint or opened.meta.get("checkpoint")
        if not source:
            raise ConfigError(f"{opened.folder}: the index names no checkpoint; give --checkpoint")
        return cls(opened, ModelEmbedder.load(source, device))

    def text(self, query: str, top: int = 10, rerank_itm: int = 0) -> list[Hit]:
        """:func:`search_text` with this searcher's model."""
        return search_text(self.index, self.text_model, query, top, rerank_itm)

    def image(self, image: ImageLike, top: int = 10) -> list[Hit]:
        """:func:`search_image` with this searcher's image tower."""
        return search_image(self.index, self.embedder, image, top)


def format_hits(hits: list[Hit]) -> str:
    """The hits as a table: rank, the ITM logit (re-ranked searches), the ITC cosine (4 decimals)
    and the path (relative to the working folder when it lies below it)."""
    itm = any(h.itm is not None for h in hits)
    lines = [f"{'rank':>4}  {'itm':>8}  {'itc':>7}  path" if itm else f"{'rank':>4}  {'itc':>7}  path"]
    for h in hits:
        score = f"{'' if h.itm is None else f'{h.itm:.4f}':>8}  " if itm else ""
        lines.append(f"{h.rank:>4}  {score}{h.itc:>7.4f}  {shown_path(h.path)}")
    return "\n".join(lines)


def run_search(
    index: str,
    query: Optional[str] = None,
    top: int = 10,
    checkpoint: Optional[str] = None,
    image: Optional[str] = None,
    rerank_itm: int = 0,
    as_json: bool = False,
    device: Optional[str] = None,
) -> str:
    """``vlp search``: what it prints (the table, or ``as_json`` the JSON list of hits). The
    arguments and the index are checked before the model loads."""
    if image is not None and query:
        raise ConfigError("give a query text or --image PATH, not both")
    if image is None and query is None:
        raise ConfigError("give a query text (or --image PATH)")
    if top < 1 or rerank_itm < 0:
        raise ConfigError(f"--top {top}, --rerank-itm {rerank_itm}: expected --top >= 1 and --rerank-itm >= 0")
    if image is not None and rerank_itm:
        raise ConfigError("--rerank-itm re-ranks text queries (ITM scores an image and a text); not with --image")
    if query is not None and not query.strip():
        raise ConfigError("the query is empty: give a text to search for (or --image PATH)")
    opened = open_index(index)
    export = export_of(opened.meta)
    if rerank_itm and checkpoint is None and export is not None:
        raise rerank_refusal(export, opened.meta["embedder"].get("exported_from"))
    searcher = Searcher.open(opened, checkpoint, device)
    if searcher.note:
        logger.warning(f"vlp search: note: {searcher.note}")
    hits = searcher.image(image, top) if image is not None else searcher.text(query or "", top, rerank_itm)
    return json.dumps([h.to_json() for h in hits], indent=1) if as_json else format_hits(hits)

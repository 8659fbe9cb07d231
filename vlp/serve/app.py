"""What ``vlp serve``'s page asks of an index, without HTTP: the searches (:mod:`vlp.search`'s own
ranking, the hits exactly ``vlp search --json``'s), an index image's file, and the per-word Grad-CAM
picture of a query over one image (``vlp explain``'s, :func:`vlp.heat_pictures.plot_word_heatmaps`).

Every failure the page should show is an :class:`ApiError` (an HTTP status and one line); the model
is used by one request at a time (Grad-CAM hooks the model; pyplot is not thread-safe).
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, Mapping, Optional

from vlp.errors import CheckpointError, ConfigError, DataError
from vlp.pictures import RunStep
from vlp.search import Hit, ModelEmbedder, Searcher
from vlp.search.photo_folder import shown_path

logger = logging.getLogger(__name__)

#: the most hits one search returns (the page's grid), and the most an ITM re-rank scores
MAX_TOP, MAX_RERANK = 500, 200
#: how many Grad-CAM pictures are kept in memory (a hit opened again is not recomputed)
HEATMAP_CACHE = 32


class ApiError(Exception):
    """A request the page answers with ``status`` and the one-line ``message`` (JSON ``{"error": ...}``)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def int_param(params: Mapping[str, str], name: str, default: Optional[int], lo: int, hi: int) -> int:
    """The integer query parameter ``name`` of ``params`` (``default`` when absent; None: required),
    within [lo, hi]; else :class:`ApiError` 400 naming it."""
    raw = params.get(name)
    if raw is None or raw == "":
        if default is None:
            raise ApiError(400, f"{name}: missing; expected an integer from {lo} to {hi}")
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ApiError(400, f"{name}={raw!r}: expected an integer from {lo} to {hi}") from None
    if not lo <= value <= hi:
        raise ApiError(400, f"{name}={value}: expected an integer from {lo} to {hi}")
    return value


class SearchApp:
    """An opened :class:`~vlp.search.Searcher` (index and model, loaded once) and what the page asks
    of it. ``layer``: the fusion layer of the Grad-CAM maps (None: the middle one, as ``vlp explain``)."""

    def __init__(self, searcher: Searcher, layer: Optional[int] = None) -> None:
        self.searcher, self.layer = searcher, layer
        self.index = searcher.index
        embedder = searcher.embedder
        # an index of --onnx searched by its export: no PyTorch model, so no heat maps (nor ITM)
        self.model = embedder.model if isinstance(embedder, ModelEmbedder) else None
        self.lock = threading.Lock()
        self.heatmaps: OrderedDict[tuple[int, str], bytes] = OrderedDict()
        self.no_heatmap = self._heatmap_check()
        self.shows = RunStep.of_checkpoint(embedder.folder) if self.model is not None else None

    @classmethod
    def open(
        cls, index: str | os.PathLike, checkpoint: Optional[str] = None, device: Optional[str] = None, **kw: Any
    ) -> SearchApp:
        """:meth:`Searcher.open <vlp.search.Searcher.open>` (the user errors of a bad index or
        checkpoint raised as they are), wrapped; ``kw``: ``layer``."""
        searcher = Searcher.open(index, checkpoint, device)
        if searcher.note:
            logger.warning(f"vlp serve: note: {searcher.note}")
        return cls(searcher, **kw)

    def _heatmap_check(self) -> Optional[str]:
        """None when the model draws Grad-CAM maps at ``layer``; else why not (a model without a
        fusion encoder: one line, the page says it). A ``layer`` the model does not have raises
        :class:`~vlp.errors.ConfigError`."""
        from vlp.api import UnsupportedKind, gradcam_layer

        if self.model is None:
            return (
                f"no Grad-CAM heat maps with {self.searcher.embedder.label} (it holds no fusion encoder): "
                "give vlp serve --checkpoint RUN, the checkpoint it was exported from"
            )
        try:
            self.layer = gradcam_layer(self.model, self.layer)
        except UnsupportedKind as e:
            return f"no Grad-CAM heat maps with this checkpoint: {e}"
        except ValueError as e:
            raise ConfigError(f"--layer {self.layer}: {e}") from None
        return None

    def info(self) -> dict[str, Any]:
        """What the page shows of the index and the model (its header; paths as ``vlp search`` prints
        them: relative to the working folder when below it)."""
        return {
            "index": shown_path(self.index.folder),
            "count": len(self.index),
            "root": shown_path(self.index.root),
            "checkpoint": shown_path(self.searcher.embedder.folder),
            "kind": self.model.kind if self.model is not None else self.searcher.embedder.meta()["kind"],
            "heatmap": self.no_heatmap is None,
            "heatmap_note": self.no_heatmap,
            "layer": self.layer,
            "note": self.searcher.note,
            "max_top": MAX_TOP,
            "max_rerank": MAX_RERANK,
        }

    def search(self, params: Mapping[str, str]) -> dict[str, Any]:
        """``q`` (the text), ``top`` (default 10) and ``rerank`` (the ITC top K re-ranked by ITM,
        default 0): :meth:`Searcher.text <vlp.search.Searcher.text>`'s hits."""
        q = params.get("q", "")
        top = int_param(params, "top", 10, 1, MAX_TOP)
        rerank = int_param(params, "rerank", 0, 0, MAX_RERANK)
        if not q.strip():
            raise ApiError(400, "the query is empty: type a text to search for")
        return self._answer({"q": q, "top": top, "rerank": rerank}, lambda: self.searcher.text(q, top, rerank))

    def similar(self, params: Mapping[str, str]) -> dict[str, Any]:
        """``row`` (an image of the index) and ``top``: :meth:`Searcher.image
        <vlp.search.Searcher.image>`'s hits for that image's file ("more like this")."""
        row = int_param(params, "row", None, 0, len(self.index) - 1)
        top = int_param(params, "top", 10, 1, MAX_TOP)
        file = self.image_file(row)
        return self._answer(
            {"row": row, "top": top, "name": self.index.paths[row]}, lambda: self.searcher.image(file, top)
        )

    def _answer(self, asked: dict[str, Any], run: Any) -> dict[str, Any]:
        """``asked`` with the hits ``run()`` returns (each ``vlp search --json``'s dict and ``name``,
        its path relative to the indexed folder) and the milliseconds the search took."""
        t0 = time.perf_counter()
        with self.lock:
            try:
                hits: list[Hit] = run()
            except (ConfigError, DataError, CheckpointError) as e:
                raise ApiError(400, str(e)) from None
        ms = (time.perf_counter() - t0) * 1e3
        listed = [{**h.to_json(), "name": self.index.paths[h.row]} for h in hits]
        return {**asked, "hits": listed, "count": len(self.index), "ms": round(ms, 1)}

    def image_file(self, row: int) -> str:
        """The file of index row ``row``; :class:`ApiError` 404 when it is no longer on disk."""
        file = self.index.file(row)
        if not os.path.isfile(file):
            raise ApiError(
                404, f"the image file {file} (row {row} of the index) is missing: moved or deleted since it was indexed"
            )
        return file

    def image(self, params: Mapping[str, str]) -> Path:
        """The file of the index image ``row``: the only files the page serves besides its own."""
        return Path(self.image_file(int_param(params, "row", None, 0, len(self.index) - 1)))

    def heatmap(self, params: Mapping[str, str]) -> bytes:
        """The PNG of ``vlp explain``'s per-word Grad-CAM grid for the text ``q`` over index image
        ``row`` (the image, the mean over all tokens, one panel per word; ITM match in the title)."""
        row = int_param(params, "row", None, 0, len(self.index) - 1)
        q = params.get("q", "")
        if not q.strip():
            raise ApiError(400, "a heat map shows a text query over the image: the query is empty")
        if self.no_heatmap:
            raise ApiError(400, self.no_heatmap)
        file = self.image_file(row)
        key = (row, q)
        with self.lock:
            if key not in self.heatmaps:
                try:
                    self.heatmaps[key] = self._draw(file, q)
                except DataError as e:
                    raise ApiError(400, str(e)) from None
                while len(self.heatmaps) > HEATMAP_CACHE:
                    self.heatmaps.popitem(last=False)
            self.heatmaps.move_to_end(key)
            return self.heatmaps[key]

    def _draw(self, file: str, text: str) -> bytes:
        """Grad-CAM of (``file``, ``text``) drawn as ``vlp explain`` draws it, as PNG bytes."""
        from vlp.heat_pictures import explain_title, plot_word_heatmaps
        from vlp.preprocess.images import open_image

        model = self.model
        assert model is not None, "heatmap() refuses an app without a model (no_heatmap)"
        rgb = open_image(file, "image", min_side=model.preprocessor.min_side)
        result = model.explain(rgb, text, self.layer)
        with tempfile.TemporaryDirectory(prefix="vlp_serve_") as tmp:
            png = Path(tmp) / "explain.png"
            plot_word_heatmaps(
                rgb,
                result.tokens,
                result.maps,
                png,
                explain_title(text, result.itm_score, result.layer),
                shows=self.shows,
            )
            return png.read_bytes()

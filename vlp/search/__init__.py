"""Search your own photos by text (docs/search.md): ``vlp index`` embeds every image of a folder
into one memory-mapped index, ``vlp search`` ranks it for a text or an image.

    from vlp.search import Searcher
    s = Searcher.open("runs/index")            # the checkpoint recorded in the index
    for hit in s.text("a red circle", top=5):
        print(hit.rank, round(hit.itc, 3), hit.path)

Modules: :mod:`~vlp.search.index_format` (the files, :func:`open_index`),
:mod:`~vlp.search.photo_folder` (which files of a folder are images), :mod:`~vlp.search.embedder`
(the :class:`ImageEmbedder` protocol and the checkpoint-backed :class:`ModelEmbedder`),
:mod:`~vlp.search.onnx_embedder` (:class:`OnnxEmbedder`: a ``vlp export onnx`` folder under onnxruntime),
:mod:`~vlp.search.partial` (the resumable, atomic build folder), :mod:`~vlp.search.build`
(:func:`build_index`, ``vlp index``), :mod:`~vlp.search.ranking` (block cosines, top k),
:mod:`~vlp.search.query` (:class:`Searcher`, :class:`Hit`, ``vlp search``).
"""

from vlp.search.build import IndexReport, build_index, run_index
from vlp.search.embedder import ImageEmbedder, ModelEmbedder, checkpoint_folder
from vlp.search.index_format import FORMAT, FORMAT_VERSION, ImageIndex, open_index
from vlp.search.onnx_embedder import OnnxEmbedder
from vlp.search.photo_folder import IMAGE_EXTENSIONS, PhotoFolder, scan_folder
from vlp.search.query import Hit, Searcher, format_hits, run_search, search_image, search_text
from vlp.search.ranking import cosine_scores, top_k

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "IMAGE_EXTENSIONS",
    "Hit",
    "ImageEmbedder",
    "ImageIndex",
    "IndexReport",
    "ModelEmbedder",
    "OnnxEmbedder",
    "PhotoFolder",
    "Searcher",
    "build_index",
    "checkpoint_folder",
    "cosine_scores",
    "format_hits",
    "open_index",
    "run_index",
    "run_search",
    "scan_folder",
    "search_image",
    "search_text",
    "top_k",
]

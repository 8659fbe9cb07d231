"""Ground truth of a shapes world for the captions and images of any of its annotation files.

:class:`WorldTruth` reads ``scenes.json`` once and answers, for captions (by their exact text) and
images (by file name, which is unique in a world: ``{split}_{i:06d}.png``), whether each caption
is true of each image (:func:`~vlp.data.synthetic.predicates.caption_matches`) or how relevant it
is (:func:`~vlp.data.synthetic.relevance.caption_grade`). It is the oracle SRCL helper (an oracle
helper-feature cache stores this table) and marks the true false negatives of SRCL diagnostics.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from vlp.data.synthetic.captions import parse_caption
from vlp.data.synthetic.relevance import compute_graded_relevance, compute_relevance
from vlp.data.synthetic.scene import Scene, scene_from_dict
from vlp.errors import DataError

__all__ = ["WorldTruth"]


class WorldTruth:
    """The predicate of every caption text and the scene of every image of a shapes world."""

    def __init__(self, predicates: dict[str, dict[str, Any]], scenes: dict[str, Scene], source: str = "") -> None:
        self.predicates, self.scenes, self.source = predicates, scenes, source

    @classmethod
    def load(cls, root: str | Path) -> WorldTruth:
        """Read ``root/scenes.json`` (every split)."""
        path = Path(root) / "scenes.json"
        if not path.is_file():
            raise DataError(f"{path}: not found; is {root} a shapes world (`vlp make-world`)?")
        records = [r for rs in json.loads(path.read_text())["splits"].values() for r in rs]
        preds = {c["text"]: c["predicate"] for r in records for c in r["captions"]}
        scenes = {Path(r["image"]).name: scene_from_dict(r) for r in records}
        return cls(preds, scenes, str(path))

    def predicate(self, text: str) -> dict[str, Any]:
        """The predicate of a caption (exact text): the world's own from ``scenes.json``, else the
        text parsed by the grammar (captions drawn beyond the world's, e.g. by a caption mix)."""
        if text not in self.predicates:
            try:
                self.predicates[text] = parse_caption(text)
            except ValueError as e:
                raise DataError(f"{self.source}: caption {text!r} is not a shapes-world caption: {e}") from None
        return self.predicates[text]

    def scene(self, image: str | Path) -> Scene:
        """The scene of an image of the world (any path ending in its file name)."""
        try:
            return self.scenes[Path(image).name]
        except KeyError:
            raise DataError(f"{self.source}: image {image} is not an image of this world") from None

    def relevance(self, texts: Sequence[str], images: Sequence[str | Path], graded: bool = False) -> np.ndarray:
        """[len(texts), len(images)] float32: 1.0 where the caption is true of the image, else 0.0
        (``graded``: :func:`~vlp.data.synthetic.relevance.caption_grade` in [0, 1], 1.0 exactly
        where the caption is true). Identical predicates are evaluated once, vectorised."""
        preds = [self.predicate(t) for t in texts]
        scenes = [self.scene(i) for i in images]
        if graded:
            return compute_graded_relevance(preds, scenes)
        out = np.zeros((len(preds), len(scenes)), dtype=np.float32)
        for row, relevant in enumerate(compute_relevance(preds, scenes)):
            out[row, relevant] = 1.0
        return out

"""Ground truth of a shapes world for the captions and images of any of its annotation files.

:class:`WorldTruth` reads ``scenes.json`` once and answers, for captions (by their exact text) and
images (by file name, which is unique in a world: ``{split}_{i:06d}.png``), whether each caption
is true of each image (:func:`~vlp.world.predicates.caption_matches`) or how relevant it
is (:func:`~vlp.world.relevance.caption_grade`). It is the oracle SRCL helper (an oracle
helper-feature cache stores this table: :func:`run_cache_oracle_features`, ``vlp
cache-helper-features --oracle``) and marks the true false negatives of SRCL diagnostics.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import torch

from vlp.data.formats import load_pairs
from vlp.errors import DataError
from vlp.features.helper_cache import ORACLE_KINDS, cache_rows, index_features, write_cache
from vlp.features.store import refuse_existing
from vlp.world.captions import parse_caption
from vlp.world.relevance import compute_graded_relevance, compute_relevance
from vlp.world.scene import Scene, scene_from_dict

__all__ = ["WorldTruth", "noise_seed", "noisy_relevance", "run_cache_oracle_features"]


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
        (``graded``: :func:`~vlp.world.relevance.caption_grade` in [0, 1], 1.0 exactly
        where the caption is true). Identical predicates are evaluated once, vectorised."""
        preds = [self.predicate(t) for t in texts]
        scenes = [self.scene(i) for i in images]
        if graded:
            return compute_graded_relevance(preds, scenes)
        out = np.zeros((len(preds), len(scenes)), dtype=np.float32)
        for row, relevant in enumerate(compute_relevance(preds, scenes)):
            out[row, relevant] = 1.0
        return out


def noise_seed(seed: int, auc: float) -> int:
    """The generator seed of :func:`noisy_relevance`'s noise for ``seed`` at level ``auc``: both hashed
    together (numpy's ``SeedSequence`` of ``seed`` and the AUC in millionths), so every (seed, level)
    has a draw of its own."""
    return int(np.random.SeedSequence([seed, round(auc * 1_000_000)]).generate_state(1, dtype=np.uint64)[0] >> 1)


def noisy_relevance(relevance: np.ndarray, auc: float, seed: int = 0) -> np.ndarray:
    """An exact oracle's table corrupted to a helper of a given quality: ``Phi(r + sigma * z)``
    with ``z`` standard normal noise fixed per (caption, image) pair, drawn anew for every
    (``seed``, ``auc``) (:func:`noise_seed`: two levels of one seed are independent helpers, not one
    draw scaled), and ``sigma = 1 / (sqrt(2)
    Phi^-1(auc))``, so that the ROC-AUC of the result at telling relevant (``r = 1``) from
    irrelevant (``r = 0``) pairs is ``auc`` in expectation: ``P(1 + sigma z1 > sigma z0) =
    Phi(1 / (sigma sqrt 2))``. ``Phi`` (the normal CDF, monotone) keeps the values in (0, 1), as
    an oracle cache requires, without changing any ranking.

    ``relevance`` [n_texts, n_images] in {0, 1}; ``auc`` in (0.5, 1); returns float32 of the same
    shape, the same for the same ``seed`` and ``auc``."""
    if not 0.5 < auc < 1.0:
        raise ValueError(f"auc must be in (0.5, 1), got {auc}")
    if not np.isin(relevance, (0.0, 1.0)).all():
        raise ValueError("noisy_relevance corrupts an exact (0/1) relevance table")
    sigma = 1.0 / (2.0**0.5 * float(torch.special.ndtri(torch.tensor(auc, dtype=torch.float64))))
    gen = torch.Generator().manual_seed(noise_seed(seed, auc))
    z = torch.randn(relevance.shape, generator=gen, dtype=torch.float64)
    noisy = torch.special.ndtr(torch.from_numpy(relevance).double() + sigma * z)
    return noisy.clamp_(1e-7, 1 - 1e-7).float().numpy()


def run_cache_oracle_features(
    world_root: str | Path,
    data_files: Sequence[str | Path],
    out: str | Path,
    graded: bool = False,
    auc: Optional[float] = None,
    seed: int = 0,
) -> Path:
    """An oracle helper cache of ``data_files`` (annotation files over images of the shapes world
    at ``world_root``): the world's ground-truth relevance of every caption of the files to every
    image of them, ``relevance`` [n_texts, n_images] (1/0, or with ``graded``
    :func:`~vlp.world.relevance.caption_grade` in [0, 1]), with the row indices as
    features (:mod:`vlp.features.helper_cache`). ``auc``: the exact table corrupted by noise fixed per
    pair (``seed``) to a helper of that ROC-AUC (:func:`noisy_relevance`;
    kind ``oracle-noisy``). ``loss.srcl.helper_features`` may point at it like at any cache: the
    regulator then takes the relevance as the helper's cosine."""
    refuse_existing(out)
    if auc is not None and graded:
        raise DataError("an oracle cache is graded or corrupted to an AUC (from the exact table), not both")
    samples = load_pairs([str(d) for d in data_files])
    paths, keys, texts = cache_rows(samples)
    table = WorldTruth.load(world_root).relevance(texts, [paths[k] for k in keys], graded)
    kind = ORACLE_KINDS[1] if graded else ORACLE_KINDS[0]
    meta: dict[str, Any] = {
        "kind": kind,
        "world": str(Path(world_root).resolve()),
        "data": [str(d) for d in data_files],
    }
    if auc is not None:
        table = noisy_relevance(table, auc, seed)
        meta.update(kind=ORACLE_KINDS[2], target_auc=auc, noise_seed=seed)
    relevance = torch.from_numpy(table)
    return write_cache(out, keys, index_features(len(keys)), texts, index_features(len(texts)), meta, relevance)

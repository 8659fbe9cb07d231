"""The helper-feature cache of ``loss.srcl.helper=open_clip:...``, built once into the run directory
(:func:`open_clip_helper_cache`), and the checks that a cache is the configured helper's
(:func:`check_cache_of_helper`) and agrees with ``loss.srcl.helper_init`` (:func:`check_helper_init`)."""

from __future__ import annotations

import logging
from pathlib import Path

from vlp.config import PretrainConfig
from vlp.dist import launch_rank
from vlp.errors import ConfigError
from vlp.features.cache_writer import write_feature_cache
from vlp.features.encoders import open_clip_encoder
from vlp.features.helper_cache import HelperCache
from vlp.models.open_clip_helper import CACHE_HELPER_KEY, require_weights

logger = logging.getLogger(__name__)

#: the folder of ``output_dir`` that ``loss.srcl.helper=open_clip:...`` caches the helper's features in
OPEN_CLIP_CACHE = "helper_features_open_clip"


def check_helper_init(cache: HelperCache, init: str, key: str = "loss.srcl.helper_features") -> None:
    """The cache must agree with ``loss.srcl.helper_init``: a randomly initialised helper's
    (``index.json`` ``helper_init: random``) only with ``random``, a helper with weights only with
    ``pretrained`` (an oracle cache with either); one :class:`ConfigError` naming ``key`` otherwise."""
    if cache.helper_init in (None, init):
        return
    if cache.helper_init == "random":
        raise ConfigError(
            f"config key '{key}': {cache.path} holds the features of a randomly initialised helper "
            f"({cache.meta.get(CACHE_HELPER_KEY)}, index.json helper_init: random), which weights negatives by noise; "
            "cache a helper with weights, or set loss.srcl.helper_init=random (tests)"
        )
    raise ConfigError(
        f"config keys '{key}'/'loss.srcl.helper_init': loss.srcl.helper_init={init}, but {cache.path} holds "
        f"the features of a helper with weights ({cache.meta.get(CACHE_HELPER_KEY)}); leave loss.srcl.helper_init=pretrained"
    )


def check_cache_of_helper(cache: HelperCache, spec: str, key: str) -> None:
    """The cache ``key`` names must hold the features of the open_clip helper ``spec``
    (``loss.srcl.helper``): one :class:`ConfigError` naming both keys otherwise."""
    from vlp.models.open_clip_helper import parse_open_clip_spec

    if not parse_open_clip_spec(spec).built(cache.meta):
        raise ConfigError(
            f"config keys '{key}'/'loss.srcl.helper': {cache.path} holds the features of "
            f"{cache.meta.get(CACHE_HELPER_KEY)!r}, not of {spec!r}; point {key} at that helper's cache, or set "
            "loss.srcl.helper=null to use this one"
        )


def open_clip_helper_cache(cfg: PretrainConfig, poll_s: float = 2.0) -> HelperCache:
    """The helper-feature cache of ``loss.srcl.helper=open_clip:...``, used exactly as
    ``loss.srcl.helper_features``. An open_clip helper cannot run live on the training batch (that
    carries BERT token ids and vlp-transformed images; open_clip needs its own tokenizer and
    preprocessing of the raw data), so its features of ``data.train`` are computed once, before the
    first step, into ``<output_dir>/helper_features_open_clip`` (:func:`open_clip_encoder`).
    An existing cache (a resumed run) is reused if the same helper built it. With several processes
    the main one (launch rank 0) builds it and the others wait until it appears (it appears whole:
    the cache writer renames a finished folder)."""
    import time

    s, d = cfg.loss.srcl, cfg.data
    require_weights(str(s.helper), s.helper_init, "loss.srcl.helper")  # a reused cache too
    if d.format != "json":
        raise ConfigError(
            f"config key 'loss.srcl.helper': an open_clip helper ({s.helper}) is cached here from annotation files "
            f"only, not data.format={d.format}; build the cache with `vlp cache-helper-features --helper {s.helper} "
            "--data ENTRIES` (data.train's shard entries) and set loss.srcl.helper_features instead"
        )
    out = Path(cfg.output_dir) / OPEN_CLIP_CACHE
    rank = launch_rank()[0]
    if rank == 0 and not out.exists():
        logger.info(f"loss.srcl.helper={s.helper}: caching its features of data.train into {out}")
        encoder = open_clip_encoder(str(s.helper), key="loss.srcl.helper", init=s.helper_init)
        write_feature_cache(
            out, d.train, encoder, d.image_root, num_workers=d.num_workers, show_progress=cfg.train.progress
        )
    elif not out.exists():
        logger.warning(f"rank {rank}: waiting for rank 0 to cache the open_clip helper's features into {out}")
        while not out.exists():
            time.sleep(poll_s)
    cache = HelperCache.load(out)
    if cache.meta.get(CACHE_HELPER_KEY) != s.helper:
        raise ConfigError(
            f"config key 'loss.srcl.helper': {out} holds the features of {cache.meta.get(CACHE_HELPER_KEY)!r}, not of "
            f"{s.helper!r}; remove that folder (it is rebuilt) or choose another output_dir"
        )
    check_helper_init(cache, s.helper_init, "loss.srcl.helper")
    return cache

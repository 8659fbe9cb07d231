"""The SRCL and LTD parts of a training objective, assembled from the run's config: the LTD latent
targets and reconstruction head, the SRCL regulator with its helper (a feature cache, an open_clip
helper cached into the run, or a live vlp checkpoint)."""

from __future__ import annotations

from typing import Optional

import torch

from vlp.checkpoint import image_size, open_checkpoint
from vlp.config import LTDConfig, PretrainConfig
from vlp.errors import ConfigError
from vlp.features.helper_cache import HelperCache
from vlp.features.open_clip_cache import check_cache_of_helper, check_helper_init, open_clip_helper_cache
from vlp.features.targets import LatentTargets
from vlp.models.open_clip_helper import is_open_clip_spec, require_weights
from vlp.tasks.reconstruction import Reconstruction
from vlp.tasks.regulation import SRCLRegulator, helper_span


def load_targets_for(ltd: LTDConfig) -> Optional[LatentTargets]:
    """The LTD latent targets (None unless ``loss.ltd`` decodes latent targets)."""
    if ltd.mode == "off" or ltd.decoder != "latent":
        return None
    if not ltd.targets:  # the config refuses this already (PretrainConfig); a caller's own LTDConfig may not
        raise ConfigError("config key 'loss.ltd.targets' is unset: LTD needs a file from `vlp make-targets`")
    return LatentTargets.load(ltd.targets, ltd.encoder)


def build_reconstruction(
    ltd: LTDConfig, embed_dim: int, targets: Optional[LatentTargets], vocab_size: int
) -> Optional[Reconstruction]:
    """The LTD / ITD head and multiplier of ``loss.ltd`` (None when off)."""
    if ltd.mode == "off":
        return None
    return Reconstruction(ltd, embed_dim, targets.dim if targets is not None else None, vocab_size)


def build_regulator(
    cfg: PretrainConfig, finetune: bool = False
) -> tuple[Optional[SRCLRegulator], Optional[HelperCache]]:
    """The SRCL regulator of a run (None for ``loss.regulation: none``) and the helper-feature
    cache it reads (None in live-helper mode and when the helper is not used, e.g. fine-tuning).
    An oracle cache (``vlp.lab.oracle.run_cache_oracle_features``) hands its relevance table
    to the regulator."""
    mode, s = cfg.loss.regulation, cfg.loss.srcl
    if mode == "none":
        return None, None
    cache, helper, dim = None, None, 1
    if helper_span(s, cfg.train.steps, finetune) > 0:
        if s.helper_features:
            cache = HelperCache.load(s.helper_features)
            if is_open_clip_spec(s.helper):  # the cache of this very helper, built before the run
                check_cache_of_helper(cache, str(s.helper), "loss.srcl.helper_features")
            check_helper_init(cache, s.helper_init)
            dim = cache.dim
        elif is_open_clip_spec(s.helper):  # not live: cached once into output_dir (open_clip_helper_cache)
            cache = open_clip_helper_cache(cfg)
            dim = cache.dim
        elif s.helper:
            if s.helper_init != "pretrained":
                raise ConfigError(
                    f"config key 'loss.srcl.helper_init': {s.helper_init} is for an open_clip helper without "
                    f"weights; the vlp checkpoint {s.helper} has its own (leave loss.srcl.helper_init=pretrained)"
                )
            opened = open_checkpoint(s.helper, torch.device("cpu"))
            helper, hcfg = opened.model, opened.pretrain_config
            if image_size(hcfg) != image_size(cfg) or hcfg.model.text.tokenizer != cfg.model.text.tokenizer:
                raise ConfigError(
                    f"config key 'loss.srcl.helper': the live helper {s.helper} must take the same "
                    f"images ({image_size(hcfg)} px vs {image_size(cfg)} px) and tokenizer as the model"
                )
            dim = hcfg.model.embed_dim
        else:
            raise ConfigError(
                f"config key 'loss.srcl.helper_features': loss.regulation={mode} needs helper features: "
                "a cache from `vlp cache-helper-features` (or loss.srcl.helper for a live helper)"
            )
    relevance = cache.relevance if cache is not None else None  # an oracle cache: the ground-truth table
    return SRCLRegulator(s, mode, cfg.train.steps, cfg.model.queue_size, dim, finetune, helper, relevance), cache


def check_helper_weights(cfg: PretrainConfig) -> None:
    """Before any work: an open_clip ``loss.srcl.helper`` of a regulated run names weights, or
    none with ``loss.srcl.helper_init=random`` (:func:`~vlp.models.open_clip_helper.require_weights`)."""
    s = cfg.loss.srcl
    if cfg.loss.regulation != "none" and is_open_clip_spec(s.helper):
        require_weights(str(s.helper), s.helper_init, "loss.srcl.helper")

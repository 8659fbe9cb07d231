"""Typed run configuration: dataclass schema, YAML files and dotted command-line overrides.

A config is built as ``defaults <- YAML file <- overrides`` where overrides look like
``train.steps=50 model.vision.depth=2``. Unknown keys and wrong types raise
:class:`ConfigError` naming the offending key and where it came from.

The schema is split by concept, one module each; this package re-exports every public name, so
``from vlp.config import X`` is the way to import them:

- :mod:`vlp.config.load`: YAML loading, dotted overrides, dict/YAML round trips, presets
  (``load_config``, ``apply_overrides``, ``from_dict``, ``to_dict``, ``to_yaml``, ``resolved``)
- :mod:`vlp.config.presets`: the one preset registry (``Preset``, ``PRESETS``; the tower presets
  ``VISION_PRESETS``/``TEXT_PRESETS``)
- :mod:`vlp.config.model`: image/text towers, the dual encoder, ``preset_model_config``
- :mod:`vlp.config.data`: pretraining data, image augmentation, the bad-sample policy
- :mod:`vlp.config.loss`: loss weights, contrastive loss zoo, SRCL, LTD/ITD and its multiplier
- :mod:`vlp.config.train`: training, weight averaging, retrieval evaluation
- :mod:`vlp.config.pretrain`: ``PretrainConfig`` (every section, cross-section rules)
- :mod:`vlp.config.finetune`: ``FinetuneConfig`` and its sections, ``load_finetune_config``
"""

from vlp.config.data import BadSampleConfig, DataConfig, ImageConfig
from vlp.config.finetune import (
    FinetuneConfig,
    FinetuneDataConfig,
    NLVRConfig,
    VQAConfig,
    load_finetune_config,
)
from vlp.config.load import apply_overrides, from_dict, load_config, resolved, to_dict, to_yaml
from vlp.config.loss import (
    ContrastiveConfig,
    LossConfig,
    LossTraits,
    LTDConfig,
    MultiplierConfig,
    SRCLConfig,
)
from vlp.config.model import DualConfig, ModelConfig, TextConfig, VisionConfig, preset_model_config
from vlp.config.presets import (
    PRESETS,
    TEXT_PRESETS,
    VISION_PRESETS,
    Preprocessing,
    Preset,
    Weights,
    list_presets,
)
from vlp.config.pretrain import PretrainConfig
from vlp.config.train import AverageConfig, EvalConfig, TrainConfig
from vlp.errors import ConfigError

__all__ = [
    "PRESETS",
    "TEXT_PRESETS",
    "VISION_PRESETS",
    "AverageConfig",
    "BadSampleConfig",
    "ConfigError",
    "ContrastiveConfig",
    "DataConfig",
    "DualConfig",
    "EvalConfig",
    "FinetuneConfig",
    "FinetuneDataConfig",
    "ImageConfig",
    "LTDConfig",
    "LossConfig",
    "LossTraits",
    "ModelConfig",
    "MultiplierConfig",
    "NLVRConfig",
    "Preprocessing",
    "Preset",
    "PretrainConfig",
    "SRCLConfig",
    "TextConfig",
    "TrainConfig",
    "VQAConfig",
    "VisionConfig",
    "Weights",
    "apply_overrides",
    "from_dict",
    "list_presets",
    "load_config",
    "load_finetune_config",
    "preset_model_config",
    "resolved",
    "to_dict",
    "to_yaml",
]

"""vlp: ALBEF-style vision-language pretraining, fine-tuning and evaluation."""

import logging

from vlp.version import __version__


class _NoDeepSpeedAcceleratorWarning(logging.Filter):
    """accelerate imports DeepSpeed whenever it is installed, and DeepSpeed then logs "Setting
    accelerator to CPU. If you have GPU or other accelerator, we were unable to detect it." on a
    machine without a GPU: on every vlp command, DeepSpeed config or not. vlp reports the device a
    run uses itself; this drops that one message from DeepSpeed's logger and nothing else."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Setting accelerator to CPU")


logging.getLogger("DeepSpeed").addFilter(_NoDeepSpeedAcceleratorWarning())

__all__ = [
    "Preset",
    "VLPModel",
    "__version__",
    "create_model_and_transforms",
    "get_tokenizer",
    "list_models",
    "list_pretrained",
    "PRESETS",
    "load_plugins",
]


def __getattr__(name: str):
    """``from vlp import VLPModel`` imports the inference API (torch, transformers) only when asked;
    ``list_pretrained`` the model zoo (:mod:`vlp.interop.zoo`); ``create_model_and_transforms``,
    ``get_tokenizer`` and ``list_models`` the presets (:mod:`vlp.factory`); ``Preset`` and ``PRESETS`` the preset
    registry they all read (:mod:`vlp.config.presets`)."""
    if name == "VLPModel":
        from vlp.api import VLPModel

        return VLPModel
    if name == "load_plugins":  # outside code's registrations, for a Python session (vlp.plugins)
        from vlp.plugins import load_plugins

        return load_plugins
    if name == "list_pretrained":
        from vlp.interop.zoo import list_pretrained

        return list_pretrained
    if name in ("Preset", "PRESETS"):
        from vlp.config import presets

        return getattr(presets, name)
    if name in ("create_model_and_transforms", "get_tokenizer", "list_models"):
        from vlp import factory

        return getattr(factory, name)
    raise AttributeError(f"module 'vlp' has no attribute {name!r}")

"""vlp: ALBEF-style vision-language pretraining, fine-tuning and evaluation."""

from vlp.version import __version__

__all__ = ["VLPModel", "__version__"]


def __getattr__(name: str):
    """``from vlp import VLPModel`` imports the inference API (torch, transformers) only when asked."""
    if name == "VLPModel":
        from vlp.api import VLPModel

        return VLPModel
    raise AttributeError(f"module 'vlp' has no attribute {name!r}")

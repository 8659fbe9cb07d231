"""vlp: ALBEF-style vision-language pretraining, fine-tuning and evaluation."""

from vlp.version import __version__

__all__ = ["VLPModel", "__version__", "list_pretrained"]


def __getattr__(name: str):
    """``from vlp import VLPModel`` imports the inference API (torch, transformers) only when asked;
    ``list_pretrained`` the model zoo (:mod:`vlp.interop.zoo`)."""
    if name == "VLPModel":
        from vlp.api import VLPModel

        return VLPModel
    if name == "list_pretrained":
        from vlp.interop.zoo import list_pretrained

        return list_pretrained
    raise AttributeError(f"module 'vlp' has no attribute {name!r}")

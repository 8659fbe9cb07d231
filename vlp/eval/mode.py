"""Evaluation mode for every evaluation entry point (retrieval, VQA ranking, NLVR2 accuracy,
zero-shot retrieval, :class:`vlp.api.VLPModel`).

Dropout (and anything else that behaves differently in training) must be off while scoring, and
the caller's model must come back exactly as it was: a training loop keeps training, an inference
model stays in eval mode, and a model that was partly in eval mode (e.g. a frozen tower) keeps
that too.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from torch import nn


@contextmanager
def evaluating(module: nn.Module) -> Iterator[nn.Module]:
    """``module.eval()`` inside the block; on exit (also on an exception) every submodule gets back
    its own previous ``training`` flag."""
    flags = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield module
    finally:
        for m, was_training in flags:
            m.training = was_training

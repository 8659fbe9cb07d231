"""What the :class:`~vlp.api.VLPModel` methods take and how they run: the image and text argument
types, one item as a list of one, and the no-gradient, eval-mode wrapper of an inference method."""

from __future__ import annotations

import functools
import os
from typing import Any, Callable, Sequence, TypeVar, Union, cast

import torch
from PIL import Image

from vlp.eval.mode import evaluating

#: what an image argument may be: a path, a PIL image, or a preprocessed tensor [3, H, W]
ImageLike = Union[str, os.PathLike, Image.Image, torch.Tensor]
Images = Union[ImageLike, Sequence[ImageLike]]
Texts = Union[str, Sequence[str]]

F = TypeVar("F", bound=Callable[..., Any])


def inference(method: F) -> F:
    """A :class:`~vlp.api.VLPModel` method (or per-kind action taking the VLPModel first) run without
    gradients and in eval mode (the model's modes are restored after: a model someone put in train
    mode to fine-tune further stays in train mode)."""

    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with torch.no_grad(), evaluating(self.model):
            return method(self, *args, **kwargs)

    return cast(F, run)


def as_list(x, single: tuple) -> list:
    """A single item (of the ``single`` types, or a 3-d tensor) as a one-element list; else ``list(x)``."""
    if isinstance(x, single) or (isinstance(x, torch.Tensor) and x.dim() == 3):
        return [x]
    return list(x)

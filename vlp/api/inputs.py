"""What the :class:`~vlp.api.VLPModel` methods take and how they run: the image and text argument
types, one item as a list of one, the no-gradient, eval-mode wrapper of an inference function, and
the evaluation preprocessing of a loaded model (:func:`pixel_values`, :func:`image_batches`,
:func:`tokenize`; one image: :func:`image_tensor`)."""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Sequence, TypeVar, Union, cast

import torch
from PIL import Image

from vlp.eval.mode import evaluating
from vlp.preprocess.images import open_image, to_rgb, upscale_tiny
from vlp.preprocess.transforms import tokenize as tokenize_captions

if TYPE_CHECKING:
    from vlp.api import VLPModel

#: what an image argument may be: a path, a PIL image, or a preprocessed tensor [3, H, W]
ImageLike = Union[str, os.PathLike, Image.Image, torch.Tensor]
Images = Union[ImageLike, Sequence[ImageLike]]
Texts = Union[str, Sequence[str]]

F = TypeVar("F", bound=Callable[..., Any])


def inference(method: F) -> F:
    """An inference function taking the :class:`~vlp.api.VLPModel` first (a VLPModel method) run
    without gradients and in eval mode (the model's modes are restored after: a model someone put
    in train mode to fine-tune further stays in train mode)."""

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


def image_list(images: Images) -> list:
    """The images of a method's argument as a list (a batch tensor [N, 3, H, W] unbound)."""
    if isinstance(images, torch.Tensor) and images.dim() == 4:
        return list(images.unbind(0))
    return as_list(images, (str, os.PathLike, Image.Image))


def image_tensor(
    image: ImageLike, transform: Callable[[Image.Image], torch.Tensor], min_side: int, origin: str
) -> torch.Tensor:
    """One image [3, S, S] through an evaluation ``transform`` (a tensor passes unchanged): a file is
    opened as RGB (:func:`vlp.preprocess.images.open_image`; ``origin`` starts its errors, a
    :class:`~vlp.errors.BadImage` for a missing, unreadable or truncated file), a PIL image converted
    the same way; either upscaled to ``min_side`` first. What every method of a
    :class:`~vlp.api.VLPModel` (``transform`` = ``vm.transform``, ``min_side`` =
    ``vm.preprocessor.min_side``) and the photo index (:mod:`vlp.search`) preprocess images with."""
    if isinstance(image, torch.Tensor):
        return image
    if isinstance(image, Image.Image):
        im = upscale_tiny(to_rgb(image), min_side)  # as open_image does for files
    else:
        im = open_image(str(image), origin, min_side=min_side)
    return transform(im)


def _image_tensor(vm: VLPModel, image: ImageLike, i: int) -> torch.Tensor:
    """One image [3, S, S] through ``vm``'s evaluation transform (:func:`image_tensor`)."""
    return image_tensor(image, vm.transform, vm.preprocessor.min_side, f"image {i}")


def pixel_values(vm: VLPModel, images: Images) -> torch.Tensor:
    """Images preprocessed for VLPModel ``vm`` [N, 3, S, S] (its evaluation transform; tensors pass
    unchanged), on the CPU."""
    return torch.stack([_image_tensor(vm, im, i) for i, im in enumerate(image_list(images))])


def image_batches(vm: VLPModel, images: Images, batch_size: Optional[int]) -> Iterator[torch.Tensor]:
    """The images preprocessed for ``vm``, ``batch_size`` (default ``vm.batch_size``) at a time:
    [B, 3, S, S] on ``vm.device``."""
    items, bs = image_list(images), batch_size or vm.batch_size
    for s in range(0, len(items), bs):
        yield torch.stack([_image_tensor(vm, im, s + j) for j, im in enumerate(items[s : s + bs])]).to(vm.device)


def tokenize(vm: VLPModel, texts: Texts) -> dict[str, torch.Tensor]:
    """``input_ids`` / ``attention_mask`` [N, T] of captions for ``vm`` (:func:`vlp.preprocess.transforms.tokenize`:
    ``pre_caption``, ``max_len`` tokens, padded to the longest), on the CPU."""
    return tokenize_captions(vm.tokenizer, as_list(texts, (str,)), vm.preprocessor.max_len)

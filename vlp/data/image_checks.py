"""Image files checked before any work: an evaluation's paths (:func:`check_image_paths`), a
training split's samples under the bad-sample policy (:func:`check_images`), and the bad-sample
keywords the training datasets and the shard loader take (:func:`bad_sample_args`)."""

from __future__ import annotations

import logging
import os
from typing import Optional, Sequence

from vlp.config import BadSampleConfig
from vlp.data.datasets import BAD_SAMPLE_HINT
from vlp.dist import launch_rank
from vlp.errors import DataError

logger = logging.getLogger(__name__)


def check_image_paths(paths: Sequence[str], source: str, limit: int = 5) -> None:
    """Before an evaluation encodes anything: image files of ``paths`` (resolved, as ``source``, the
    data file, lists them) that do not exist, in one :class:`DataError` naming the count, the first
    few and the image root to check (a wrong ``--image-root`` fails here, in one line)."""
    missing = [(i, p) for i, p in enumerate(paths) if not os.path.isfile(p)]
    if missing:
        listed = "; ".join(f"image {i}: {p}" for i, p in missing[:limit])
        raise DataError(
            f"{source}: {len(missing)} of {len(paths)} image files not found, e.g. {listed} (check --image-root / "
            "data.image_root: relative paths are read from it, else from the data file's folder)"
        )


def check_images(samples: Sequence, data: Optional[BadSampleConfig] = None, limit: int = 5) -> None:
    """Before training or a pass over ``samples`` (each with ``image`` and ``origin``): image files
    that do not exist. Without ``data`` or with ``data.on_bad_sample=raise``, any fails, naming the
    first few; with ``skip`` they are counted in one warning line (stderr, rank 0) and fail only when
    their share exceeds ``data.max_bad_fraction`` (training replaces them)."""
    missing = [s for s in samples if not os.path.isfile(s.image)]
    if not missing:
        return
    n, total = len(missing), len(samples)
    listed = "; ".join(f"{s.origin}: {s.image}" for s in missing[:limit])
    if data is None:
        raise DataError(f"{n} of {total} image files not found, e.g. {listed}")
    if data.on_bad_sample == "raise":
        raise DataError(f"{n} of {total} image files not found, e.g. {listed}; {BAD_SAMPLE_HINT}")
    if n / total > data.max_bad_fraction:
        raise DataError(
            f"{n} of {total} image files not found ({n / total:.2%}), more than "
            f"data.max_bad_fraction={data.max_bad_fraction:g}, e.g. {listed}"
        )
    if launch_rank()[0] == 0:
        logger.warning(
            f"vlp data: warning: {n} of {total} image files not found ({n / total:.2%}); data.on_bad_sample=skip "
            f"replaces them at training time, e.g. {listed}"
        )


def bad_sample_args(data: BadSampleConfig) -> dict:
    """The bad-sample keywords of the training datasets and the shard loader (``data.*`` keys)."""
    return {"on_bad": data.on_bad_sample, "max_pixels": data.max_image_pixels, "min_side": data.min_image_side}

"""The progress bar every long job shows (training, evaluation, data checks, shard writing). It
depends on nothing in vlp, so any layer may use it."""

from __future__ import annotations

from tqdm.auto import tqdm


def progress(total: int, desc: str, enabled: bool = True, initial: int = 0) -> tqdm:
    """A tqdm bar over ``total`` items, ``initial`` of them done already (a resumed download),
    refreshed at most once a second; ``enabled=False`` hides it."""
    return tqdm(total=total, desc=desc, disable=not enabled, dynamic_ncols=True, mininterval=1.0, initial=initial)

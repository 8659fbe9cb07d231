"""Tests for the scenes of the shapes world (vlp.world.scene): sampling and rendering."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest

from tests.world.conftest import _sample_scenes
from vlp.world.scene import BACKGROUND_RGB, COLOR_RGB, COLORS, SHAPES, SIZES, Obj, Scene, render_scene


def test_sample_scene_is_valid_and_covers_counts() -> None:
    scenes = _sample_scenes(400)
    counts = Counter(len(s.objects) for s in scenes)
    assert set(counts) == {1, 2, 3, 4}
    assert min(counts.values()) > 60  # roughly uniform
    for s in scenes:
        cells = [(o.row, o.col) for o in s.objects]
        assert len(set(cells)) == len(cells)
        assert cells == sorted(cells)
        for o in s.objects:
            assert o.shape in SHAPES and o.color in COLORS and o.size in SIZES
            assert 0 <= o.row <= 2 and 0 <= o.col <= 2


# ---------------------------------------------------------------- rendering


@pytest.mark.parametrize("size", [64, 96, 128, 256])
def test_render_colours(size: int) -> None:

    cell = size / 3
    for k, scene in enumerate(_sample_scenes(25, seed=size)):
        img = render_scene(scene, size, random.Random(k))
        assert img.size == (size, size) and img.mode == "RGB"
        arr = np.asarray(img)
        occupied = {(o.row, o.col): o for o in scene.objects}
        for r in range(3):
            for c in range(3):
                y0, y1 = int(r * cell) + 1, int((r + 1) * cell) - 1
                x0, x1 = int(c * cell) + 1, int((c + 1) * cell) - 1
                block = arr[y0:y1, x0:x1].reshape(-1, 3)
                o = occupied.get((r, c))
                if o is None:
                    assert (block == BACKGROUND_RGB).all()
                    continue
                centre = tuple(arr[int((r + 0.5) * cell), int((c + 0.5) * cell)])
                if o.size == "large":
                    assert centre == COLOR_RGB[o.color]
                colours = {tuple(px) for px in np.unique(block, axis=0)}
                assert colours == {COLOR_RGB[o.color], BACKGROUND_RGB}
                frac = (block == COLOR_RGB[o.color]).all(axis=1).mean()
                assert (0.25 < frac <= 1.0) if o.size == "large" else (0.03 < frac < 0.35), (o, frac)


def test_render_without_rng_is_centred() -> None:
    scene = Scene((Obj("triangle", "yellow", "small", 1, 1),))
    arr = np.asarray(render_scene(scene, 64))
    assert tuple(arr[32, 32]) == COLOR_RGB["yellow"]
    assert tuple(arr[0, 0]) == BACKGROUND_RGB

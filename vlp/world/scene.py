"""Scenes of the shapes world: attributes, objects, partial descriptions, sampling and rendering.

Each image is a light-grey canvas split into an (invisible) 3x3 grid holding 1-4 coloured
shapes, at most one per cell. Every object (:class:`Obj`) has a shape, a colour, a size and a
cell; a :class:`Scene` is its objects in row-major cell order. A :class:`Desc` is a partial
object description (the noun phrases of captions, questions and statements). Randomness comes
from :func:`world_rng`: one independent RNG per (seed, split, image, purpose).
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import asdict, dataclass
from typing import Any

from PIL import Image, ImageDraw

__all__ = [
    "SHAPES",
    "COLORS",
    "SIZES",
    "COLOR_RGB",
    "BACKGROUND_RGB",
    "MIN_OBJECTS",
    "MAX_OBJECTS",
    "DESC_FIELDS",
    "Obj",
    "Scene",
    "Desc",
    "describe",
    "count_matching",
    "scene_to_dict",
    "scene_from_dict",
    "sample_scene",
    "render_scene",
    "draw_shape",
    "world_rng",
]

SHAPES: tuple[str, ...] = ("circle", "square", "triangle", "diamond")
COLORS: tuple[str, ...] = ("red", "green", "blue", "yellow", "purple", "orange")
SIZES: tuple[str, ...] = ("small", "large")

COLOR_RGB: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 160, 50),
    "blue": (30, 70, 220),
    "yellow": (245, 215, 0),
    "purple": (140, 40, 180),
    "orange": (255, 130, 0),
}
BACKGROUND_RGB: tuple[int, int, int] = (210, 210, 210)

#: side of the object's bounding box as a fraction of the cell side
SIZE_EXTENT: dict[str, float] = {"small": 0.40, "large": 0.85}
#: max centre jitter as a fraction of the free space left in the cell
JITTER_FRACTION = 0.5

MIN_OBJECTS, MAX_OBJECTS = 1, 4

#: the attributes of an object, in the order of :class:`Obj` and :class:`Desc`
DESC_FIELDS: tuple[str, ...] = ("shape", "color", "size", "row", "col")


# --------------------------------------------------------------------------
# Objects and scenes
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Obj:
    """One object: shape, colour, size and its grid cell (row 0..2 top->bottom, col 0..2 left->right)."""

    shape: str
    color: str
    size: str
    row: int
    col: int


@dataclass(frozen=True)
class Scene:
    """A scene: objects in distinct cells, canonically ordered row-major by cell."""

    objects: tuple[Obj, ...]


@dataclass(frozen=True)
class Desc:
    """A partial object description; ``None`` fields are unconstrained."""

    shape: str | None = None
    color: str | None = None
    size: str | None = None
    row: int | None = None
    col: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def matches(self, obj: Obj) -> bool:
        """True iff every given attribute equals the object's."""
        return all((v := getattr(self, f)) is None or v == getattr(obj, f) for f in DESC_FIELDS)


def describe(obj: Obj, attrs: frozenset[str]) -> Desc:
    """The description of ``obj`` by the attributes ``attrs`` (of size, color, shape and "pos", the cell)."""
    return Desc(
        shape=obj.shape if "shape" in attrs else None,
        color=obj.color if "color" in attrs else None,
        size=obj.size if "size" in attrs else None,
        row=obj.row if "pos" in attrs else None,
        col=obj.col if "pos" in attrs else None,
    )


def count_matching(scene: Scene, d: Desc) -> int:
    """How many objects of ``scene`` satisfy ``d``."""
    return sum(d.matches(o) for o in scene.objects)


def scene_to_dict(scene: Scene) -> dict[str, Any]:
    """Serialise a scene as ``{"objects": [{shape, color, size, row, col}, ...]}``."""
    return {"objects": [asdict(o) for o in scene.objects]}


def scene_from_dict(d: dict[str, Any]) -> Scene:
    """Inverse of :func:`scene_to_dict` (also accepts a ``scenes.json`` split entry)."""
    return Scene(tuple(Obj(**{k: o[k] for k in DESC_FIELDS}) for o in d["objects"]))


# --------------------------------------------------------------------------
# Sampling and rendering
# --------------------------------------------------------------------------


def world_rng(seed: int, split: str, index: int, purpose: str) -> random.Random:
    """An independent RNG per (seed, split, image, purpose); stable across Python runs."""
    digest = hashlib.sha256(f"vlp-shapes-world/{seed}/{split}/{index}/{purpose}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def sample_scene(rng: random.Random) -> Scene:
    """Draw a scene: 1-4 objects (uniform), distinct cells, uniform attributes."""
    n = rng.randint(MIN_OBJECTS, MAX_OBJECTS)
    cells = sorted(rng.sample(range(9), n))
    objs = []
    for cell in cells:
        shape = rng.choice(SHAPES)
        color = rng.choice(COLORS)
        size = rng.choice(SIZES)
        objs.append(Obj(shape, color, size, cell // 3, cell % 3))
    return Scene(tuple(objs))


def render_scene(scene: Scene, image_size: int = 64, rng: random.Random | None = None) -> Image.Image:
    """Render ``scene`` as an RGB image of ``image_size`` x ``image_size`` pixels.

    Each object is drawn (no anti-aliasing) inside its own cell; a bounding box
    of ``SIZE_EXTENT[size]`` of the cell side centred on the cell centre, moved
    by a jitter drawn from ``rng`` (no jitter when ``rng`` is None).  The jitter
    never pushes an object out of its cell, so the cell centre of a large
    object always has the object's colour and empty cells are pure background.
    """
    if image_size < 9:
        raise ValueError(f"image_size must be >= 9, got {image_size}")
    img = Image.new("RGB", (image_size, image_size), BACKGROUND_RGB)
    draw = ImageDraw.Draw(img)
    for obj, (cx, cy, half) in zip(scene.objects, object_geometry(scene, image_size, rng)):
        draw_shape(draw, obj.shape, cx, cy, half, COLOR_RGB[obj.color])
    return img


def object_geometry(
    scene: Scene, image_size: int, rng: random.Random | None = None
) -> list[tuple[float, float, float]]:
    """``(cx, cy, half)`` of each object of ``scene`` at ``image_size``: its centre and the half side
    of its square bounding box, in pixels, with the jitter drawn from ``rng`` in object order (two
    draws each; none when ``rng`` is None). :func:`render_scene` draws with exactly these."""
    cell = image_size / 3.0
    out = []
    for obj in scene.objects:
        extent = SIZE_EXTENT[obj.size] * cell
        slack = max(0.0, (cell - extent) / 2.0 - 1.0) * JITTER_FRACTION
        jx = rng.uniform(-slack, slack) if rng is not None else 0.0
        jy = rng.uniform(-slack, slack) if rng is not None else 0.0
        out.append(((obj.col + 0.5) * cell + jx, (obj.row + 0.5) * cell + jy, extent / 2.0))
    return out


def draw_shape(
    draw: ImageDraw.ImageDraw, shape: str, cx: float, cy: float, half: float, fill: tuple[int, int, int]
) -> None:
    """Draw ``shape`` filled with the RGB colour ``fill`` in a box of half-side ``half`` centred on
    (cx, cy) in pixels; return nothing. Raise ``ValueError`` for a shape not in :data:`SHAPES`."""
    if shape == "circle":
        draw.ellipse([cx - half, cy - half, cx + half, cy + half], fill=fill)
    elif shape == "square":
        draw.rectangle([cx - half, cy - half, cx + half, cy + half], fill=fill)
    elif shape == "triangle":
        draw.polygon([(cx, cy - half), (cx + half, cy + half), (cx - half, cy + half)], fill=fill)
    elif shape == "diamond":
        draw.polygon([(cx, cy - half), (cx + half, cy), (cx, cy + half), (cx - half, cy)], fill=fill)
    else:
        raise ValueError(f"unknown shape {shape!r}")

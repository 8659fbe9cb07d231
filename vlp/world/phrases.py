"""The words of the shapes world, shared by captions, VQA questions and NLVR2 statements.

One phrase per grid cell (:data:`CELL_PHRASES`), the number words, the article helper and the
noun phrase ``[size] [colour] noun [cell phrase]`` of a :class:`~vlp.world.scene.Desc`
with its parser. All text is lowercase ``[a-z ]``, so ALBEF-style caption cleaning leaves it
unchanged.
"""

from __future__ import annotations

from typing import Sequence

from vlp.world.scene import COLORS, SHAPES, SIZES, Desc

__all__ = [
    "CELL_PHRASES",
    "PHRASE_CELLS",
    "NUMBER_WORDS",
    "with_article",
    "noun_phrase",
    "parse_noun_phrase",
    "parse_article_phrase",
]

#: one phrase per grid cell (row, col); each phrase means exactly that cell
CELL_PHRASES: dict[tuple[int, int], str] = {
    (0, 0): "at the top left",
    (0, 1): "at the top",
    (0, 2): "at the top right",
    (1, 0): "on the left",
    (1, 1): "in the center",
    (1, 2): "on the right",
    (2, 0): "at the bottom left",
    (2, 1): "at the bottom",
    (2, 2): "at the bottom right",
}
PHRASE_CELLS: dict[str, tuple[int, int]] = {v: k for k, v in CELL_PHRASES.items()}

#: number words 0..8 (captions count at most the objects of one image, NLVR2 totals of two)
NUMBER_WORDS: tuple[str, ...] = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight")


def with_article(phrase: str) -> str:
    """``phrase`` after its indefinite article: "an orange circle", "a red shape"."""
    return f"{'an' if phrase[0] in 'aeiou' else 'a'} {phrase}"


def noun_phrase(d: Desc, noun: str = "shape", plural: bool = False) -> str:
    """``[size] [colour] noun [cell phrase]``; ``noun`` is used when ``d`` gives no shape."""
    base = d.shape if d.shape is not None else noun
    words = [w for w in (d.size, d.color) if w is not None]
    words.append(base + "s" if plural else base)
    if d.row is not None or d.col is not None:
        if d.row is None or d.col is None:
            raise ValueError("caption text needs both row and col (one phrase per cell)")
        words.append(CELL_PHRASES[(d.row, d.col)])
    return " ".join(words)


def parse_noun_phrase(tokens: Sequence[str], plural: bool = False, nouns: tuple[str, ...] = ("shape",)) -> Desc:
    """Inverse of :func:`noun_phrase` (no article); ``nouns``: the words that may stand for no shape.

    Raises ``ValueError`` outside the grammar.
    """
    rest = list(tokens)
    size = rest.pop(0) if rest and rest[0] in SIZES else None
    color = rest.pop(0) if rest and rest[0] in COLORS else None
    if not rest:
        raise ValueError(f"missing noun in {' '.join(tokens)!r}")
    noun = rest.pop(0)
    if plural:
        if not noun.endswith("s"):
            raise ValueError(f"expected a plural noun, got {noun!r}")
        noun = noun[:-1]
    if noun not in SHAPES and noun not in nouns:
        raise ValueError(f"unknown noun {noun!r}")
    cell = PHRASE_CELLS.get(" ".join(rest)) if rest else None
    if rest and cell is None:
        raise ValueError(f"unknown position phrase {' '.join(rest)!r}")
    row, col = cell if cell else (None, None)
    return Desc(noun if noun in SHAPES else None, color, size, row, col)


def parse_article_phrase(tokens: Sequence[str], nouns: tuple[str, ...] = ("shape",)) -> Desc:
    """Inverse of ``with_article(noun_phrase(d))``: a singular noun phrase after "a" or "an"."""
    if not tokens or tokens[0] not in ("a", "an"):
        raise ValueError(f"expected an article in {' '.join(tokens)!r}")
    return parse_noun_phrase(tokens[1:], plural=False, nouns=nouns)


def attribute_sets(*specs: str) -> tuple[frozenset[str], ...]:
    """Attribute subsets written as space-separated names, in order: ``attribute_sets("color",
    "size shape")`` -> ``(frozenset({"color"}), frozenset({"size", "shape"}))``; ``""`` is the empty set."""
    return tuple(frozenset(spec.split()) for spec in specs)

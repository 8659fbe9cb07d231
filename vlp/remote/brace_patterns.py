"""Brace patterns of shards (``s3://bucket/cc12m/{00000..01242}.tar``), counted before they are
expanded: a pattern of 10**8 names would take gigabytes to expand (braceexpand materialises every
group of a pattern before its first name), so its size is computed first and a pattern of more than
:data:`MAX_PATTERN_SHARDS` names is refused in one line naming it and its count.

The grammar is braceexpand's (what :func:`expand` then expands): outside braces, text is literal and
``\\`` escapes the next character; ``{a..b}`` and ``{a..b..step}`` are ranges of integers (either
direction; the step's sign is ignored, a step of 0 is 1) or of letters (of ``A-Za-z`` in that order);
``{x,y,...}`` is a list of alternatives, each itself a pattern (nesting); a group that is neither (no
top-level comma: ``{x}``, ``{}``) is literal braces around a pattern. Unbalanced braces are an error.
The count of a pattern is the product of its groups' counts; a list's is the sum of its
alternatives'; a range's is its length.
"""

from __future__ import annotations

import re

from vlp.errors import DataError
from vlp.remote.url_credentials import redacted

#: The most names one pattern may have (one ``data.train`` entry): a million shards of
#: img2dataset's 10,000 samples are 10 billion samples; a larger set is several entries.
MAX_PATTERN_SHARDS = 1_000_000

_INT_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)(?:\.\.-?(\d+))?$")
_CHAR_RANGE = re.compile(r"^([A-Za-z])\.\.([A-Za-z])(?:\.\.-?(\d+))?$")
_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


class _Unbalanced(ValueError):
    """A pattern whose braces do not pair up."""


def pattern_size(pattern: str) -> int:
    """How many names ``pattern`` expands to (module doc), computed without expanding it; unbalanced
    braces raise one :class:`DataError` naming the pattern."""
    try:
        return _count_pattern(pattern)
    except _Unbalanced:
        raise DataError(f"{redacted(pattern)!r}: unbalanced braces, expected {{a..b}} or {{x,y}} groups") from None


def expand(pattern: str, what: str) -> list[str]:
    """The names of ``pattern``, in braceexpand's order; a pattern of more than
    :data:`MAX_PATTERN_SHARDS` names raises one :class:`DataError` naming it (as ``what``, e.g.
    ``"data.train entry"``, credentials redacted) and its count, before anything is expanded."""
    import braceexpand

    n = pattern_size(pattern)
    if n > MAX_PATTERN_SHARDS:
        raise DataError(
            f"{what} {redacted(pattern)!r} names {n:,} shards, over the cap of {MAX_PATTERN_SHARDS:,} a pattern "
            "(vlp.remote.brace_patterns.MAX_PATTERN_SHARDS): split it into several entries"
        )
    return list(braceexpand.braceexpand(pattern))


def _count_pattern(pattern: str) -> int:
    """The count of a sequence of literals and groups: the product of its groups' counts."""
    total, start, depth, pos = 1, 0, 0, 0
    while pos < len(pattern):
        c = pattern[pos]
        if c == "\\":
            pos += 2
            continue
        if c == "{":
            if depth == 0:
                start = pos
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                total *= _count_group(pattern[start + 1 : pos])
        pos += 1
    if depth != 0:
        raise _Unbalanced(pattern)
    return total


def _count_group(expr: str) -> int:
    """The count of the text between a group's braces: a range, a list, or literal braces."""
    m = _INT_RANGE.match(expr)
    if m:
        a, b, step = int(m.group(1)), int(m.group(2)), int(m.group(3) or 1) or 1
        return abs(b - a) // step + 1  # len(range(...)), which overflows past 2**63
    m = _CHAR_RANGE.match(expr)
    if m:
        a, b = _ALPHABET.index(m.group(1)), _ALPHABET.index(m.group(2))
        step = int(m.group(3) or 1) or 1
        return len(_ALPHABET[a : b + 1 : step] if a < b else _ALPHABET[a : (b or -len(_ALPHABET)) - 1 : -step])
    alternatives = _split_list(expr)
    if alternatives is None:
        return _count_pattern(expr)  # not a range or a list: literal braces around a pattern
    return sum(_count_pattern(a) for a in alternatives)


def _split_list(expr: str) -> list[str] | None:
    """The alternatives of a list (split at its top-level commas); None when it has no such comma
    or its braces do not pair up (then the group is literal)."""
    parts, start, depth, pos = [], 0, 0, 0
    while pos < len(expr):
        c = expr[pos]
        if c == "\\":
            pos += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(expr[start:pos])
            start = pos + 1
        pos += 1
    if depth != 0 or not parts:
        return None
    return [*parts, expr[start:]]

"""VQA answer normalisation: the one form in which answers are stored (``vlp prepare vg-qa``) and
compared (VQA accuracy in :mod:`vlp.eval.vqa`)."""

from __future__ import annotations

import re
import string


def normalize_answer(s: str) -> str:
    """Lower-case, strip, collapse whitespace runs to one space, drop trailing punctuation."""
    s = re.sub(r"\s+", " ", s.lower()).strip()
    return s.rstrip(string.punctuation).rstrip()

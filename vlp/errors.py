"""Every error type a user of vlp can meet, in one module that imports nothing of vlp.

Each names what was wrong and what was expected: the config key, the file and entry, or the
checkpoint and its offending keys. The command line turns any of them into one line on stderr.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional


class ConfigError(ValueError):
    """A user mistake in a config file or an override; the message names the key."""


class DataError(ValueError):
    """Bad input data: the message names the file, the entry and what was expected."""


class BadJSON(DataError):
    """A file that is not valid JSON; ``line`` and ``column`` (1-based) locate the syntax error."""

    def __init__(self, path: str | Path, line: int, column: int, reason: str) -> None:
        super().__init__(f"{path}: line {line} column {column}: invalid JSON ({reason})")
        self.path, self.line, self.column, self.reason = str(path), line, column, reason

    def __reduce__(self) -> tuple[type[BadJSON], tuple[str, int, int, str]]:
        return type(self), (self.path, self.line, self.column, self.reason)


class EntryError(DataError):
    """A problem of entry ``entry`` (0-based) of the annotation file ``path`` at ``key`` (None: the
    entry as a whole); ``detail`` says what is wrong and what was expected."""

    def __init__(self, path: str | Path, entry: int, key: Optional[str], detail: str) -> None:
        super().__init__(f"{path}: entry {entry}: {detail}")
        self.path, self.entry, self.key, self.detail = str(path), entry, key, detail

    def __reduce__(self) -> tuple[type[EntryError], tuple[str, int, Optional[str], str]]:
        return type(self), (self.path, self.entry, self.key, self.detail)


class BadImage(DataError):
    """An image that cannot be used: missing, unreadable, truncated or too large."""


class CalibrationError(ValueError):
    """A calibration that cannot give a trustworthy answer (a helper too weak to tell false from true
    negatives, no known false negatives to calibrate on, a search that hit its bound): the message
    says why and what to do instead."""


class CheckpointError(RuntimeError):
    """Weights that do not fit: names the file and the offending keys."""


class DownloadError(RuntimeError):
    """A file that could not be fetched (network down, HTTP error, timeout) or that arrived wrong
    (size or SHA-256 mismatch): names the URL, where it was going, and how to do it by hand."""


class NonFiniteError(RuntimeError):
    """``train.max_nonfinite_steps`` consecutive steps had a non-finite loss or gradient (or one did,
    under DeepSpeed, which cannot skip a step); a checkpoint of the last good state was saved. Raised
    by :mod:`vlp.train.loop`; defined here so that the command line catches it without importing the
    training loop (``vlp: error:``, exit status 1)."""

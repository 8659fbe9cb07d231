"""The mode of the files vlp writes: what the process umask gives a new file, set on the files that
their writer creates ``0600`` (safetensors' ``save_file``, ``tempfile.mkstemp``), so that colleagues on
a shared cluster read them as they read every other file. Imports nothing of vlp: the weights and the
JSON writers of the data layer both use it, and neither pulls in the other (nor torch)."""

from __future__ import annotations

import os


def umask_mode() -> int:
    """The mode a new file gets from the process umask (``0o644`` under the usual ``022``)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask

"""The vlp version (written into checkpoints, run_info.json and exported files)."""

__version__ = "0.1.0"

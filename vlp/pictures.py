"""What every picture vlp draws shares: its title, which names the run it shows and the step
(:func:`title_picture`, the one place a figure's title is set; :mod:`vlp.viz` and
:mod:`vlp.heat_pictures` call it), and its saving (:func:`save_picture`), which writes the same
text into the PNG's ``Title``, so that a picture copied out of its run still says where it came from.

The run is its output_dir's name (``runs/ft_retrieval`` -> ``ft_retrieval``), or the folder's own
name for a checkpoint outside a run (a converted zoo checkpoint, a ``save_pretrained`` folder) and
the name of the file or cache a picture shows that is no run (a helper cache, a targets file). The
step is the checkpoint's (its ``state.json``), or the last logged one of a ``metrics.jsonl``.
Imports nothing of vlp (matplotlib when a picture is saved).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence, Union


@dataclass(frozen=True)
class RunStep:
    """The run a picture shows (``run``, a name) and its step (None: not known, e.g. a cache)."""

    run: str
    step: Optional[int] = None

    def __str__(self) -> str:
        return f"{self.run}, step {self.step}" if self.step is not None else self.run

    @classmethod
    def of_checkpoint(cls, folder: Union[str, Path], step: Optional[int] = None) -> RunStep:
        """A checkpoint folder's run (``RUN/checkpoints/step_N`` or ``RUN/checkpoints/best``: RUN;
        any other folder: its own name) and ``step``, or when not given (a caller that has not opened
        the checkpoint) the step of its ``state.json`` (None without one)."""
        folder = Path(folder)
        run = folder.parent.parent.name if folder.parent.name == "checkpoints" else folder.name
        state = folder / "state.json"
        if step is None:
            step = json.loads(state.read_text()).get("step") if state.is_file() else None
        return cls(run, None if step is None else int(step))

    @classmethod
    def of_metrics(cls, metrics_jsonl: Union[str, Path], records: Iterable[dict[str, Any]]) -> RunStep:
        """The run of a ``RUN/metrics.jsonl`` and the last step its ``records`` (as read) logged."""
        steps = [int(r["step"]) for r in records if r.get("step") is not None]
        return cls(Path(metrics_jsonl).resolve().parent.name, max(steps) if steps else None)


#: what a picture shows: one run and step, several (a comparison of runs), or None (nothing known)
Shows = Union[RunStep, Sequence[RunStep], None]


def run_line(shows: Shows) -> str:
    """The first line of a picture's title: ``run, step N`` (several runs "; "-separated); "" for None."""
    if shows is None:
        return ""
    return "; ".join(str(s) for s in ([shows] if isinstance(shows, RunStep) else shows))


def title_picture(fig: Any, shows: Shows, title: str = "", **kwargs: Any) -> str:
    """Set ``fig``'s title (its suptitle): the run and step it shows (:func:`run_line`), then
    ``title`` on the next line; ``kwargs`` go to ``suptitle`` (default font size 8). Returns the
    text. Every picture vlp saves is titled here, before it is laid out."""
    text = "\n".join(line for line in (run_line(shows), title) if line)
    if text:
        fig.suptitle(text, **{"fontsize": 8, **kwargs})
    return text


def save_picture(fig: Any, out: Union[str, Path], dpi: int, layout: bool = True) -> Path:
    """Write ``fig`` to ``out`` (after ``tight_layout`` unless ``layout`` is False: the caller laid it
    out) with its title (:func:`title_picture`) as the PNG's ``Title``, close it and return the path."""
    import matplotlib.pyplot as plt

    if layout:
        fig.tight_layout()
    title = fig.get_suptitle()
    fig.savefig(out, dpi=dpi, metadata={"Title": title} if title else None)
    plt.close(fig)
    return Path(out)

"""The search tests' fixtures: a tiny ALBEF pretraining run (E = 16, 32 px images) and a folder of
photos in nested folders with one truncated image, one file that is no image and one text file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image

from vlp.config import ModelConfig, PretrainConfig, TextConfig, VisionConfig, to_dict
from vlp.models.albef import ALBEF
from vlp.weights import save_checkpoint

#: the photo folder's readable images, relative paths in the order the index keeps them (sorted)
GOOD = ["a/0.png", "a/b/1.png", "a/b/2.JPG", "a/c.png", "d/3.png", "d/4.jpeg", "e.png"]
#: the files it skips: a truncated PNG and a text file named .png
BAD = ["a/b/cut.png", "d/fake.png"]


def tiny_run(folder: Path, embed_dim: int = 16, seed: int = 0) -> Path:
    """A pretraining run folder holding one untrained ALBEF (``embed_dim``, 32 px) as step 2."""
    torch.manual_seed(seed)
    mcfg = ModelConfig(
        vision=VisionConfig(depth=1, img_size=32),
        text=TextConfig(layers=1, fusion_layers=1, dropout=0.0),
        queue_size=8,
        embed_dim=embed_dim,
    )
    state = {"task": "pretrain", "config": to_dict(PretrainConfig(model=mcfg)), "model": to_dict(mcfg), "step": 2}
    save_checkpoint(folder / "checkpoints" / "step_0000002", ALBEF(mcfg), state)
    return folder


@pytest.fixture(scope="package")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny run (E = 16)."""
    return tiny_run(tmp_path_factory.mktemp("run"))


@pytest.fixture(scope="package")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The photo folder: :data:`GOOD` (random RGB images of several sizes, one below 16 px), :data:`BAD`
    and ``notes.txt``."""
    root = tmp_path_factory.mktemp("photos")
    g = torch.Generator().manual_seed(0)
    sizes = [(40, 40), (64, 48), (50, 30), (12, 30), (90, 70), (33, 33), (20, 60)]
    for rel, (w, h) in zip(GOOD, sizes):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        arr = torch.randint(0, 256, (h, w, 3), generator=g, dtype=torch.uint8).numpy()
        Image.fromarray(arr).save(root / rel, format="JPEG" if rel.lower().endswith(("jpg", "jpeg")) else "PNG")
    whole = (root / GOOD[0]).read_bytes()
    (root / BAD[0]).write_bytes(whole[: len(whole) // 2])
    (root / BAD[1]).write_text("not an image\n")
    (root / "notes.txt").write_text("a text file: ignored\n")
    return root


#: ``vlp index``'s options in these tests: batches of 2, chunks of 3 files (3 chunks), CPU, no bar
INDEX_OPTIONS = ["--batch-size", "2", "--chunk-size", "3", "--device", "cpu", "--no-progress"]


def index_argv(photos: Path, run: Path, out: Path, *more: str) -> list[str]:
    """``vlp index PHOTOS --checkpoint RUN --out OUT`` with :data:`INDEX_OPTIONS` and ``more``."""
    return ["index", str(photos), "--checkpoint", str(run), "--out", str(out), *INDEX_OPTIONS, *more]


@pytest.fixture(scope="package")
def index(run: Path, photos: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``vlp index`` of :func:`photos` with :func:`run`: the index folder."""
    from vlp.cli import main

    out = tmp_path_factory.mktemp("index") / "idx"
    assert main(index_argv(photos, run, out)) == 0
    return out


def kill_after(monkeypatch: pytest.MonkeyPatch, embedder: type, calls: int) -> None:
    """``embedder.embed_images`` (an image encoder class) raises on its call number ``calls + 1`` (a kill)."""
    real, seen = embedder.embed_images, []

    def dying(self: Any, pixels: torch.Tensor) -> torch.Tensor:
        seen.append(len(pixels))
        if len(seen) > calls:
            raise KeyboardInterrupt("killed")
        return real(self, pixels)

    monkeypatch.setattr(embedder, "embed_images", dying)

"""Set-up that many test files share and that is not a fixture: the tiny override lists, pretraining
through the command line, tiny checkpoints, the rows of a printed table, and the one launcher of
multi-process runs.

The fixtures built on them (a module's shapes world, its pretrained checkpoint) are in
``tests/conftest.py``; the multi-process training fixtures in ``tests/train/conftest.py``.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Sequence

import pytest

if TYPE_CHECKING:
    import torch

    from vlp.config import ModelConfig

ROOT = Path(__file__).resolve().parents[1]
SHAPES_TINY = "configs/pretrain/shapes_tiny.yaml"  # relative: pytest and the launched runs start in ROOT

# ------------------------------------------------------------------ override lists

#: the smallest ALBEF: one ViT block, one text layer and one fusion layer
TINY_ALBEF = ["model.vision.depth=1", "model.text.layers=1", "model.text.fusion_layers=1"]
#: ``TINY_ALBEF`` on 32 px images with a 16-entry queue: the model of the multi-process tests
TINY_ALBEF_32 = [*TINY_ALBEF, "model.vision.img_size=32", "model.queue_size=16"]
#: batches of 8, no loader workers, no progress bar
QUICK = ["data.batch_size=8", "data.num_workers=0", "train.progress=false"]
#: fine-tuning for 4 steps, validating and logging every 2 (batches 8, evaluation batches 16)
FT_STEPS = [
    "data.batch_size=8",
    "data.eval_batch_size=16",
    "data.num_workers=0",
    "train.steps=4",
    "eval_every=2",
    "train.progress=false",
    "train.log_every=2",
]
#: ``FT_STEPS`` for a config that sets ``train.epochs`` (which may not be set besides ``train.steps``)
FT = ["train.epochs=null", *FT_STEPS]
#: ``TINY_ALBEF`` on the ``jpeg_world`` fixture's JPEGs (tests/conftest.py): crops of half the image
#: or more, flips, uint8 images, batches of 4, no loader workers (the draft / device decode tests)
JPEG_RUN = [
    "data.image.crop_scale=[0.5,1.0]",
    "data.image.hflip=true",
    "data.image.uint8=true",
    "data.batch_size=4",
    "data.num_workers=0",
    *TINY_ALBEF,
]
#: the dual encoder of the loss zoo and LTD: ITC alone, no distillation
DUAL = [
    "model.arch=dual",
    "loss.itm=0",
    "loss.mlm=0",
    "loss.distill=false",
    "eval.score=itc",
    "loss.contrastive.tau=0.05",
]
#: ``DUAL`` at its smallest widths
TINY_DUAL = [
    *DUAL,
    "model.embed_dim=8",
    "model.dual.image_kwargs={channels: [4, 8, 8, 8]}",
    "model.dual.word_dim=8",
    "model.dual.gru_hidden=8",
    "model.dual.proj_hidden=16",
]


# ------------------------------------------------------------------ shapes worlds

#: ``generate_world`` arguments: no VQA or NLVR2 questions (the pretraining and retrieval files alone)
NO_TASKS = dict(vqa_per_image=0, nlvr_per_image=0)


def splits(world: dict[str, Path], name: str, val: str = "val") -> list[str]:
    """The ``data.train``, ``data.val`` and ``data.test`` overrides of a world's ``NAME_train``,
    ``NAME_<val>`` and ``NAME_test`` files."""
    train, dev, test = (world[f"{name}_{split}"] for split in ("train", val, "test"))
    return [f"data.train=[{train}]", f"data.val={dev}", f"data.test={test}"]


# ------------------------------------------------------------------ models and checkpoints


def pretrain(out: str | Path, data: str | Path, *overrides: str, config: str = SHAPES_TINY) -> int:
    """``vlp pretrain --config CONFIG output_dir=OUT data.train=[DATA] OVERRIDES...`` in this process;
    its exit status."""
    from vlp.cli import main

    return main(["pretrain", "--config", config, f"output_dir={out}", f"data.train=[{data}]", *overrides])


def untrained_checkpoint(path: Path, overrides: Sequence[str]) -> Path:
    """An untrained ALBEF (seed 0) of configs/pretrain/shapes_tiny.yaml with ``overrides``, saved at
    ``path`` as a step-0 pretraining checkpoint (evaluation and fine-tuning need only weights and config)."""
    import torch

    from vlp.config import PretrainConfig, load_config, to_dict
    from vlp.models.albef import ALBEF
    from vlp.weights import save_checkpoint

    cfg = load_config(PretrainConfig, ROOT / SHAPES_TINY, list(overrides))
    torch.manual_seed(0)
    return save_checkpoint(path, ALBEF(cfg.model), {"task": "pretrain", "config": to_dict(cfg), "step": 0})


def dual_checkpoint(run: Path) -> Path:
    """An untrained ``TINY_DUAL`` encoder on 48 px images (seed 0), saved as step 1 of the run folder ``run``."""
    import torch

    from vlp.config import PretrainConfig, load_config, to_dict
    from vlp.models.dual import DualEncoder
    from vlp.preprocess.transforms import load_tokenizer
    from vlp.weights import save_checkpoint

    cfg = load_config(PretrainConfig, None, [*TINY_DUAL, "model.dual.img_size=48"])
    torch.manual_seed(0)
    model = DualEncoder(cfg.model, vocab_size=len(load_tokenizer(cfg.model.text)))
    state = {"task": "pretrain", "step": 1, "config": to_dict(cfg)}
    return save_checkpoint(run / "checkpoints" / "step_0000001", model, state)


def token_batch(
    image_ids: torch.Tensor, t: int = 7, size: int = 64, generator: torch.Generator | None = None
) -> dict[str, torch.Tensor]:
    """A pretraining batch of random images [B, 3, size, size] and full-length captions [B, t]
    ([CLS] ... [SEP], ids from 1000-2000), one row per entry of ``image_ids`` [B]."""
    import torch

    g = generator if generator is not None else torch.Generator().manual_seed(0)
    b = len(image_ids)
    ids = torch.randint(1000, 2000, (b, t), generator=g)
    ids[:, 0], ids[:, -1] = 101, 102
    return dict(
        images=torch.randn(b, 3, size, size, generator=g),
        input_ids=ids,
        attention_mask=torch.ones(b, t, dtype=torch.long),
        image_ids=image_ids,
    )


def narrow_model_config(embed_dim: int = 16, queue_size: int = 0, **text) -> ModelConfig:
    """One 48-wide ViT block on 32 px images and 32-wide text layers (one text and one fusion layer
    unless ``text`` says otherwise): the model of the task-head tests."""
    from vlp.config import ModelConfig, TextConfig, VisionConfig

    text = {"layers": 1, "fusion_layers": 1, "hidden": 32, "heads": 2, "intermediate": 64, **text}
    return ModelConfig(
        vision=VisionConfig(depth=1, img_size=32, width=48, heads=3),
        text=TextConfig(**text),
        embed_dim=embed_dim,
        queue_size=queue_size,
    )


def open_clip_rows(model, preprocess, tokenizer, cache, samples) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows of the helper-feature cache ``cache`` (of ``samples``) as open_clip itself computes them
    with ``model``, its eval ``preprocess`` and ``tokenizer``: L2-normalised ``image`` [N_img, E] and
    ``text`` [N_txt, E] in the cache's row order."""
    import torch
    import torch.nn.functional as F
    from PIL import Image

    keys = sorted(cache.image_index, key=cache.image_index.get)
    texts = sorted(cache.text_index, key=cache.text_index.get)
    paths = {s.image_key: s.image for s in samples}
    with torch.no_grad():
        images = torch.stack([preprocess(Image.open(paths[k]).convert("RGB")) for k in keys])
        image = F.normalize(model.eval().encode_image(images), dim=-1)
        text = F.normalize(model.encode_text(tokenizer(texts)), dim=-1)
    return image, text


# ------------------------------------------------------------------ printed tables


def table_rows(printed: str) -> dict[str, list[str]]:
    """The rows of the tables in ``printed`` (what a command printed, :mod:`vlp.metrics_table`): first
    cell -> the other cells, each stripped of its padding; the header and rule rows included."""
    rows = {}
    for line in printed.splitlines():
        if line.startswith("|") and line.endswith("|"):
            cells = [c.strip() for c in line[1:-1].split("|")]
            rows[cells[0]] = cells[1:]
    return rows


# ------------------------------------------------------------------ scripts and several processes


def load_script(path: str, name: str | None = None) -> ModuleType:
    """The script at ``path`` (relative to ROOT, e.g. ``scripts/gpu/check.py``) imported as the module
    ``name`` (default: the file's stem), which is registered in ``sys.modules`` only while it runs
    (dataclasses look their module up)."""
    spec = importlib.util.spec_from_file_location(name or Path(path).stem, ROOT / path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(
    args: Sequence[str],
    processes: int = 1,
    *,
    deepspeed: str | None = None,
    env: dict[str, str] | None = None,
    timeout: int = 600,
    check: bool = True,
) -> subprocess.CompletedProcess:
    """Run ``python ARGS`` (``-m MODULE ...`` or ``SCRIPT ...``) in ROOT on ``processes`` CPU processes:
    alone when 1 without DeepSpeed, else under ``torch.distributed.run`` on a free port. Offline (no
    Hugging Face downloads), one OpenMP thread per process, and ``env`` on top; ``deepspeed`` names a
    DeepSpeed JSON config (relative to ROOT) for accelerate's DeepSpeed integration, as ``accelerate
    launch`` with configs/accelerate/deepspeed_zero2.yaml sets it up. A run past ``timeout`` seconds
    fails the test with the end of its stderr; with ``check``, so does a non-zero exit status."""
    base = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    run_env = {**os.environ, **base, **(env or {})}
    if deepspeed:
        run_env.update(ACCELERATE_USE_DEEPSPEED="true", ACCELERATE_DEEPSPEED_CONFIG_FILE=str(ROOT / deepspeed))
    cmd = [sys.executable, *args]
    if processes > 1 or deepspeed:
        torchrun = ["-m", "torch.distributed.run", f"--nproc_per_node={processes}", f"--master_port={free_port()}"]
        cmd = [sys.executable, *torchrun, *args]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=run_env)
    except subprocess.TimeoutExpired as e:  # what it printed, whole, not the exception's abridged repr
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        pytest.fail(f"{' '.join(cmd)} timed out after {timeout} s; its stderr ended with:\n{err[-6000:]}")
    if check:
        assert res.returncode == 0, res.stderr[-4000:]
    return res


#: "a red circle" as the tiny presets' BERT tokenizer writes it, padded by one: the tokenizer tests' expectation
RED_CIRCLE_PADDED = ["[CLS]", "a", "red", "circle", "[SEP]", "[PAD]"]

"""The :class:`Job` every training command builds and hands to the loop, and the checks a job's
sizes must pass before it starts (the feature queue against the global batch)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence, Union

import torch
from torch import nn

from vlp.checkpoint import PREPROCESSOR, Preprocessor, preprocessor_of
from vlp.config import FinetuneConfig, ModelConfig, PretrainConfig, to_dict
from vlp.data.image_checks import bad_sample_args, check_images
from vlp.dist import launch_rank
from vlp.errors import ConfigError
from vlp.models.build import model_image_size
from vlp.preprocess.transforms import test_transform, train_transform
from vlp.runs.training.run_dir import prepare_run_dir
from vlp.tasks.objectives import TokenInfo
from vlp.train.loop import train
from vlp.train.setup import make_accelerator
from vlp.train.validation import Validation
from vlp.version import __version__
from vlp.weights import KIND_KEY


@dataclass
class Job:
    """One training run of any command (``vlp pretrain``, ``train-helper``, ``finetune
    retrieval|vqa|nlvr2``, ``pretrain nlvr-ta``; ``vlp bench`` times its steps): what it is made of
    and what :meth:`fit` hands to the loop (:func:`vlp.train.loop.train`).

    A command builds the model and tokenizer, then the training data (``loader``, ``items``), then
    the objective (``task``) around the model; :meth:`start` creates the run directory."""

    kind: str  # the checkpoint kind, state.json "task": pretrain, retrieval, vqa, nlvr2, nlvr-ta
    cfg: Union[PretrainConfig, FinetuneConfig]
    model_cfg: ModelConfig
    model: nn.Module
    tokenizer: Any
    task: Optional[nn.Module] = None  # the training objective around ``model``
    loader: Optional[Iterable] = None  # a DataLoader, or the webdataset ShardLoader
    items: int = 0  # training items: pairs, questions, statements
    images: Optional[int] = None  # distinct training images, where counted (pretraining)
    source: Optional[Path] = None  # the pretrained checkpoint a fine-tuning job starts from
    transfer: dict = field(default_factory=dict)  # what loading it did (:func:`vlp.models.transfer.load_pretrained`)
    micro_batch: Optional[int] = None  # pairs per process per forward for DeepSpeed's config (pretraining)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def run_dir(self) -> Path:
        """The run directory (``output_dir``; created by :meth:`start`)."""
        return Path(self.cfg.output_dir)

    @property
    def res(self) -> int:
        """The model's input resolution."""
        return model_image_size(self.model_cfg)

    def train_transform(self):
        return train_transform(self.res, self.cfg.data.image)

    def test_transform(self):
        return test_transform(self.res, self.cfg.data.image)

    def bad_samples(self, images: Sequence) -> dict:
        """Check the training split's image files (``images``: each with ``image`` and ``origin``;
        :func:`check_images`) and return the training datasets' bad-sample keywords."""
        check_images(images, self.cfg.data)
        return bad_sample_args(self.cfg.data)

    def preprocessor(self) -> Preprocessor:
        """The evaluation preprocessing of the run's checkpoints (``preprocessor.json`` in each)."""
        return preprocessor_of(self.kind, self.cfg, self.model_cfg)

    def start(self) -> Path:
        """Create the run directory (:func:`prepare_run_dir`)."""
        return prepare_run_dir(self.cfg)

    def state(self) -> dict[str, Any]:
        """What every checkpoint's ``state.json`` records besides the step."""
        state = {
            KIND_KEY: self.kind,
            "vlp_version": __version__,
            "config": to_dict(self.cfg),
            "model": to_dict(self.model_cfg),
        }
        return state | ({"pretrained": str(self.source)} if self.source is not None else {})

    def accelerator(self):
        """The run's accelerator (parameters the objective leaves unused are frozen by the task's
        ``unused_parameters``, so DDP runs without ``find_unused_parameters``)."""
        return make_accelerator(self.cfg.train, micro_batch=self.micro_batch)

    def built(self) -> tuple[nn.Module, Iterable]:
        """``(task, loader)``, which the command builds after the model."""
        if self.task is None or self.loader is None:
            raise RuntimeError(f"{self.kind} job: its task and training loader are not built yet")
        return self.task, self.loader

    def fit(self, validation: Optional[Validation] = None) -> None:
        """Train ``task`` on ``loader`` into ``run_dir`` (``train.steps`` steps), validating if given."""
        task, loader = self.built()
        train(
            task,
            loader,
            self.cfg.train,
            self.run_dir,
            self.state(),
            accelerator=self.accelerator(),
            validation=validation,
            max_bad_fraction=self.cfg.data.max_bad_fraction,
            files={PREPROCESSOR: self.preprocessor().to_json()},
        )


def token_info(tokenizer) -> TokenInfo:
    return TokenInfo(len(tokenizer), tokenizer.mask_token_id, tuple(sorted(set(tokenizer.all_special_ids))))


def check_queue(queue_size: int, batch_size: int, key: str = "data.batch_size") -> None:
    """A feature queue receives every rank's batch each step (ALBEF): a smaller one would drop
    features of the batch it is given (0 disables the queue)."""
    world = launch_rank()[1]
    if 0 < queue_size < batch_size * world:
        raise ConfigError(
            f"config keys 'model.queue_size'/'{key}': a queue of {queue_size} is smaller than the global "
            f"batch ({batch_size} x {world} processes = {batch_size * world}) it receives each step; "
            "raise model.queue_size (ALBEF: 65536) or set it to 0 (in-batch negatives only)"
        )

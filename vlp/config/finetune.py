"""Fine-tuning configs: ``vlp finetune TASK`` and ``vlp pretrain nlvr-ta`` (downstream data, VQA,
NLVR2, SNLI-VE and grounding options, the run config and its cross-section rules), and
:func:`load_finetune_config`, which loads one for a task. The tasks and their rules are the
fine-tuning entries of the kind registry (:mod:`vlp.kinds`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from omegaconf import DictConfig, OmegaConf

from vlp.config.data import BadSampleConfig, ImageConfig
from vlp.config.load import check_choice, load_config, reject_broken_rules
from vlp.config.loss import LossConfig
from vlp.config.train import EvalConfig, TrainConfig
from vlp.errors import ConfigError
from vlp.kinds import KINDS, RETRIEVAL, finetune_kinds

# ----------------------------------------------------------------------------- fine-tuning


@dataclass
class FinetuneDataConfig(BadSampleConfig):
    """Downstream data (docs/data.md): annotation files in the ALBEF formats; the bad-sample keys
    (:class:`BadSampleConfig`) apply to the training split."""

    # retrieval: Karpathy train files (one entry per caption, with image_id); vqa: VQA v2 / VG-QA
    # question files; nlvr2: nlvr_train.json; nlvr-ta: pretraining files; ve: ve_train.json;
    # grounding: grounding train files (refcoco+_train.json; val / test: the eval files with boxes).
    train: list[str] = field(default_factory=list)
    val: Optional[str] = None  # validated after every epoch; the best checkpoint is kept
    test: Optional[str] = None  # evaluated once at the end with the best checkpoint
    image_root: Optional[str] = None  # relative image paths (default: each file's folder)
    vg_root: Optional[str] = None  # VQA: images of "dataset": "vg" entries (default: image_root)
    answer_list: Optional[str] = None  # VQA: candidate answers (JSON list of strings)
    batch_size: int = 32
    eval_batch_size: int = 64
    num_workers: int = 0
    image: ImageConfig = field(default_factory=lambda: ImageConfig(crop_scale=[0.5, 1.0]))
    max_len: int = 30  # text tokens (retrieval 30, VQA questions 25, NLVR2 sentences 40)
    # Retrieval / NLVR2-TA captions: pad to each batch's longest or to max_len (see DataConfig).
    text_padding: str = "longest"

    def __post_init__(self) -> None:
        self.check_bad_sample_keys()
        check_choice("data.text_padding", self.text_padding, ["longest", "max_len"])


@dataclass
class VQAConfig:
    k_test: int = 128  # candidates re-scored by their full-sequence likelihood
    answer_max_len: int = 10

    def __post_init__(self) -> None:
        if self.k_test < 1 or self.answer_max_len < 3:
            raise ConfigError(
                f"config keys 'vqa.k_test'/'vqa.answer_max_len': got {self.k_test}/{self.answer_max_len}, "
                "expected >= 1 / >= 3"
            )


@dataclass
class NLVRConfig:
    flip: bool = False  # left/right flip augmentation: swap the images and the words left/right (LAVIS)
    # Baseline: every image replaced by a constant, so the model sees only the sentence.
    text_only: bool = False


@dataclass
class VEConfig:
    # Baseline: every premise image replaced by a constant, so the model sees only the hypothesis.
    hypothesis_only: bool = False


@dataclass
class GroundingConfig:
    """Weakly supervised grounding (``vlp finetune grounding``): how validation and test score the
    candidate boxes, as ``vlp evaluate grounding --layer / --words-only``."""

    layer: Optional[int] = None  # fusion layer whose cross-attention Grad-CAM reads; None: the middle one
    words_only: bool = False  # average the token maps without [CLS] and [SEP] (ALBEF averages all)

    def __post_init__(self) -> None:
        if self.layer is not None and self.layer < 0:
            raise ConfigError(f"config key 'grounding.layer': got {self.layer}, expected a fusion layer >= 0 or null")


@dataclass
class FinetuneConfig:
    """``vlp finetune TASK`` and ``vlp pretrain nlvr-ta``. The model is the
    ``pretrained`` checkpoint's architecture (its config), changed only by ``image_size`` (the
    position embedding is interpolated) and ``model_overrides``."""

    task: str = RETRIEVAL  # what is trained (`vlp finetune TASK`); the checkpoints' kind follows from it
    output_dir: str = "runs/finetune"
    pretrained: Optional[str] = None  # vlp checkpoint folder or run directory
    image_size: Optional[int] = None  # fine-tuning resolution; None: the checkpoint's
    model_overrides: list[str] = field(default_factory=list)  # dotted model keys, e.g. [queue_size=0]
    data: FinetuneDataConfig = field(default_factory=FinetuneDataConfig)
    # Retrieval and grounding: ITC with positives by image id (+ queue of ids) + ITM; loss.alpha /
    # distill / alpha_ramp_steps also drive VQA, NLVR2 and VE distillation.
    loss: LossConfig = field(default_factory=lambda: LossConfig(mlm=0.0, itc_positives="image"))
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    vqa: VQAConfig = field(default_factory=VQAConfig)
    nlvr: NLVRConfig = field(default_factory=NLVRConfig)
    ve: VEConfig = field(default_factory=VEConfig)
    grounding: GroundingConfig = field(default_factory=GroundingConfig)
    eval_every: int = 0  # optimizer steps between validations; 0: once per epoch

    def __post_init__(self) -> None:
        check_choice("task", self.task, finetune_kinds())
        reject_broken_rules([*self._task_rules(), *self._run_rules()])

    def _task_rules(self) -> list[str]:
        """The broken rules of the task's registry entry (:class:`vlp.kinds.Kind`): a contrastive task
        has no MLM head and takes ITC positives by image id; SRCL regulation only where the entry
        allows it; a section another task owns (``Kind.sections``) left at its defaults."""
        task, wrong = KINDS.get(self.task), []
        if task.contrastive:
            wrong += [f"loss.mlm={self.loss.mlm} (the {self.task} model has no MLM head)"] if self.loss.mlm else []
            wrong += (
                [f"loss.itc_positives={self.loss.itc_positives} ({self.task} positives are by image id: image)"]
                if self.loss.itc_positives != "image"
                else []
            )
        for name, other in KINDS.items():
            for section in other.sections if name != self.task else ():
                value = getattr(self, section)
                if value != type(value)():
                    wrong.append(f"{section}.* set for task={self.task} (the {section} section is for task={name})")
        if self.loss.regulation != "none" and not task.regulated:
            regulated = " / ".join(n for n, k in KINDS.items() if k.regulated)
            wrong.append(f"loss.regulation={self.loss.regulation} (SRCL regulates ITC: {regulated} only)")
        return wrong

    def _run_rules(self) -> list[str]:
        """The broken rules of every task: image size, validation interval, fine-tuning image decoding."""
        wrong: list[str] = []
        if self.image_size is not None and self.image_size < 1:
            wrong.append(f"image_size={self.image_size} (expected >= 1 or null)")
        if self.eval_every < 0:
            wrong.append(f"eval_every={self.eval_every} (expected >= 0)")
        if self.train.eval_every:
            wrong.append(
                f"train.eval_every={self.train.eval_every} (pretraining's evaluation of data.eval; fine-tuning "
                "validates data.val every eval_every steps)"
            )
        if self.data.image.uint8:
            wrong.append("data.image.uint8=true (uint8 images normalised on the device: pretraining only)")
        if self.data.image.decode != "full":
            what = {"draft": "JPEG draft decoding per crop", "device": "JPEG decoding on the training device"}
            wrong.append(
                f"data.image.decode={self.data.image.decode} ({what[self.data.image.decode]}: pretraining only; "
                "fine-tuning decodes full)"
            )
        return wrong

    def check_given(self, given: dict[str, str]) -> None:
        """Both ``train.steps`` and ``train.epochs`` set (in the file or on the command line) is an
        error naming both: each sets the run's length, and epochs would silently win."""
        if self.train.epochs is not None and "train.steps" in given:
            raise ConfigError(
                f"config keys 'train.steps'/'train.epochs': both set the run's length (train.steps="
                f"{self.train.steps} ({given['train.steps']}), train.epochs={self.train.epochs} "
                f"({given.get('train.epochs', 'default')})); keep one: train.epochs=null trains for train.steps"
            )


def load_finetune_config(task: str, path: str, overrides: Sequence[str]) -> FinetuneConfig:
    """A fine-tuning config for ``task``; the file's own ``task:`` key, if any, must agree."""
    if Path(path).is_file():
        data = OmegaConf.load(path)  # a top-level list: refused (ConfigError) by load_config below
        declared = data.get("task") if isinstance(data, DictConfig) else None
        if declared is not None and declared != task:
            raise ConfigError(f"{path}: config key 'task' is {declared!r}, but the command is for {task!r}")
    return load_config(FinetuneConfig, path, [*overrides, f"task={task}"])

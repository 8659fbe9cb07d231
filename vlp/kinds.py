"""The kinds of vlp models and tasks: :data:`KINDS`, a :class:`~vlp.registry.Registry` of :class:`Kind`.

A kind is a checkpoint kind (``state.json`` "task", :data:`vlp.weights.KIND_KEY`) or a fine-tuning
task (``vlp finetune TASK``), usually both. Its :class:`Kind` entry holds the *facts* the layers that
dispatch on it read: its help line, its text cleaning and answer preprocessing, the
:class:`vlp.api.VLPModel` capabilities it offers, the config rules of its run and its ALBEF
checkpoint format. Config validation, :mod:`vlp.checkpoint`, :mod:`vlp.api`, :mod:`vlp.runs` and
:mod:`vlp.cli` read it; none of them names a kind.

What a kind *does* registers itself where it is defined, under the kind's name, in the layer that
defines it: the model builder in :data:`vlp.models.build.MODEL_BUILDERS`, the fine-tuning runner in
:data:`vlp.runs.training.finetune.registry.RUNNERS`, the evaluator in
:data:`vlp.runs.evaluation.registry.EVALUATORS`. This module imports none of them (it is the floor
they stand on). The built-in entries are at the end of this file (``docs/architecture.md``,
"Adding a task").
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from vlp.registry import Registry, UnknownName

#: the :class:`~vlp.api.VLPModel` methods of a model with ITC projections (and, with the ALBEF
#: architecture, an ITM head and fusion encoder): encoding, similarity, ITM, Grad-CAM
RETRIEVAL_CAPABILITIES = (
    "encode_image",
    "encode_text",
    "similarity",
    "itm_score",
    "explain",
    "grounding_maps",
    "gradcam_layer",
)


@dataclass(frozen=True)
class Kind:
    """The facts of one kind (registered in :data:`KINDS` under ``name``).

    ``name``: the checkpoint kind / task name. ``about``: the help line of ``vlp finetune NAME``
    ("" : no such subcommand, e.g. ``nlvr-ta``, run by ``vlp pretrain nlvr-ta``). ``finetuned``: a
    fine-tuning task (an accepted ``FinetuneConfig.task``; its checkpoints carry a FinetuneConfig).
    ``checkpoint_kind``: the kind of the checkpoints its fine-tuning writes ("" : its own name).
    ``text_cleaning``: ``pre_caption`` or ALBEF's ``pre_question``. ``candidate_answers``: answers
    ranked from a candidate list (the run's ``vqa`` section: ``answer_max_len``, ``k_test``, the
    answer list saved with :meth:`~vlp.api.VLPModel.save_pretrained`). ``capabilities``: the
    :class:`~vlp.api.VLPModel` methods a checkpoint of this kind runs. ``contrastive``: trained with
    ITC positives by image id and no MLM head (config rule); ``regulated``: SRCL regulation
    (``loss.regulation``) allowed; ``sections``: the :class:`~vlp.config.FinetuneConfig` sections
    only this task may set; ``pretraining``: a pretraining run's checkpoint (the zero-shot evaluation
    protocol takes it); ``albef_format``: the ALBEF checkpoint format it converts to ("" : none)."""

    name: str
    about: str = ""
    finetuned: bool = False
    checkpoint_kind: str = ""
    text_cleaning: str = "pre_caption"
    candidate_answers: bool = False
    capabilities: tuple[str, ...] = ()
    contrastive: bool = False
    regulated: bool = False
    sections: tuple[str, ...] = ()
    pretraining: bool = False
    albef_format: str = ""

    @property
    def saves_as(self) -> str:
        """The kind of the checkpoints this task writes (its own name unless ``checkpoint_kind``)."""
        return self.checkpoint_kind or self.name


#: every kind by name, in registration order (``KINDS.register(name, Kind(name, ...))``)
KINDS: Registry[Kind] = Registry("kind")


def checkpoint_kinds() -> tuple[str, ...]:
    """The kinds a checkpoint can be (every entry whose fine-tuning saves under its own name)."""
    return tuple(n for n, k in KINDS.items() if k.saves_as == n)


def finetune_kinds() -> tuple[str, ...]:
    """The fine-tuning tasks (the accepted values of ``FinetuneConfig.task``)."""
    return tuple(n for n, k in KINDS.items() if k.finetuned)


def is_finetuned(name: str) -> bool:
    """Whether ``name`` is a registered fine-tuning task (its checkpoints carry a FinetuneConfig)."""
    return name in KINDS and KINDS.get(name).finetuned


def albef_formats() -> tuple[str, ...]:
    """The official ALBEF checkpoint layouts the converter reads: every entry's :attr:`Kind.albef_format`,
    each once, in registration order."""
    return tuple(dict.fromkeys(k.albef_format for _, k in KINDS.items() if k.albef_format))


def of_albef_format(albef_format: str) -> Kind:
    """The first registered entry whose checkpoints convert from the ALBEF layout ``albef_format``
    (:attr:`Kind.albef_format`); :class:`~vlp.registry.UnknownName` if none does."""
    for _, entry in KINDS.items():
        if entry.albef_format == albef_format:
            return entry
    raise UnknownName(f"no kind converts from the ALBEF layout {albef_format!r}; known: {list(albef_formats())}")


def kinds_with(capability: str) -> tuple[str, ...]:
    """The checkpoint kinds whose VLPModel offers method ``capability``, in registration order."""
    return tuple(n for n in checkpoint_kinds() if capability in KINDS.get(n).capabilities)


# ----------------------------------------------------------------------------- the built-in kinds

#: the names of the built-in kinds: every module that selects behaviour by one imports it from here
PRETRAIN = "pretrain"
HELPER = "helper"
RETRIEVAL = "retrieval"
VQA = "vqa"
NLVR2 = "nlvr2"
NLVR_TA = "nlvr-ta"
VE = "ve"
GROUNDING = "grounding"
#: the NLVR family's short name: ALBEF's checkpoint layout of ``nlvr2`` and ``nlvr-ta``, the
#: :class:`~vlp.api.VLPModel` method of an ``nlvr2`` checkpoint and its training loss's key
NLVR = "nlvr"

_PRETRAINED = Kind(PRETRAIN, capabilities=RETRIEVAL_CAPABILITIES, pretraining=True, albef_format=PRETRAIN)

for _entry in (
    _PRETRAINED,
    replace(_PRETRAINED, name=HELPER),
    Kind(
        RETRIEVAL,
        "image-text retrieval (ITC by image id + ITM), COCO / Flickr30k Karpathy files",
        finetuned=True,
        capabilities=RETRIEVAL_CAPABILITIES,
        contrastive=True,
        regulated=True,
        albef_format=RETRIEVAL,
    ),
    Kind(
        VQA,
        "VQA v2 (+ VG-QA): answer decoder, ranked candidate answers",
        finetuned=True,
        text_cleaning="pre_question",
        candidate_answers=True,
        capabilities=("answer",),
        albef_format=VQA,
    ),
    Kind(
        NLVR2,
        "NLVR2: a sentence about two images, doubled fusion layers",
        finetuned=True,
        capabilities=(NLVR,),
        albef_format=NLVR,
    ),
    Kind(NLVR_TA, finetuned=True, albef_format=NLVR),
    Kind(
        VE,
        "SNLI-VE: image premise + hypothesis -> entailment / neutral / contradiction",
        finetuned=True,
        capabilities=("entailment",),
        albef_format=VE,
    ),
    Kind(
        GROUNDING,
        "weakly supervised grounding: ITC + ITM on referring expressions, validated by Grad-CAM boxes",
        finetuned=True,
        checkpoint_kind=RETRIEVAL,
        contrastive=True,
        sections=(GROUNDING,),
    ),
):
    KINDS.register(_entry.name, _entry)

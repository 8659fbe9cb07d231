"""The kinds of vlp models and tasks, in one registry: :func:`kind`, :func:`register_kind`.

A kind is a checkpoint kind (``state.json`` "task", :data:`vlp.weights.KIND_KEY`) or a fine-tuning
task (``vlp finetune TASK``), usually both. Its :class:`Kind` entry says everything the layers that
dispatch on it need: the model it builds, its text cleaning and answer preprocessing, its
fine-tuning runner and evaluator, the :class:`vlp.api.VLPModel` capabilities it offers, the config
rules of its run and its ALBEF checkpoint format. Config validation, :mod:`vlp.models.build`,
:mod:`vlp.checkpoint`, :mod:`vlp.api`, :mod:`vlp.runs` and :mod:`vlp.cli` read it; none of them
names a kind.

This module sits below every layer that reads it, so the parts of an entry that live in higher
layers (the model builder, the runner, the evaluator, the per-kind actions) are *references*: a
``"module:attribute"`` string imported on first use (:func:`resolve`), or the callable itself (an
entry registered at run time, e.g. a test's toy task). The built-in entries are at the end of this
file (``docs/architecture.md``, "Adding a task").
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping, Optional, Union

from vlp.registry import Registry

#: a part of an entry in a higher layer: ``"module:attribute"`` or the callable itself
Ref = Union[str, Callable[..., Any]]

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


class UnknownKind(KeyError):
    """A kind name no entry of the registry has; the message names the known kinds."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


@dataclass(frozen=True)
class Kind:
    """One entry of the registry.

    ``name``: the checkpoint kind / task name. ``model``: ``(ModelConfig, vocab_size) -> nn.Module``,
    the model of this kind (ALBEF architecture; a ``model.arch=dual`` config builds the dual encoder
    whatever the kind). ``about``: the help line of ``vlp finetune NAME`` ("" : no such subcommand,
    e.g. ``nlvr-ta``, run by ``vlp pretrain nlvr-ta``). ``finetune``: ``(FinetuneConfig) -> results
    dict``, the fine-tuning runner (None: a pretraining kind). ``evaluate``: ``(checkpoint, data, out,
    image_root=None) -> metrics dict``, the evaluator of :func:`vlp.runs.evaluation.by_kind.run_evaluate`
    (None: none). ``checkpoint_kind``: the kind of the checkpoints its fine-tuning writes ("" : its
    own name). ``text_cleaning``: ``pre_caption`` or ALBEF's ``pre_question``. ``candidate_answers``:
    answers ranked from a candidate list (the run's ``vqa`` section: ``answer_max_len``, ``k_test``,
    the answer list saved with :meth:`~vlp.api.VLPModel.save_pretrained`). ``capabilities``: the
    :class:`~vlp.api.VLPModel` methods a checkpoint of this kind runs; ``actions``: those of them
    implemented outside ``VLPModel`` (method name -> ``(vlp_model, *args, **kwargs) -> result``).
    ``contrastive``: trained with ITC positives by image id and no MLM head (config rule);
    ``regulated``: SRCL regulation (``loss.regulation``) allowed; ``sections``: the
    :class:`~vlp.config.FinetuneConfig` sections only this task may set; ``pretraining``: a
    pretraining run's checkpoint (the zero-shot evaluation protocol takes it); ``albef_format``: the
    ALBEF checkpoint format it converts to ("" : none)."""

    name: str
    model: Ref
    about: str = ""
    finetune: Optional[Ref] = None
    evaluate: Optional[Ref] = None
    checkpoint_kind: str = ""
    text_cleaning: str = "pre_caption"
    candidate_answers: bool = False
    capabilities: tuple[str, ...] = ()
    actions: Mapping[str, Ref] = field(default_factory=dict)
    contrastive: bool = False
    regulated: bool = False
    sections: tuple[str, ...] = ()
    pretraining: bool = False
    albef_format: str = ""

    @property
    def saves_as(self) -> str:
        """The kind of the checkpoints this task writes (its own name unless ``checkpoint_kind``)."""
        return self.checkpoint_kind or self.name

    def build_model(self, model_config: Any, vocab_size: int) -> Any:
        """The model of this kind (``model`` resolved and called)."""
        return resolve(self.model)(model_config, vocab_size)

    def runner(self) -> Callable[..., dict]:
        """The fine-tuning runner; a pretraining kind raises :class:`UnknownKind`."""
        if self.finetune is None:
            raise UnknownKind(f"kind {self.name!r} is not fine-tuned; fine-tuning tasks: {list(finetune_kinds())}")
        return resolve(self.finetune)

    def evaluator(self) -> Callable[..., dict]:
        """The evaluator; a kind without one raises :class:`UnknownKind` naming the kinds that have one."""
        if self.evaluate is None:
            have = [k.name for k in _REGISTRY.values() if k.evaluate is not None]
            raise UnknownKind(f"kind {self.name!r} has no evaluator; kinds with one: {have}")
        return resolve(self.evaluate)

    def action(self, method: str) -> Optional[Callable[..., Any]]:
        """The implementation of VLPModel method ``method`` for this kind, or None if it has none."""
        ref = self.actions.get(method)
        return resolve(ref) if ref is not None else None


def resolve(ref: Ref) -> Callable[..., Any]:
    """A reference as the callable it names (``"package.module:attribute"`` imported)."""
    if callable(ref):
        return ref
    module, _, attribute = ref.partition(":")
    return getattr(importlib.import_module(module), attribute)


#: every kind by name, in registration order
KINDS: Registry[Kind] = Registry("kind")
_REGISTRY = KINDS._entries


def register_kind(entry: Kind, replace: bool = False) -> Kind:
    """Add ``entry`` to the registry (after the entries there: the order of :func:`kind_names`) and
    return it; a name already registered raises ``ValueError`` unless ``replace``."""
    if entry.name in _REGISTRY and not replace:
        raise ValueError(f"kind {entry.name!r} is registered already")
    _REGISTRY[entry.name] = entry
    return entry


def unregister_kind(name: str) -> Kind:
    """Remove the entry ``name`` (a test's toy task, after the test); returns it."""
    return _REGISTRY.pop(kind(name).name)


def kind(name: str) -> Kind:
    """The entry of ``name``; an unknown name raises :class:`UnknownKind` naming the known kinds."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownKind(f"unknown kind {name!r}; known kinds: {list(_REGISTRY)}") from None


def is_kind(name: str) -> bool:
    """Whether ``name`` has an entry."""
    return name in _REGISTRY


def kinds() -> Mapping[str, Kind]:
    """Every entry by name, in registration order (read-only)."""
    return MappingProxyType(_REGISTRY)


def kind_names() -> tuple[str, ...]:
    """The names of every entry, in registration order."""
    return tuple(_REGISTRY)


def checkpoint_kinds() -> tuple[str, ...]:
    """The kinds a checkpoint can be (every entry whose fine-tuning saves under its own name)."""
    return tuple(k.name for k in _REGISTRY.values() if k.saves_as == k.name)


def finetune_kinds() -> tuple[str, ...]:
    """The fine-tuning tasks (the accepted values of ``FinetuneConfig.task``)."""
    return tuple(k.name for k in _REGISTRY.values() if k.finetune is not None)


def is_finetuned(name: str) -> bool:
    """Whether ``name`` is a registered fine-tuning task (its checkpoints carry a FinetuneConfig)."""
    return name in _REGISTRY and _REGISTRY[name].finetune is not None


def albef_formats() -> tuple[str, ...]:
    """The official ALBEF checkpoint layouts the converter reads: every entry's :attr:`Kind.albef_format`,
    each once, in registration order."""
    return tuple(dict.fromkeys(k.albef_format for k in _REGISTRY.values() if k.albef_format))


def of_albef_format(albef_format: str) -> Kind:
    """The first registered entry whose checkpoints convert from the ALBEF layout ``albef_format``
    (:attr:`Kind.albef_format`); :class:`UnknownKind` if none does."""
    for entry in _REGISTRY.values():
        if entry.albef_format == albef_format:
            return entry
    raise UnknownKind(f"no kind converts from the ALBEF layout {albef_format!r}; known: {list(albef_formats())}")


def kinds_with(capability: str) -> tuple[str, ...]:
    """The checkpoint kinds whose VLPModel offers method ``capability``, in registration order."""
    return tuple(n for n in checkpoint_kinds() if capability in _REGISTRY[n].capabilities)


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

_BUILD = "vlp.models.build:"
_FINETUNE = "vlp.runs.training.finetune:"
_EVALUATE = "vlp.runs.evaluation.by_kind:"
#: the Grad-CAM actions of the kinds with an ITM head (:mod:`vlp.api.gradcam`)
GRADCAM_ACTIONS = {m: "vlp.api.gradcam:" + m for m in ("explain", "grounding_maps", "gradcam_layer")}

for _entry in (
    Kind(
        PRETRAIN,
        _BUILD + "albef_with_mlm",
        evaluate=_EVALUATE + "evaluate_retrieval",
        capabilities=RETRIEVAL_CAPABILITIES,
        actions=GRADCAM_ACTIONS,
        pretraining=True,
        albef_format=PRETRAIN,
    ),
    Kind(
        HELPER,
        _BUILD + "albef_with_mlm",
        evaluate=_EVALUATE + "evaluate_retrieval",
        capabilities=RETRIEVAL_CAPABILITIES,
        actions=GRADCAM_ACTIONS,
        pretraining=True,
        albef_format=PRETRAIN,
    ),
    Kind(
        RETRIEVAL,
        _BUILD + "albef_retrieval",
        about="image-text retrieval (ITC by image id + ITM), COCO / Flickr30k Karpathy files",
        finetune=_FINETUNE + "run_finetune_retrieval",
        evaluate=_EVALUATE + "evaluate_retrieval",
        capabilities=RETRIEVAL_CAPABILITIES,
        actions=GRADCAM_ACTIONS,
        contrastive=True,
        regulated=True,
        albef_format=RETRIEVAL,
    ),
    Kind(
        VQA,
        _BUILD + "vqa_model",
        about="VQA v2 (+ VG-QA): answer decoder, ranked candidate answers",
        finetune=_FINETUNE + "run_finetune_vqa",
        evaluate=_EVALUATE + "evaluate_vqa",
        text_cleaning="pre_question",
        candidate_answers=True,
        capabilities=("answer",),
        actions={"answer": "vlp.api.answer:answer"},
        albef_format=VQA,
    ),
    Kind(
        NLVR2,
        _BUILD + "nlvr_model",
        about="NLVR2: a sentence about two images, doubled fusion layers",
        finetune=_FINETUNE + "run_finetune_nlvr",
        evaluate=_EVALUATE + "evaluate_nlvr",
        capabilities=(NLVR,),
        actions={NLVR: "vlp.api.classify:nlvr"},
        albef_format=NLVR,
    ),
    Kind(NLVR_TA, _BUILD + "nlvr_ta_model", finetune=_FINETUNE + "run_nlvr_ta", albef_format=NLVR),
    Kind(
        VE,
        _BUILD + "ve_model",
        about="SNLI-VE: image premise + hypothesis -> entailment / neutral / contradiction",
        finetune=_FINETUNE + "run_finetune_ve",
        evaluate=_EVALUATE + "evaluate_ve",
        capabilities=("entailment",),
        actions={"entailment": "vlp.api.classify:entailment"},
        albef_format=VE,
    ),
    Kind(
        GROUNDING,
        _BUILD + "albef_retrieval",
        about="weakly supervised grounding: ITC + ITM on referring expressions, validated by Grad-CAM boxes",
        finetune=_FINETUNE + "run_finetune_grounding",
        evaluate="vlp.runs.evaluation.gradcam_grounding:run_evaluate_grounding",
        checkpoint_kind=RETRIEVAL,
        contrastive=True,
        sections=(GROUNDING,),
    ),
):
    register_kind(_entry)

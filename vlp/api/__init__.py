"""Inference API: :class:`VLPModel` loads any vlp checkpoint (or a :meth:`VLPModel.save_pretrained`
directory) and encodes, scores and answers with it, batched and without gradients.

    from vlp import VLPModel
    m = VLPModel.from_pretrained("runs/x")
    m.similarity(["a.jpg"], ["a caption"])

A ``save_pretrained`` directory (docs/api.md) holds exactly:

* ``config.json``: format marker, vlp version, checkpoint kind, the model config, where the weights
  came from, and for a kind that ranks candidate answers (VQA) its answers and ``k_test``, under
  the kind's name (``vqa``);
* ``model.safetensors``: the inference weights. **Momentum twins and feature queues are dropped**
  (they only serve training; a pretraining file shrinks to about half). Loading builds the model of
  the kind with an empty queue and allows exactly the ``momentum.twin.*`` and ``queue.*`` keys to be
  missing (every other key is loaded strictly), then sets the twin to a copy of the online weights;
* the tokenizer files of ``tokenizer.save_pretrained`` (``tokenizer.json``, ``tokenizer_config.json``
  with transformers 5);
* ``preprocessor.json``: image size, resize mode, mean/std, minimum image side, caption cleaning,
  ``max_len`` and padding;
* ``manifest.json``: every other file's size and SHA-256, written last (as in a checkpoint folder);
  :meth:`VLPModel.from_pretrained` checks them all before loading (a directory without one is
  refused: nothing in it could be checked).

Loading such a directory goes through no training code (no :mod:`vlp.runs`, no loaders); a
checkpoint folder or run directory is opened with :func:`vlp.checkpoint.open_checkpoint` (manifest
verified, read once; its ``preprocessor.json`` where training wrote one).
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence, Union

import torch
from PIL import Image
from torch import nn

from vlp.api.classify import VE_LABELS
from vlp.api.gradcam import Explanation
from vlp.api.inputs import ImageLike, Images, Texts, as_list, inference
from vlp.checkpoint import PREPROCESSOR, Preprocessor, open_checkpoint
from vlp.config import FinetuneConfig, ModelConfig, from_dict, to_dict
from vlp.config.model import ARCH_DUAL
from vlp.errors import CheckpointError
from vlp.hardware import default_device
from vlp.interop.zoo import resolve_pretrained
from vlp.kinds import NLVR, checkpoint_kinds, kinds_with
from vlp.kinds import kind as kind_entry
from vlp.models.build import build_model_of_kind, without_init_sources
from vlp.preprocess.images import open_image, to_rgb, upscale_tiny
from vlp.preprocess.transforms import tokenize
from vlp.version import __version__
from vlp.weights import (
    TOKENIZER_FILES,
    load_weights_file,
    publish,
    refuse_unlisted,
    removed_on_failure,
    save_tensors,
    staging,
    verify_checkpoint,
    weights_to_save,
)

__all__ = [
    "CONFIG",
    "DROPPED",
    "FORMAT",
    "FORMAT_VERSION",
    "PREPROCESSOR",
    "VE_LABELS",
    "WEIGHTS",
    "Explanation",
    "ImageLike",
    "Images",
    "Preprocessor",
    "Texts",
    "UnsupportedKind",
    "VLPModel",
    "build_inference_model",
    "inference_weights",
    "load_inference_weights",
]

FORMAT, FORMAT_VERSION = "vlp-pretrained", 1
CONFIG, WEIGHTS = "config.json", "model.safetensors"
#: state-dict prefixes save_pretrained leaves out (training-only state)
DROPPED = ("momentum.", "queue.")


class UnsupportedKind(ValueError):
    """A method the loaded checkpoint kind cannot run (e.g. ``answer`` on a pretraining checkpoint)."""


def build_inference_model(kind: str, model: ModelConfig, vocab_size: int) -> nn.Module:
    """The model of a checkpoint kind (:func:`vlp.models.build.build_model_of_kind`) with every
    initialisation source off (the weights come from the file) and an empty feature queue."""
    cfg = copy.deepcopy(model)
    without_init_sources(cfg)
    cfg.queue_size = 0
    return build_model_of_kind(kind, cfg, vocab_size)


def inference_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """What ``model.safetensors`` holds: the checkpoint tensors (one name per tied group) without
    momentum twins and queues."""
    return {k: v for k, v in weights_to_save(model).items() if not k.startswith(DROPPED)}


def load_inference_weights(model: nn.Module, path: Path) -> None:
    """Strictly load an inference ``model.safetensors``: only tied aliases and the dropped
    ``momentum.twin.*`` / ``queue.*`` keys may be missing; the twin becomes a copy of the online weights."""
    load_weights_file(model, path, allow_missing=["momentum.twin.*", "queue.*"])
    twin = getattr(model, "momentum", None)
    if twin is not None:
        twin.copy_from_online()


class VLPModel:
    """A loaded vlp model with its config, tokenizer and evaluation preprocessing.

    Methods take one or several images (paths, PIL images, or tensors [3, H, W] / [N, 3, H, W]
    already preprocessed like :meth:`pixel_values`) and one or several strings; they run under
    ``torch.no_grad()`` in eval mode (the model's modes restored after) in batches of ``batch_size``
    and return CPU tensors. What a kind can do is its registry entry's ``capabilities``
    (:mod:`vlp.kinds`): ``encode_image`` / ``encode_text`` / ``similarity``: pretrain, helper,
    retrieval (ALBEF or dual encoder); ``itm_score`` and the Grad-CAM methods: the same kinds with an
    ALBEF fusion encoder; ``answer``: vqa; ``nlvr``: nlvr2; ``entailment``: ve. Anything else raises
    :class:`UnsupportedKind`. The class itself loads, saves, encodes and scores; the per-kind
    actions (Grad-CAM, answer, nlvr, entailment) are the entry's ``actions``, in :mod:`vlp.api.gradcam`,
    :mod:`vlp.api.answer` and :mod:`vlp.api.classify`.
    """

    def __init__(
        self,
        model: nn.Module,
        kind: str,
        model_config: ModelConfig,
        tokenizer,
        preprocessor: Preprocessor,
        answers: Optional[list[str]] = None,
        vqa_k_test: int = 128,
        source: Optional[dict] = None,
        batch_size: int = 64,
    ) -> None:
        if kind not in checkpoint_kinds():
            raise CheckpointError(f"unknown checkpoint kind {kind!r}; expected one of {list(checkpoint_kinds())}")
        self.model, self.kind, self.model_config = model.eval(), kind, model_config
        self.tokenizer, self.preprocessor = tokenizer, preprocessor
        self.answers, self.vqa_k_test, self.source = answers, vqa_k_test, source or {}
        self.batch_size = batch_size
        self.transform = preprocessor.image_transform()

    # -- loading and saving --------------------------------------------------------------------

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | os.PathLike,
        device: Optional[str | torch.device] = None,
        batch_size: int = 64,
        revision: Optional[str] = None,
    ) -> VLPModel:
        """Load a :meth:`save_pretrained` directory, a checkpoint folder or a run directory (its
        newest valid checkpoint), a zoo tag (:func:`vlp.list_pretrained`: downloaded and converted
        on first use, :func:`vlp.interop.zoo.fetch`) or a Hugging Face Hub id ``org/name`` (at
        ``revision``; through ``huggingface_hub``'s cache, offline with ``HF_HUB_OFFLINE=1``).
        ``device``: default CUDA if available, else CPU."""
        path = resolve_pretrained(name_or_path, revision=revision)
        device = torch.device(device) if device is not None else default_device()
        if (path / CONFIG).is_file():
            return cls._from_directory(path, device, batch_size)
        return cls._from_checkpoint(path, device, batch_size)

    @classmethod
    def _from_directory(cls, path: Path, device: torch.device, batch_size: int) -> VLPModel:
        from transformers import BertTokenizerFast

        # every file against manifest.json (if it has one); an unlisted file the loader reads is refused
        verify_checkpoint(path, (CONFIG, PREPROCESSOR), reads=(CONFIG, PREPROCESSOR, WEIGHTS))
        refuse_unlisted(path, TOKENIZER_FILES, "tokenizer")  # and no tokenizer file beside the listed ones
        config = json.loads((path / CONFIG).read_text())
        if config.get("format") != FORMAT:
            raise CheckpointError(
                f"{path / CONFIG}: not a vlp save_pretrained config (format {config.get('format')!r})"
            )
        if config.get("format_version", 0) > FORMAT_VERSION:
            raise CheckpointError(
                f"{path}: format version {config['format_version']} is newer than this vlp reads "
                f"({FORMAT_VERSION}); upgrade vlp"
            )
        kind, mcfg = config["kind"], from_dict(ModelConfig, config["model"])
        pre = Preprocessor(**json.loads((path / PREPROCESSOR).read_text()))
        tokenizer = BertTokenizerFast.from_pretrained(str(path))
        model = build_inference_model(kind, mcfg, len(tokenizer))
        load_inference_weights(model, path / WEIGHTS)
        vqa = config.get(kind) or {}  # a kind with candidate answers: under its name (config_dict)
        return cls(
            model.to(device),
            kind,
            mcfg,
            tokenizer,
            pre,
            vqa.get("answers"),
            vqa.get("k_test", 128),
            config.get("source"),
            batch_size,
        )

    @classmethod
    def _from_checkpoint(cls, path: Path, device: torch.device, batch_size: int) -> VLPModel:
        from vlp.data.downstream_formats import load_answer_list

        ckpt = open_checkpoint(path, device)
        answers, k_test, data = None, 128, ckpt.pretrain_config.data.train
        if isinstance(ckpt.config, FinetuneConfig):  # the fine-tuning run's settings
            ft = ckpt.config
            k_test, data = ft.vqa.k_test, ft.data.train
            if kind_entry(ckpt.kind).candidate_answers and ft.data.answer_list and Path(ft.data.answer_list).is_file():
                answers = load_answer_list(ft.data.answer_list)
        source = {
            "checkpoint": str(ckpt.path.resolve()),
            "step": ckpt.state.get("step"),
            "vlp_version": ckpt.state.get("vlp_version"),
            "data": [str(f) for f in data] if isinstance(data, list) else data,
        }
        return cls(
            ckpt.load(),
            ckpt.kind,
            ckpt.model_config,
            ckpt.tokenizer,
            ckpt.preprocessor,
            answers,
            k_test,
            source,
            batch_size,
        )

    def save_pretrained(self, directory: str | os.PathLike) -> Path:
        """Write ``config.json``, ``model.safetensors`` (no momentum twins or queues), the tokenizer
        files and ``preprocessor.json`` into ``directory`` (written next to it, then renamed). An
        existing directory is replaced only if it is empty or an earlier ``save_pretrained`` output;
        a write that fails (a full disk: one :class:`CheckpointError` saying to free space or choose
        another folder) leaves it as it was."""
        out = Path(directory)
        if out.exists() and any(out.iterdir()) and not (out / CONFIG).is_file():
            raise FileExistsError(f"{out} exists and is not a vlp save_pretrained directory; choose another")
        tmp = staging(out)
        kept = f"{out} is as it was" if out.exists() else f"nothing was left at {out}"
        advice = (
            f"free some space, or save to a folder on another disk; {kept} (the new files were written "
            f"to {tmp} first, now removed)"
        )
        with removed_on_failure(tmp, out, advice):
            save_tensors(inference_weights(self.model), tmp / WEIGHTS, metadata={"format": "pt"})
            (tmp / CONFIG).write_text(json.dumps(self.config_dict(), indent=2) + "\n")
            (tmp / PREPROCESSOR).write_text(self.preprocessor.to_json())
            self.tokenizer.save_pretrained(str(tmp))
            return publish(tmp, out)

    def push_to_hub(
        self,
        repo_id: str,
        private: bool = False,
        token: Optional[str] = None,
        metrics: Optional[dict[str, float]] = None,
        data: Optional[str] = None,
        commit_message: Optional[str] = None,
    ) -> str:
        """Upload the :meth:`save_pretrained` folder to the Hugging Face Hub repository ``repo_id``
        (created if needed), with a model card (``README.md``: kind, config, ``data``, ``metrics``);
        returns the commit URL. ``token``: default the logged-in user's (``hf auth login``)."""
        import tempfile

        from vlp.interop.hub import model_card, upload

        with tempfile.TemporaryDirectory() as tmp:
            folder = self.save_pretrained(Path(tmp) / "model")
            (folder / "README.md").write_text(model_card(self.config_dict(), metrics, data))
            return upload(folder, repo_id, private, token, commit_message)

    def config_dict(self) -> dict:
        """The content of ``config.json``."""
        model_config = copy.deepcopy(self.model_config)
        without_init_sources(model_config)
        model = to_dict(model_config)
        out = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "vlp_version": __version__,
            "kind": self.kind,
            "architecture": type(self.model).__name__,
            "model": model,
            "weights": {"file": WEIGHTS, "momentum_twins": "dropped", "queues": "dropped"},
            "source": self.source,
        }
        if kind_entry(self.kind).candidate_answers:
            out[self.kind] = {"k_test": self.vqa_k_test, "answers": self.answers}
        return out

    # -- preprocessing -------------------------------------------------------------------------

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _image_tensor(self, image: ImageLike, i: int) -> torch.Tensor:
        if isinstance(image, torch.Tensor):
            return image
        if isinstance(image, Image.Image):
            im = upscale_tiny(to_rgb(image), self.preprocessor.min_side)  # as open_image does for files
        else:
            im = open_image(str(image), f"image {i}", min_side=self.preprocessor.min_side)
        return self.transform(im)

    def image_list(self, images: Images) -> list:
        """The images of a method's argument as a list (a batch tensor [N, 3, H, W] unbound)."""
        if isinstance(images, torch.Tensor) and images.dim() == 4:
            return list(images.unbind(0))
        return as_list(images, (str, os.PathLike, Image.Image))

    def pixel_values(self, images: Images) -> torch.Tensor:
        """Preprocessed images [N, 3, S, S] (the evaluation transform; tensors pass unchanged)."""
        return torch.stack([self._image_tensor(im, i) for i, im in enumerate(self.image_list(images))])

    def image_batches(self, images: Images, batch_size: Optional[int]) -> Iterator[torch.Tensor]:
        """The preprocessed images, ``batch_size`` (default :attr:`batch_size`) at a time: [B, 3, S, S]
        on the model's device."""
        items, bs = self.image_list(images), batch_size or self.batch_size
        for s in range(0, len(items), bs):
            yield torch.stack([self._image_tensor(im, s + j) for j, im in enumerate(items[s : s + bs])]).to(self.device)

    def tokenize(self, texts: Texts) -> dict[str, torch.Tensor]:
        """``input_ids`` / ``attention_mask`` [N, T] of captions (:func:`vlp.preprocess.transforms.tokenize`:
        ``pre_caption``, ``max_len`` tokens, padded to the longest)."""
        return tokenize(self.tokenizer, as_list(texts, (str,)), self.preprocessor.max_len)

    # -- capabilities --------------------------------------------------------------------------

    def _require(self, method: str, what: str, fusion: bool = False) -> None:
        """Raise :class:`UnsupportedKind` unless the checkpoint's kind offers VLPModel method ``method``
        (:attr:`vlp.kinds.Kind.capabilities`; ``fusion``: and the model has a fusion encoder); the
        message names ``what`` it needs and the kinds that have it."""
        kinds = kinds_with(method)
        dual = self.model_config.arch == ARCH_DUAL
        if self.kind not in kinds or (fusion and dual):
            arch = " with model.arch=dual (no fusion encoder)" if dual else ""
            raise UnsupportedKind(
                f"VLPModel.{method} needs {what} ({' or '.join(kinds)} checkpoint"
                f"{', model.arch=albef' if fusion else ''}); this is a {self.kind} checkpoint{arch}"
            )

    # -- retrieval -----------------------------------------------------------------------------

    @inference
    def encode_image(self, images: Images, batch_size: Optional[int] = None) -> torch.Tensor:
        """L2-normalised ITC image features [N, D] (D = ``model.embed_dim``)."""
        self._require("encode_image", "ITC projections")
        return torch.cat([self.model.encode_image(b).feat.cpu() for b in self.image_batches(images, batch_size)])

    @inference
    def encode_text(self, texts: Texts, batch_size: Optional[int] = None) -> torch.Tensor:
        """L2-normalised ITC text features [N, D]."""
        self._require("encode_text", "ITC projections")
        tok, bs = self.tokenize(texts), batch_size or self.batch_size
        ids, mask = tok["input_ids"].to(self.device), tok["attention_mask"].to(self.device)
        return torch.cat(
            [self.model.encode_text(ids[s : s + bs], mask[s : s + bs]).feat.cpu() for s in range(0, len(ids), bs)]
        )

    @inference
    def similarity(self, images: Images, texts: Texts, batch_size: Optional[int] = None) -> torch.Tensor:
        """ITC cosine similarities [N_img, N_txt] (not divided by the temperature)."""
        return self.encode_image(images, batch_size) @ self.encode_text(texts, batch_size).T

    @inference
    def itm_score(self, images: Images, texts: Texts, batch_size: Optional[int] = None) -> torch.Tensor:
        """Match probability [N] of aligned pairs (``images[i]``, ``texts[i]``): the ITM head's
        softmax class 1 on the fused [CLS] state."""
        self._require("itm_score", "the ITM head", fusion=True)
        tok, bs = self.tokenize(texts), batch_size or self.batch_size
        n_img = len(self.image_list(images))
        if n_img != len(tok["input_ids"]):
            raise ValueError(f"itm_score scores aligned pairs: got {n_img} images and {len(tok['input_ids'])} texts")
        ids, mask = tok["input_ids"].to(self.device), tok["attention_mask"].to(self.device)
        out = []
        for k, pixels in enumerate(self.image_batches(images, bs)):
            rows = slice(k * bs, k * bs + len(pixels))
            tokens = self.model.encode_image(pixels).tokens
            fused = self.model.fuse(self.model.text_states(ids[rows], mask[rows]), mask[rows], tokens)
            out.append(self.model.itm_logits(fused).float().softmax(-1)[:, 1].cpu())
        return torch.cat(out)

    # -- the per-kind actions (vlp.kinds.Kind.actions) ------------------------------------------

    def _action(self, method: str, what: str, fusion: bool = False) -> Callable[..., Any]:
        """The checkpoint kind's implementation of ``method`` (:attr:`vlp.kinds.Kind.actions`), after
        :meth:`_require` (``what`` it needs, ``fusion``: a fusion encoder)."""
        self._require(method, what, fusion)
        action = kind_entry(self.kind).action(method)
        if action is None:
            raise UnsupportedKind(f"VLPModel.{method}: the {self.kind} kind registers no implementation of it")
        return action

    def explain(self, image: ImageLike, text: str, layer: Optional[int] = None) -> Explanation:
        """Grad-CAM of the ITM match logit over the cross-attention of fusion layer ``layer``
        (default: the middle one, :func:`vlp.models.gradcam.default_layer`) for one image and one
        text: a map [h, w] per token (ALBEF's visualisation notebook; docs in
        :mod:`vlp.models.gradcam`). Needs gradients, so it runs in eval mode but not under
        ``no_grad``; the model's parameters get no ``.grad``. (:func:`vlp.api.gradcam.explain`)"""
        return self._action("explain", "the ITM head", fusion=True)(self, image, text, layer)

    def grounding_maps(
        self,
        images: Images,
        texts: Texts,
        layer: Optional[int] = None,
        batch_size: Optional[int] = None,
        words_only: bool = False,
    ) -> torch.Tensor:
        """The Grad-CAM grounding map [N, h, w] of each aligned pair (``images[i]``, ``texts[i]``):
        the per-token maps of :meth:`explain` averaged over the text's tokens
        (:func:`vlp.models.gradcam.token_mean`; ``words_only`` leaves out [CLS] and [SEP])."""
        action = self._action("grounding_maps", "the ITM head", fusion=True)
        return action(self, images, texts, layer, batch_size, words_only)

    def gradcam_layer(self, layer: Optional[int] = None) -> int:
        """The fusion layer Grad-CAM uses for ``layer`` (None: the middle one); one the model does
        not have raises ``ValueError``."""
        return self._action("gradcam_layer", "the ITM head", fusion=True)(self, layer)

    @inference
    def answer(
        self,
        images: Images,
        questions: Texts,
        candidates: Optional[Sequence[str]] = None,
        k: Optional[int] = None,
        batch_size: Optional[int] = None,
    ) -> list[str]:
        """The answer to each (image, question) pair, ranked over ``candidates`` (default: the
        checkpoint's answer list) with ALBEF's two-step ranking: the ``k`` candidates (default the
        fine-tuning run's ``vqa.k_test``) with the most probable first token, re-scored by their
        full-sequence likelihood (:meth:`vlp.models.vqa.VQAModel.rank_answers`; :func:`vlp.api.answer.answer`)."""
        action = self._action("answer", "the VQA answer decoder")
        return action(self, images, questions, candidates, k, batch_size)

    @inference
    def nlvr(
        self, images0: Images, images1: Images, sentences: Texts, batch_size: Optional[int] = None
    ) -> Union[float, torch.Tensor]:
        """Probability that each sentence is true of its image pair: a float for one sentence
        (a ``str``), else a tensor [N]; ``> 0.5`` is the model's True (:func:`vlp.api.classify.nlvr`)."""
        return self._action(NLVR, "the NLVR2 classifier")(self, images0, images1, sentences, batch_size)

    @inference
    def entailment(self, images: Images, hypotheses: Texts, batch_size: Optional[int] = None) -> torch.Tensor:
        """SNLI-VE: the probabilities [N, 3] that each hypothesis is contradicted by / neutral to /
        entailed by its image (ALBEF's class order 0 / 1 / 2: :data:`VE_LABELS`); one image per
        hypothesis. Hypotheses are cut as the VE fine-tuning cut them (:func:`vlp.api.classify.entailment`)."""
        return self._action("entailment", "the SNLI-VE classifier")(self, images, hypotheses, batch_size)

    def __repr__(self) -> str:
        return (
            f"VLPModel(kind={self.kind!r}, model={type(self.model).__name__}, image_size="
            f"{self.preprocessor.image_size}, device={self.device})"
        )

"""A frozen open_clip model as the SRCL helper: ``open_clip:ARCH[/PRETRAINED]`` in
``loss.srcl.helper`` or ``vlp cache-helper-features --helper``.

Spec grammar (after the ``open_clip:`` prefix):

- ``ARCH`` is an open_clip model name (``ViT-B-16``; ``open_clip.list_models()``) or the path of an
  open_clip model-config JSON file (``embed_dim``, ``vision_cfg``, ``text_cfg``), registered with
  ``open_clip.add_model_config`` under its stem;
- ``PRETRAINED`` is an open_clip pretrained tag of that architecture (``laion2b_s34b_b88k``; ``open_clip.list_pretrained_tags_by_model``:
  fetched from the hub, so it needs internet or a pre-populated open_clip / Hugging Face cache) or
  the path of a local weights file (a ``state_dict`` saved with ``torch.save``, or ``.safetensors``),
  loaded strictly by open_clip as it loads a tag's file. Without it the model would be randomly
  initialised, which is refused (:func:`require_weights`) unless the helper init is ``random``
  (``loss.srcl.helper_init=random`` / ``--helper-init random``: tests);
- if the rest contains ``.json``, ``ARCH`` runs up to and including the first ``.json`` that ends
  it or is followed by ``/``, and whatever follows that ``/`` is ``PRETRAINED`` (so
  ``open_clip:/cfg/tiny.json//weights/tiny.pt`` has an absolute weights path); otherwise the rest
  is split at its first ``/``.

The helper keeps open_clip's own *eval* preprocessing (resize, centre crop, CLIP normalisation at
the model's resolution) and tokenizer (``open_clip.get_tokenizer``). Its inputs therefore differ
from a vlp training batch (BERT token ids, vlp-transformed images), so it cannot run live on that
batch: vlp uses it only through a helper-feature cache (:mod:`vlp.features.helper_cache`).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn

from vlp.config.loss import HELPER_INITS
from vlp.errors import CheckpointError, ConfigError, DataError
from vlp.hardware import default_device

PREFIX = "open_clip:"
GRAMMAR = "open_clip:ARCH[/PRETRAINED]"
#: the key of a helper-feature cache's ``index.json`` that names the helper which wrote it (a spec
#: or a checkpoint path)
CACHE_HELPER_KEY = "helper"
#: what a PRETRAINED that is meant as a file (not a tag) looks like
WEIGHT_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors", ".npz", ".npy", ".ckpt")
_CONFIG_KEYS = ("embed_dim", "vision_cfg", "text_cfg")
_JSON_ARCH = re.compile(r"^(.*?\.json)(?:/(.*))?$", re.DOTALL)
_registered: dict[Path, str] = {}  # model-config files already given to open_clip.add_model_config


@dataclass(frozen=True)
class OpenClipSpec:
    """A parsed ``open_clip:ARCH[/PRETRAINED]`` (no file or registry checked yet)."""

    spec: str  # as given, prefix included
    arch: str  # ARCH as written: a model name or a model-config .json path
    pretrained: Optional[str]  # PRETRAINED as written: a tag or a weights-file path; None: random init

    @property
    def config_file(self) -> Optional[Path]:
        """The model-config JSON file ARCH names, None for a built-in open_clip name."""
        return Path(self.arch) if self.arch.endswith(".json") else None

    @property
    def model_name(self) -> str:
        """The name open_clip knows the architecture by (a config file's stem)."""
        cf = self.config_file
        return cf.stem if cf is not None else self.arch

    @property
    def weights(self) -> Optional[str]:
        """PRETRAINED as a cache records it: an existing file's resolved path, else as written."""
        if self.pretrained is None:
            return None
        path = Path(self.pretrained).expanduser()
        return str(path.resolve()) if path.is_file() else self.pretrained

    def built(self, meta: dict[str, Any]) -> bool:
        """Whether the helper-feature cache whose ``index.json`` is ``meta`` was written by this
        helper: the same spec, or the same architecture name and weights (a file by its resolved path)."""
        same_weights = meta.get("arch") == self.model_name and meta.get("pretrained") == self.weights
        return meta.get(CACHE_HELPER_KEY) == self.spec or ("arch" in meta and same_weights)


def is_open_clip_spec(helper: object) -> bool:
    """``helper`` (a ``loss.srcl.helper`` / ``--helper`` value) names an open_clip model."""
    return isinstance(helper, str) and helper.startswith(PREFIX)


def _where(key: str) -> str:
    """``config key 'loss.srcl.helper'`` for a config key, the option itself for ``--helper``."""
    return key if key.startswith("-") else f"config key '{key}'"


def parse_open_clip_spec(spec: str, key: str = "loss.srcl.helper") -> OpenClipSpec:
    """Split ``spec`` into ARCH and PRETRAINED (module doc); a malformed one raises one
    :class:`ConfigError` naming ``key`` and the grammar."""
    where = f"{_where(key)}: {spec!r}"
    if not is_open_clip_spec(spec):
        raise ConfigError(f"{where}: expected {GRAMMAR}")
    rest = spec[len(PREFIX) :]
    m = _JSON_ARCH.match(rest) if ".json" in rest else None
    if m is not None:
        arch, pretrained = m.group(1), m.group(2)
    elif ".json" in rest:
        raise ConfigError(f"{where}: a model-config file must end in .json and be followed by nothing or /PRETRAINED")
    else:
        arch, sep, tail = rest.partition("/")
        pretrained = tail if sep else None
    if not arch or arch.endswith("/") or arch == ".json":
        raise ConfigError(f"{where}: no ARCH; expected {GRAMMAR} (ARCH: an open_clip model name or a .json file)")
    if pretrained is not None and not pretrained:
        raise ConfigError(f"{where}: empty PRETRAINED after '/'; expected {GRAMMAR} (or no '/' for random weights)")
    return OpenClipSpec(spec, arch, pretrained)


def _random_opt_in(key: str) -> str:
    """The opt-in for a random helper in the setting ``key`` belongs to."""
    return "--helper-init random" if key.startswith("-") else "loss.srcl.helper_init=random"


def require_weights(spec: str | OpenClipSpec, init: str = "pretrained", key: str = "loss.srcl.helper") -> OpenClipSpec:
    """``spec`` parsed, if it agrees with the helper init ``init`` (:data:`HELPER_INITS`): weights
    (a tag or a file) for ``pretrained``, none for ``random``; else one :class:`ConfigError` naming
    ``key`` and the ways out. open_clip itself would build a spec without weights at random, with a
    log warning only."""
    parsed = spec if isinstance(spec, OpenClipSpec) else parse_open_clip_spec(spec, key)
    where = f"{_where(key)}: {parsed.spec!r}"
    if init not in HELPER_INITS:
        raise ConfigError(f"{where}: helper init {init!r}, expected one of {list(HELPER_INITS)}")
    if init == "pretrained" and parsed.pretrained is None:
        raise ConfigError(
            f"{where}: no weights, so the helper would be randomly initialised; give a pretrained tag "
            f"({PREFIX}{parsed.arch}/TAG) or a local weights file ({PREFIX}{parsed.arch}/FILE), "
            f"or {_random_opt_in(key)} for a random helper (tests)"
        )
    if init == "random" and parsed.pretrained is not None:
        raise ConfigError(
            f"{where}: {_random_opt_in(key)} loads no weights, but the spec names {parsed.pretrained!r}; "
            f"drop one of the two"
        )
    return parsed


def _register_config(path: Path, where: str) -> str:
    """Give the model-config file ``path`` to open_clip (once) and return its model name (the stem)."""
    import open_clip

    path = path.expanduser().resolve()
    if path in _registered:
        return _registered[path]
    if not path.is_file():
        raise DataError(f"{where}: open_clip model-config file {path} not found (expected an existing .json file)")
    try:
        cfg = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"{where}: {path} is not a readable JSON file: {e}") from None
    if not isinstance(cfg, dict) or any(k not in cfg for k in _CONFIG_KEYS):
        raise DataError(
            f"{where}: {path} is not an open_clip model config: expected a JSON object with keys {list(_CONFIG_KEYS)}"
        )
    open_clip.add_model_config(path)
    _registered[path] = path.stem
    return path.stem


def _resolve_pretrained(spec: OpenClipSpec, name: str, where: str) -> tuple[Optional[str], bool]:
    """(PRETRAINED for open_clip, whether it is a local file): a weights file that exists, or a
    pretrained tag of ``name``; anything else raises."""
    import open_clip

    p = spec.pretrained
    if p is None:
        return None, False
    path = Path(p).expanduser()
    if path.is_file():
        return str(path.resolve()), True
    if os.sep in p or "/" in p or path.suffix in WEIGHT_SUFFIXES:
        raise DataError(f"{where}: weights file {p} not found (PRETRAINED: an open_clip tag or an existing file)")
    tags = open_clip.list_pretrained_tags_by_model(name)
    if p not in tags:
        known = ", ".join(tags) if tags else "none: give a local weights file"
        raise ConfigError(
            f"{where}: {p!r} is neither a file nor an open_clip pretrained tag of {name} (its tags: {known})"
        )
    return p, False


class OpenClipHelper:
    """A frozen open_clip model (eval mode, no gradients) with its eval preprocessing and tokenizer.

    :meth:`encode_image` takes ``[N, 3, H, W]`` images made by :attr:`preprocess` (``H = W =``
    :attr:`image_size` for the usual square models), :meth:`encode_text` raw caption strings; both
    return L2-normalised fp32 features ``[N, E]`` (``E``: the model's ``embed_dim``) on the CPU."""

    def __init__(
        self,
        spec: OpenClipSpec,
        model: nn.Module,
        preprocess: Callable[[Image.Image], torch.Tensor],
        tokenizer: Callable[..., torch.Tensor],
        pretrained: Optional[str],
        device: torch.device,
    ) -> None:
        self.model: Any = model  # open_clip's CLIP / CustomTextCLIP (encode_image, encode_text, visual)
        self.spec, self.preprocess, self.tokenizer = spec, preprocess, tokenizer
        self.pretrained, self.device = pretrained, device

    @classmethod
    def load(
        cls,
        spec: str | OpenClipSpec,
        key: str = "loss.srcl.helper",
        device: Optional[torch.device] = None,
        init: str = "pretrained",
    ) -> OpenClipHelper:
        """Build the model of ``spec`` (``open_clip.create_model_and_transforms``, fp32) on
        ``device`` (default: CUDA if available). A bad spec, or one that disagrees with ``init``
        (:func:`require_weights`), raises one :class:`ConfigError` / :class:`DataError` naming
        ``key`` (``loss.srcl.helper`` or ``--helper``); weights that do not fit the architecture a
        :class:`CheckpointError`."""
        import open_clip

        parsed = spec if isinstance(spec, OpenClipSpec) else parse_open_clip_spec(spec, key)
        where = f"{_where(key)}: {parsed.spec!r}"
        cf = parsed.config_file
        if cf is not None:
            name = _register_config(cf, where)
        else:
            name = parsed.arch
            if name not in open_clip.list_models():
                raise ConfigError(
                    f"{where}: unknown open_clip architecture {name!r}; expected {GRAMMAR} with ARCH an open_clip "
                    "model name (e.g. ViT-B-16, ViT-L-14; see open_clip.list_models()) or a model-config .json file"
                )
        require_weights(parsed, init, key)
        pretrained, is_file = _resolve_pretrained(parsed, name, where)
        device = device if device is not None else default_device()
        try:
            model, _, preprocess = open_clip.create_model_and_transforms(
                name, pretrained=pretrained, precision="fp32", device=device
            )
        except Exception as e:  # open_clip raises RuntimeError, ValueError, unpickling errors, ...
            if is_file:
                raise CheckpointError(f"{where}: cannot load the weights file {pretrained} into {name}: {e}") from None
            if pretrained is not None:
                raise DataError(
                    f"{where}: cannot fetch the open_clip weights {name}/{pretrained} (a tag needs internet or a "
                    f"pre-populated open_clip / Hugging Face cache; or give a local weights file): {e}"
                ) from None
            raise ConfigError(f"{where}: open_clip cannot build {name}: {e}") from None
        model.eval().requires_grad_(False)
        return cls(parsed, model, preprocess, open_clip.get_tokenizer(name), pretrained, device)

    @property
    def image_size(self) -> int | tuple[int, int]:
        """The model's input resolution (an int for square inputs)."""
        size: Any = self.model.visual.preprocess_cfg.get("size", self.model.visual.image_size)
        if isinstance(size, (tuple, list)):
            return int(size[0]) if size[0] == size[-1] else (int(size[0]), int(size[1]))
        return int(size)

    @property
    def context_length(self) -> int:
        """Tokens per caption (longer captions are truncated by the tokenizer)."""
        return int(getattr(self.tokenizer, "context_length", self.model.context_length))

    @torch.no_grad()
    def encode_image(self, images: torch.Tensor) -> torch.Tensor:
        """``images`` [N, 3, H, W] (from :attr:`preprocess`) -> L2-normalised fp32 [N, E] (CPU)."""
        feats = self.model.encode_image(images.to(self.device, torch.float32))
        return F.normalize(feats.float(), dim=-1).cpu()

    @torch.no_grad()
    def encode_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """``tokens`` [N, L] (from :attr:`tokenizer`) -> L2-normalised fp32 [N, E] (CPU)."""
        feats = self.model.encode_text(tokens.to(self.device))
        return F.normalize(feats.float(), dim=-1).cpu()

    def encode_text(self, texts: Sequence[str]) -> torch.Tensor:
        """Raw captions (open_clip's tokenizer cleans and truncates them) -> L2-normalised fp32 [N, E] (CPU)."""
        return self.encode_tokens(self.tokenizer(list(texts)))

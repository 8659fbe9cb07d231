"""Moving weights into task models: the one place for pretrained -> fine-tuning checkpoint surgery.

:func:`load_pretrained` reads a vlp checkpoint, interpolates the ViT position embedding to the
model's resolution, lets the model adapt the keys (``adapt_pretrained``: drop heads it lacks, copy
fusion layers into the VQA decoder or the doubled NLVR2 block), loads strictly against the
model's list of keys it may leave new, and copies the online weights into the momentum twins when
the checkpoint has none (after loading: ALBEF's NLVR2 code copied them before, albef.md §14 #1).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

import torch
from safetensors.torch import load_file
from torch import nn

from vlp.errors import CheckpointError
from vlp.models.vision import resize_pos_embed
from vlp.weights import load_strict

# Tied in pretraining checkpoints; safetensors keeps one name per tied group, so both are restored.
PRETRAIN_TIES = (("text.embeddings.word_embeddings.weight", "mlm_head.decoder.weight"),)
TWIN = "momentum.twin."

# Heads of :class:`~vlp.models.albef.ALBEF` a task model may not have (their keys are dropped).
OPTIONAL_HEADS = ("vision_proj", "text_proj", "temp", "itm_head", "mlm_head")


def restore_ties(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Give every known tied pair both names (online and momentum twin)."""
    state = dict(state)
    for a, b in PRETRAIN_TIES:
        for prefix in ("", TWIN):
            ka, kb = prefix + a, prefix + b
            if ka in state and kb not in state:
                state[kb] = state[ka]
            elif kb in state and ka not in state:
                state[ka] = state[kb]
    return state


def resize_pos_embeds(state: dict[str, torch.Tensor], target: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Interpolate every ``*vision.pos_embed`` whose token count differs from the model's."""
    out = dict(state)
    for k, v in state.items():
        if k.endswith("vision.pos_embed") and k in target and v.shape != target[k].shape:
            out[k] = resize_pos_embed(v, target[k].shape[1])
    return out


def drop_absent_heads(state: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """Remove the keys of ALBEF heads (and their twins) that ``model`` does not have, the queue's
    image ids (they index the pretraining data: a fine-tuning queue starts with -100, ALBEF §3), and
    the whole queue when the model's has another size."""
    absent = [h for h in OPTIONAL_HEADS if getattr(model, h, None) is None]
    own = model.state_dict()
    resized = any(k.startswith("queue.") and k in own and own[k].shape != v.shape for k, v in state.items())

    def keep(k: str) -> bool:
        name = k.removeprefix(TWIN)
        if any(name == h or name.startswith(h + ".") for h in absent):
            return False
        return not (k == "queue.ids" or (resized and k.startswith("queue.")))

    return {k: v for k, v in state.items() if keep(k)}


def tied_aliases(model: nn.Module, state: dict[str, torch.Tensor]) -> list[str]:
    """Names of ``model``'s tied parameters absent from ``state`` while another name of the group is there."""
    groups: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(name)
    return [n for g in groups.values() if len(g) > 1 and any(x in state for x in g) for n in g if n not in state]


def load_pretrained(model: nn.Module, ckpt: str | Path) -> dict[str, list[str]]:
    """Load the vlp checkpoint folder ``ckpt`` into the task model ``model`` (see module docstring).

    Returns ``{"new": model keys left at their initial value, "dropped": checkpoint keys not used,
    "momentum_copied": [] or ["all"] when the twins were copied from the loaded online weights}``.
    """
    f = Path(ckpt) / "model.safetensors"
    if not f.is_file():
        raise CheckpointError(f"{ckpt}: missing model.safetensors")
    source = restore_ties(load_file(str(f)))
    own = model.state_dict()
    state = resize_pos_embeds(source, own)
    adapt: Optional[Callable] = getattr(type(model), "adapt_pretrained", None)
    # a task model maps the whole checkpoint itself (e.g. the MLM head becomes the VQA decoder's
    # LM head); plain ALBEF task models (retrieval) only lose the heads they lack
    state, allow_missing = adapt(state, model) if adapt is not None else (drop_absent_heads(state, model), [])
    twin_missing = not any(k.startswith(TWIN) for k in state)
    allow = [*allow_missing, *tied_aliases(model, state), "queue.*", "*position_ids"]
    allow += [TWIN + "*"] if twin_missing else []
    # a restored tie name whose module the model lacks (e.g. the MLM head's side of the tie)
    tie_names = {n for pair in PRETRAIN_TIES for n in pair}
    spare = [k for k in state if k not in own and k.removeprefix(TWIN) in tie_names]
    load_strict(model, state, source=str(f), allow_missing=allow, allow_unexpected=spare)
    if twin_missing and hasattr(model, "momentum"):
        model.momentum.copy_from_online()
    copied = twin_missing and hasattr(model, "momentum")
    new = sorted(k for k in own if k not in state and not (copied and k.startswith(TWIN)))
    return {
        "new": new,
        "dropped": sorted(set(source) - set(state) | set(spare)),
        "momentum_copied": ["all"] if copied else [],
    }

"""Reading weights and checkpoints, in one place: strict loads with explicit allowances, key
renames, safe reading of weights files, and vlp checkpoint folders (verified against their manifest,
newest valid one of a run; the manifest itself is read by :mod:`vlp.manifests`).

A checkpoint folder holds ``model.safetensors`` (all weights incl. momentum twins and queues),
``state.json``, optionally ``task_state.safetensors`` (a task's non-model parts: the LTD decoder,
lambda and its momentum), ``preprocessor.json`` (a training run's evaluation preprocessing, read by
:func:`vlp.checkpoint.open_checkpoint`) and ``manifest.json`` (each file's size and SHA-256, written last).

The write side is here too (:func:`save_checkpoint`): written into ``NAME.tmp/``, every file
flushed to disk, the manifest written last, then renamed to ``NAME``, so a folder under its final
name is complete; a write that fails (a full disk) removes ``NAME.tmp/`` and raises one
:class:`CheckpointError` naming the folder and its free space (:func:`removed_on_failure`). Training (pruning, setting aside) builds on it in :mod:`vlp.train.checkpoints`;
the ALBEF converter and the model zoo write with it without importing training code.
"""

from __future__ import annotations

import errno
import fnmatch
import json
import logging
import math
import os
import re
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional

import torch
from safetensors.torch import save_file
from torch import nn

from vlp.errors import CheckpointError
from vlp.file_modes import umask_mode
from vlp.manifests import MANIFEST as MANIFEST
from vlp.manifests import file_sha256
from vlp.manifests import refuse_unlisted as refuse_unlisted
from vlp.manifests import verify_manifest as verify_manifest

logger = logging.getLogger(__name__)

TASK_STATE = "task_state.safetensors"
#: the ``state.json`` key of a checkpoint's kind (pretrain, helper, retrieval, vqa, nlvr2, nlvr-ta, ve): "task"
#: in every checkpoint written so far, kept so that they, and older vlp versions, read it; in code it is the kind
KIND_KEY = "task"
STEP_DIR = re.compile(r"step_\d+")  # checkpoints/step_0001000 (not the .tmp staging folders)

#: the phases of writing a checkpoint folder, in order: its staging folder made; the weights written;
#: ``state.json`` and the other files of the main process written; every rank's training state
#: written (:mod:`vlp.train.checkpoints`); every file flushed and the manifest written; the folder
#: renamed to its final name; older step checkpoints pruned (:mod:`vlp.train.checkpoints`)
CHECKPOINT_PHASES = ("staging", "weights", "state", "train_state", "manifest", "renamed", "pruned")
#: ``hook(phase, folder)`` callables run at each of :data:`CHECKPOINT_PHASES` (``folder``: the staging
#: folder ``NAME.tmp`` up to ``manifest``, then ``NAME``). A run has none: the fault-injection tests
#: (tests/faults, scripts/soak.py) add one that stops the process at a phase.
PHASE_HOOKS: list[Callable[[str, Path], None]] = []


def reached(phase: str, folder: Path) -> None:
    """Checkpoint writing reached ``phase`` (one of :data:`CHECKPOINT_PHASES`) for ``folder``."""
    for hook in PHASE_HOOKS:
        hook(phase, folder)


def _matches(key: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(key, p) for p in patterns)


def load_strict(
    module: nn.Module,
    state: Mapping[str, torch.Tensor],
    *,
    source: str,
    allow_missing: Iterable[str] = (),
    allow_unexpected: Iterable[str] = (),
) -> None:
    """Load ``state`` into ``module``; fail unless every missing/unexpected key is allowed.

    ``allow_*`` are fnmatch patterns (``fusion.layer.*.crossattention.*``). Shape mismatches
    always fail. Never a silent ``strict=False``.
    """
    allow_missing, allow_unexpected = list(allow_missing), list(allow_unexpected)
    own = module.state_dict()
    missing = [k for k in own if k not in state and not _matches(k, allow_missing)]
    unexpected = [k for k in state if k not in own and not _matches(k, allow_unexpected)]
    shape = [
        f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
        for k in state
        if k in own and tuple(state[k].shape) != tuple(own[k].shape)
    ]
    dtype = [
        f"{k}: checkpoint {state[k].dtype} vs model {own[k].dtype}"
        for k in state
        if k in own and _kind_differs(state[k], own[k])
    ]
    if missing or unexpected or shape or dtype:
        parts = [f"cannot load {source} into {type(module).__name__}:"]
        if missing:
            parts.append(f"  missing keys ({len(missing)}): {missing[:8]}{' ...' if len(missing) > 8 else ''}")
        if unexpected:
            parts.append(
                f"  unexpected keys ({len(unexpected)}): {unexpected[:8]}{' ...' if len(unexpected) > 8 else ''}"
            )
        if shape:
            parts.append(f"  shape mismatches: {shape[:8]}")
        if dtype:
            parts.append(f"  dtype mismatches: {dtype[:8]}")
        raise CheckpointError("\n".join(parts))
    module.load_state_dict({k: v for k, v in state.items() if k in own}, strict=False)


def _kind_differs(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors hold different kinds of numbers (floating, complex, bool, integer): a
    float16 checkpoint loads into a float32 model, a bool or integer tensor where the model has
    floats (a damaged or foreign file) does not."""

    def kind(t: torch.Tensor) -> str:
        return (
            "complex"
            if t.is_complex()
            else "float"
            if t.is_floating_point()
            else "bool"
            if t.dtype == torch.bool
            else "int"
        )

    return kind(a) != kind(b)


def rename(state: Mapping[str, torch.Tensor], rules: Iterable[tuple[str, str]]) -> dict[str, torch.Tensor]:
    """Apply regex ``(pattern, replacement)`` rules in order to every key; drop keys mapped to ''."""
    compiled = [(re.compile(p), r) for p, r in rules]
    out: dict[str, torch.Tensor] = {}
    for k, v in state.items():
        for p, r in compiled:
            k = p.sub(r, k)
        if k:
            out[k] = v
    return out


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Read weights from a .safetensors file (or a directory holding ``model.safetensors``).

    ``.bin``/``.pth`` files are read with ``torch.load(weights_only=True)``: no arbitrary unpickling.
    Every tensor they hold must fit the file (:func:`check_tensor_sizes`): a small file cannot make
    its reader allocate gigabytes later.
    """
    path = Path(path)
    if path.is_dir():
        for name in ("model.safetensors", "pytorch_model.bin"):
            if (path / name).is_file():
                path = path / name
                break
        else:
            raise CheckpointError(f"{path}: no model.safetensors or pytorch_model.bin in this directory")
    if not path.is_file():
        raise CheckpointError(f"weights file not found: {path}")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    import pickle

    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:  # weights_only refuses anything but tensors and plain containers
        opcode = re.search(r"Unsupported operand (\d+)", str(e))
        if opcode:  # an opcode no weights file uses: a malformed stream, not a reference to code
            code = int(opcode.group(1))
            raise CheckpointError(
                f"{path}: not a readable PyTorch weights file (its data has pickle opcode {code} ({chr(code)!r}), which "
                "tensors and plain containers do not use: malformed, or not a weights file)"
            ) from None
        found = re.search(r"GLOBAL (\S+)", str(e))
        what = f"it references {found.group(1)}" if found else "it holds objects other than tensors"
        raise CheckpointError(
            f"{path}: refused: loading it would need arbitrary unpickling ({what}), which can run "
            "code from the file. vlp reads .pth/.bin files only as tensors and plain containers "
            "(torch.load weights_only=True); convert a file you trust to safetensors"
        ) from None
    except Exception as e:  # whatever a malformed file makes torch's reader raise (RuntimeError, EOFError,
        # OSError, and from a malformed data.pkl IndexError, KeyError, UnicodeDecodeError, ...): named, not a traceback
        first = (str(e).splitlines() or [""])[0][:300]
        raise CheckpointError(f"{path}: not a readable PyTorch weights file ({type(e).__name__}: {first})") from None
    check_tensor_sizes(obj, path)
    if isinstance(obj, dict) and "model" in obj and isinstance(obj["model"], dict):
        obj = obj["model"]
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path}: expected a state dict, got {type(obj).__name__}")
    return obj


def _tensors(obj: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor in the plain containers (dicts, lists, tuples) of ``obj``, with its dotted key
    (``model.image_queue``; list items by index). Iterative: depth costs no recursion."""
    todo: list[tuple[str, Any]] = [("", obj)]
    while todo:
        key, value = todo.pop()
        if isinstance(value, torch.Tensor):
            yield key or "<the file's object>", value
        elif isinstance(value, dict):
            todo.extend((f"{key}.{k}" if key else str(k), v) for k, v in reversed(list(value.items())))
        elif isinstance(value, (list, tuple)):
            todo.extend((f"{key}.{i}" if key else str(i), v) for i, v in reversed(list(enumerate(value))))


def check_tensor_sizes(obj: Any, path: Path) -> None:
    """Refuse (:class:`CheckpointError`, naming the key, its shape and bytes, and ``path``) a
    tensor loaded from ``path`` that claims more than the file holds, before anything copies it:

    - its elements take more bytes (numel x itemsize) than its storage holds: a view with stride 0
      or overlapping strides (a [16, 10**10] stride-0 view of 4 bytes becomes 640 GB once a reader
      makes it contiguous). Views that fit their storage (slices, ``expand`` of a size-1
      dimension as in BERT's ``position_ids``) pass;
    - its storage, with the other distinct storages seen so far, takes more bytes than the file
      (``torch.save`` stores each storage once, uncompressed);
    - it is not a dense (strided) tensor: weights are dense, and a sparse tensor's storage is not
      bounded here."""
    size = path.stat().st_size
    seen: set[int] = set()  # the data pointers of the storages counted in total
    total = 0
    for key, t in _tensors(obj):
        if t.layout != torch.strided:
            raise CheckpointError(f"{path}: refused: tensor {key!r} is {t.layout}, expected a dense (strided) tensor")
        claimed, storage = t.numel() * t.element_size(), t.untyped_storage()
        if claimed > storage.nbytes():
            raise CheckpointError(
                f"{path}: refused: tensor {key!r} of shape {tuple(t.shape)} (stride {t.stride()}) claims "
                f"{claimed} bytes, but its storage holds {storage.nbytes()}: a view with stride 0 or overlapping "
                "strides, which a copy would inflate"
            )
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
        if total > size:
            raise CheckpointError(
                f"{path}: refused: tensor {key!r} of shape {tuple(t.shape)} brings its storages to {total} bytes, "
                f"more than the {size} bytes of the file"
            )


#: the files (fnmatch patterns, relative to the folder) the checkpoint loaders read: weights, state,
#: task state, evaluation preprocessing, and training state on resume (:mod:`vlp.train.state`)
CHECKPOINT_READS = ("model.safetensors", "state.json", TASK_STATE, "preprocessor.json", "train_state/*")


def verify_checkpoint(ckpt: Path, require: Iterable[str] = (), reads: Iterable[str] = CHECKPOINT_READS) -> None:
    """Check every file of ``ckpt``'s manifest (present, same size, same SHA-256) and that the
    ``require``d relative paths exist; raises :class:`CheckpointError` naming the first problem: a
    file shorter than listed is "truncated", a longer one or another SHA-256 "changed since it was
    saved" (an edit, or corruption); a file matching ``reads`` (what the loader reads) that the
    manifest does not list is refused by name (:func:`refuse_unlisted`). A folder without a
    manifest is refused: nothing in it can be checked."""
    verify_manifest(ckpt, f"checkpoint {ckpt}", ("model.safetensors", *require))
    refuse_unlisted(ckpt, reads, "checkpoint loader")


#: the files a transformers tokenizer loader reads from a folder (transformers' SPECIAL_TOKENS_MAP_FILE,
#: ADDED_TOKENS_FILE, TOKENIZER_CONFIG_FILE, FULL_TOKENIZER_FILE, the BERT vocabulary and the chat template)
TOKENIZER_FILES = (
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer_config.json",
    "tokenizer.json",
    "vocab.txt",
    "chat_template.jinja",
)


def step_checkpoints(run_dir: Path) -> list[Path]:
    """``run_dir/checkpoints/step_N`` folders, oldest first."""
    root = run_dir / "checkpoints"
    return sorted(p for p in root.iterdir() if p.is_dir() and STEP_DIR.fullmatch(p.name)) if root.is_dir() else []


def weights_to_save(model: nn.Module) -> dict[str, torch.Tensor]:
    """The state dict as CPU copies, one name per tied group (the alphabetically first, as
    safetensors' ``save_model`` keeps). Copies, because an engine may keep parameters as views
    into one flat buffer (DeepSpeed ZeRO), which safetensors refuses to write."""
    state = model.state_dict(keep_vars=True)
    names: dict[int, list[str]] = {}
    for k, v in state.items():
        names.setdefault(id(v), []).append(k)
    return {min(group): state[group[0]].detach().to("cpu", copy=True).contiguous() for group in names.values()}


def find_checkpoint(path: str | Path, require: Iterable[str] = ()) -> Path:
    """A checkpoint folder (verified), or the newest valid ``checkpoints/step_*`` of a run directory:
    a corrupted or truncated one is logged as a warning (stderr on the console) and the previous one is tried."""
    path = Path(path)
    if (path / "model.safetensors").is_file() or (path / MANIFEST).is_file():
        verify_checkpoint(path, require)
        return path
    candidates = step_checkpoints(path)
    if not candidates:
        raise CheckpointError(f"{path}: no checkpoint here (expected model.safetensors or checkpoints/step_*/)")
    problems = []
    for ckpt in reversed(candidates):
        try:
            if ckpt.is_symlink():  # a run writes its own step folders; a link points at another run's
                raise CheckpointError(f"checkpoint {ckpt} is a symbolic link (to {ckpt.resolve()}), refused")
            verify_checkpoint(ckpt, require)
        except CheckpointError as e:
            problems.append(str(e))
            logger.warning(f"warning: {e}; trying the previous checkpoint")
            continue
        return ckpt
    raise CheckpointError(f"{path}: no valid checkpoint ({'; '.join(problems)})")


def read_state(ckpt: str | Path) -> dict[str, Any]:
    p = Path(ckpt) / "state.json"
    if not p.is_file():
        raise CheckpointError(f"{ckpt}: missing state.json")
    state: dict[str, Any] = json.loads(p.read_text())
    return state


def tied_groups(module: nn.Module) -> list[list[str]]:
    """Names of parameters sharing one tensor (safetensors saves one name per group)."""
    groups: dict[int, list[str]] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(name)
    return [g for g in groups.values() if len(g) > 1]


def load_weights_file(
    model: nn.Module, path: str | Path, allow_missing: Iterable[str] = (), allow_unexpected: Iterable[str] = ()
) -> None:
    """Strictly load a ``.safetensors`` file into ``model``; a tied group needs one saved name."""
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path.parent}: missing {path.name}")
    state = load_file(str(path))
    aliases = [n for g in tied_groups(model) if any(n in state for n in g) for n in g if n not in state]
    load_strict(
        model, state, source=str(path), allow_missing=[*aliases, *allow_missing], allow_unexpected=allow_unexpected
    )


def load_weights(
    model: nn.Module, ckpt: str | Path, allow_missing: Iterable[str] = (), allow_unexpected: Iterable[str] = ()
) -> None:
    """Strictly load ``ckpt/model.safetensors`` into ``model`` (:func:`load_weights_file`)."""
    load_weights_file(model, Path(ckpt) / "model.safetensors", allow_missing, allow_unexpected)


def load_task_state(ckpt: str | Path) -> dict[str, torch.Tensor]:
    """The task state saved with a checkpoint (empty if the task had none)."""
    from safetensors.torch import load_file

    f = Path(ckpt) / TASK_STATE
    return load_file(str(f)) if f.is_file() else {}


def module_states(**modules: Optional[nn.Module]) -> dict[str, torch.Tensor]:
    """Checkpointed state of a task's non-model parts, ``name.key`` -> tensor (``None`` skipped)."""
    return {f"{n}.{k}": v for n, m in modules.items() if m is not None for k, v in m.state_dict().items()}


def load_module_states(state: dict[str, torch.Tensor], **modules: Optional[nn.Module]) -> None:
    """Inverse of :func:`module_states`; strict per module (names the checkpoint keys on mismatch)."""
    for n, m in modules.items():
        if m is not None:
            part = {k[len(n) + 1 :]: v for k, v in state.items() if k.startswith(n + ".")}
            load_strict(m, part, source=f"task state '{n}'")


# ----------------------------------------------------------------------------- the write side


def save_tensors(tensors: dict[str, torch.Tensor], path: str | Path, metadata: Optional[dict[str, str]] = None) -> Path:
    """``safetensors``' ``save_file``, with the file's mode following the umask as every other file
    vlp writes (``save_file`` itself creates it ``0600``: unreadable by colleagues on a shared cluster)."""
    save_file(tensors, str(path), metadata=metadata)
    os.chmod(path, umask_mode())
    return Path(path)


#: what a full disk advises (:func:`write_failure`) unless the writer knows better (training:
#: :data:`vlp.train.checkpoints.RESUME_ADVICE`; ``save_pretrained``: its own)
WRITE_ADVICE = "free some space, or write to a folder on another disk"


def save_checkpoint(
    directory: str | Path,
    model: nn.Module,
    state: dict[str, Any],
    task_state: Optional[dict[str, torch.Tensor]] = None,
    files: Optional[Mapping[str, str]] = None,
    advice: str = WRITE_ADVICE,
) -> Path:
    """Write ``directory/model.safetensors``, ``state.json``, (if given and non-empty)
    ``task_state.safetensors`` and the text ``files`` (name -> content, e.g. ``preprocessor.json``)
    atomically, with a manifest (:func:`removed_on_failure`; ``advice``: what a full disk advises)."""
    directory = Path(directory)
    tmp = staging(directory)
    with removed_on_failure(tmp, directory, advice):
        write_parts(tmp, model, state, task_state, files)
        return publish(tmp, directory)


def is_disk_full(e: BaseException) -> bool:
    """Whether ``e`` reports a full disk or quota: ``OSError`` ENOSPC/EDQUOT, or the safetensors
    writer's error carrying the OS error (``No space left on device (os error 28)``)."""
    if isinstance(e, OSError):
        return e.errno in (errno.ENOSPC, errno.EDQUOT)
    text = str(e)
    return any(m in text for m in ("No space left on device", "os error 28", "StorageFull", "Disk quota exceeded"))


def free_space(path: Path) -> str:
    """The free space of the filesystem holding ``path`` (its nearest existing ancestor), e.g. ``"12.0 MiB"``."""
    existing = next(p for p in (path, *path.parents) if p.exists())
    free = shutil.disk_usage(existing).free
    if free < 1024:
        return f"{free} bytes"
    power = min(3, int(math.log(free, 1024)))
    return f"{free / 1024**power:.1f} {('KiB', 'MiB', 'GiB')[power - 1]}"


def write_failure(e: BaseException, target: Path, advice: str = WRITE_ADVICE) -> BaseException:
    """What to raise for ``e``, an error while writing ``target``: a :class:`CheckpointError` naming
    the folder and its free space, then ``advice``, for a full disk; ``e`` itself otherwise."""
    if not is_disk_full(e):
        return e
    return CheckpointError(
        f"cannot write {target}: no space left on the device ({free_space(target.parent)} free in "
        f"{target.parent}); {advice}"
    )


@contextmanager
def removed_on_failure(tmp: Path, target: Path, advice: str = WRITE_ADVICE) -> Iterator[None]:
    """Writing into the staging folder ``tmp`` of ``target``: on any failure ``tmp`` is removed (the
    earlier ``target``, if any, is untouched); a full disk raises :func:`write_failure`'s one error
    (with ``advice``)."""
    try:
        yield
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        failure = write_failure(e, target, advice)
        if failure is e:
            raise
        raise failure from None


def staging(directory: Path) -> Path:
    """A fresh, empty ``directory.tmp/`` to write a checkpoint into."""
    tmp = directory.with_name(directory.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    reached("staging", tmp)
    return tmp


def write_parts(
    tmp: Path,
    model: nn.Module,
    state: dict[str, Any],
    task_state: Optional[dict[str, torch.Tensor]] = None,
    files: Optional[Mapping[str, str]] = None,
) -> None:
    """The main process's files of a checkpoint, into the staging folder: the weights, the task
    state, ``state.json`` and the text ``files`` (name -> content; the manifest lists them all)."""
    save_tensors(weights_to_save(model), tmp / "model.safetensors")
    reached("weights", tmp)
    if task_state:
        save_tensors({k: v.detach().contiguous() for k, v in task_state.items()}, tmp / TASK_STATE)
    (tmp / "state.json").write_text(json.dumps(state, indent=2, default=str))
    for name, text in (files or {}).items():
        (tmp / name).write_text(text)
    reached("state", tmp)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(tmp: Path, directory: Path) -> Path:
    """Flush every file of ``tmp``, write its manifest, and rename it to ``directory`` (replacing
    an older folder of that name only after the new one is complete)."""
    files = sorted(p for p in tmp.rglob("*") if p.is_file() and p.name != MANIFEST)
    entries: dict[str, dict[str, Any]] = {}
    for p in files:
        _fsync(p)
        entries[p.relative_to(tmp).as_posix()] = {"bytes": p.stat().st_size, "sha256": file_sha256(p)}
    (tmp / MANIFEST).write_text(json.dumps({"format": 1, "files": entries}, indent=1))
    _fsync(tmp / MANIFEST)
    reached("manifest", tmp)
    old = directory.with_name(directory.name + ".old")
    if directory.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(directory, old)
    os.replace(tmp, directory)
    reached("renamed", directory)
    _fsync(directory.parent)
    shutil.rmtree(old, ignore_errors=True)
    return directory

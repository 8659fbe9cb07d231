"""Inputs of zero-shot classification (``vlp evaluate classification``): labelled images, the class
names and the prompt templates, validated with errors that name the file, line or entry.

- images: an ImageFolder-style directory (one subfolder per class, its images at any depth below
  it, extensions :data:`IMAGE_EXTENSIONS`) or a JSON list ``[{"image": path, "label": "class name"}]``
  (relative paths against ``image_root``, default the file's folder, as every vlp format);
- classes: a ``.txt`` file (one name per line) or a JSON list of strings; default the sorted
  subfolder names (ImageFolder) or the sorted distinct labels (JSON);
- templates: a ``.txt`` file (one per line) or a JSON list of strings, each holding ``{}`` exactly
  once (where the class name goes); default ``["{}"]`` (the class name alone).

Blank lines of ``.txt`` files are skipped and every line is stripped; line numbers are 1-based.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from vlp.data.json_entries import entry_image, entry_object, entry_text, read_entries, read_json, resolve_image
from vlp.errors import DataError, EntryError

#: image files an ImageFolder class folder contributes (case-insensitive)
IMAGE_EXTENSIONS: tuple[str, ...] = (".png", ".jpg", ".jpeg", ".bmp", ".webp")
#: where a template puts the class name
SLOT = "{}"
DEFAULT_TEMPLATES: tuple[str, ...] = (SLOT,)


@dataclass
class ClassificationInputs:
    """Labelled images and the prompts of their classes.

    ``images`` [N] resolved paths; ``labels`` [N] class indices into ``classes`` [C];
    ``templates`` [T]; ``source`` the data file or folder (for messages and records)."""

    images: list[str]
    labels: list[int]
    classes: list[str]
    templates: list[str] = field(default_factory=lambda: list(DEFAULT_TEMPLATES))
    source: str = ""

    def prompts(self) -> list[str]:
        """Every (class, template) prompt [C*T] in class-major order: class c's at ``c*T .. c*T+T-1``
        (the order :func:`vlp.eval.classification.prompt_ensemble` expects)."""
        return [fill_template(t, c) for c in self.classes for t in self.templates]


def fill_template(template: str, name: str) -> str:
    """``template`` with its ``{}`` replaced by ``name`` (other braces are left as they are)."""
    return template.replace(SLOT, name)


def _text_items(path: Path, what: str) -> list[tuple[str, str]]:
    """The items of a ``.txt`` file (non-blank lines, stripped) or of a JSON list of strings, each
    with where it is (``line 3`` / ``entry 2``) for messages. ``what`` names an item in errors."""
    if path.suffix.lower() == ".json":
        items = read_json(path)
        if not isinstance(items, list):
            raise DataError(f"{path}: expected a JSON list of {what} strings, got {type(items).__name__}")
        for i, v in enumerate(items):
            if not isinstance(v, str) or not v.strip():
                raise EntryError(path, i, None, f"expected a non-empty {what} string, got {v!r}")
        return [(f"entry {i}", v.strip()) for i, v in enumerate(items)]
    if not path.is_file():
        raise DataError(f"{what} file not found: {path}")
    lines = path.read_text(encoding="utf-8").splitlines()
    return [(f"line {n}", s.strip()) for n, s in enumerate(lines, 1) if s.strip()]


def read_classes(path: str | Path) -> list[str]:
    """Class names from a ``.txt`` file (one per line) or a JSON list; a repeated name or an empty
    file is an error naming the file (and the line or entry)."""
    path = Path(path)
    items = _text_items(path, "class name")
    seen: dict[str, str] = {}
    for where, name in items:
        if name in seen:
            raise DataError(f"{path}: {where}: class {name!r} repeats {seen[name]}")
        seen[name] = where
    if not items:
        raise DataError(f"{path}: no class names")
    return [name for _, name in items]


def read_templates(path: str | Path) -> list[str]:
    """Prompt templates from a ``.txt`` file (one per line) or a JSON list; each must hold ``{}``
    exactly once (an error names the file and the line or entry)."""
    path = Path(path)
    items = _text_items(path, "template")
    for where, t in items:
        if t.count(SLOT) != 1:
            raise DataError(
                f"{path}: {where}: template {t!r} holds {SLOT!r} {t.count(SLOT)} times; expected exactly "
                "once (where the class name goes)"
            )
    if not items:
        raise DataError(f"{path}: no templates")
    return [t for _, t in items]


def _is_image(p: Path) -> bool:
    return p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS


def _image_folder(root: Path, classes: Optional[list[str]]) -> tuple[list[str], list[int], list[str]]:
    """Images, labels and classes of an ImageFolder-style directory (classes default: the sorted
    subfolder names; a subfolder that is not a given class is an error)."""
    folders = sorted(p.name for p in root.iterdir() if p.is_dir())
    if not folders:
        raise DataError(f"{root}: no class subfolders (expected an ImageFolder-style directory: one folder per class)")
    names = classes if classes is not None else folders
    unknown = [f for f in folders if f not in names]
    if unknown:
        raise DataError(f"{root / unknown[0]}: folder {unknown[0]!r} is not one of the {len(names)} classes")
    images, labels = [], []
    for name in folders:
        for p in sorted(q for q in (root / name).rglob("*") if _is_image(q)):
            images.append(str(p))
            labels.append(names.index(name))
    if not images:
        raise DataError(f"{root}: no images ({', '.join(IMAGE_EXTENSIONS)}) in its class folders")
    return images, labels, names


def _json_list(
    path: Path, classes: Optional[list[str]], image_root: Optional[str | Path]
) -> tuple[list[str], list[int], list[str]]:
    """Images, labels and classes of a JSON list ``[{"image": path, "label": name}]`` (classes
    default: the sorted distinct labels; a label outside the given classes is an :class:`EntryError`)."""
    root = Path(image_root) if image_root else path.parent
    entries = read_entries(path)
    if not entries:
        raise DataError(f"{path}: no entries")
    rows = []
    for i, e in enumerate(entries):
        e = entry_object(path, i, e)
        rows.append((entry_image(path, i, e), entry_text(path, i, e, "label", "a class name string").strip()))
    names = classes if classes is not None else sorted({label for _, label in rows})
    index = {c: k for k, c in enumerate(names)}
    labels = []
    for i, (_, label) in enumerate(rows):
        if label not in index:
            raise EntryError(path, i, "label", f"label {label!r} is not one of the {len(names)} classes")
        labels.append(index[label])
    return [resolve_image(image, root) for image, _ in rows], labels, names


def read_classification_inputs(
    data: str | Path,
    classes: Optional[str | Path] = None,
    templates: Optional[str | Path] = None,
    image_root: Optional[str | Path] = None,
) -> ClassificationInputs:
    """The labelled images of ``data`` (an ImageFolder-style directory or a JSON list), the class
    names of ``classes`` (a file; default from ``data``) and the templates of ``templates`` (a file;
    default ``["{}"]``). ``image_root`` resolves a JSON list's relative paths (default: its folder);
    it has no meaning for a directory and is refused there."""
    data = Path(data)
    names = read_classes(classes) if classes is not None else None
    if data.is_dir():
        if image_root is not None:
            raise DataError(f"{data}: image_root applies to a JSON list, not to an ImageFolder-style directory")
        images, labels, names = _image_folder(data, names)
    elif data.is_file():
        images, labels, names = _json_list(data, names, image_root)
    else:
        raise DataError(f"classification data not found: {data} (expected a directory of class folders or a JSON list)")
    prompts = read_templates(templates) if templates is not None else list(DEFAULT_TEMPLATES)
    return ClassificationInputs(images, labels, list(names), prompts, str(data))

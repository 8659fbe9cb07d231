"""Inputs of zero-shot classification (vlp.data.classification): ImageFolder directories, JSON
lists, class and template files, and errors that name the file, line or entry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from vlp.data.classification import read_classes, read_classification_inputs, read_templates
from vlp.errors import DataError, EntryError


def _image(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 8)).save(path)
    return path


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    root = tmp_path / "imagefolder"
    _image(root / "dog" / "b.png")
    _image(root / "dog" / "a.JPG")  # extensions are case-insensitive
    _image(root / "cat" / "nested" / "c.jpeg")  # images at any depth below the class folder
    _image(root / "cat" / "d.webp")
    (root / "cat" / "notes.txt").write_text("not an image")
    return root


def test_image_folder_classes_default_to_the_sorted_folder_names(folder: Path) -> None:
    inp = read_classification_inputs(folder)
    assert inp.classes == ["cat", "dog"]
    names = [Path(p).relative_to(folder).as_posix() for p in inp.images]
    assert names == ["cat/d.webp", "cat/nested/c.jpeg", "dog/a.JPG", "dog/b.png"]
    assert inp.labels == [0, 0, 1, 1]
    assert inp.templates == ["{}"] and inp.prompts() == ["cat", "dog"]


def test_image_folder_with_a_class_file_uses_its_order(folder: Path, tmp_path: Path) -> None:
    classes = tmp_path / "classes.txt"
    classes.write_text("dog\n\n  cat  \nbird\n")  # blank lines skipped, names stripped
    inp = read_classification_inputs(folder, classes=classes)
    assert inp.classes == ["dog", "cat", "bird"]
    assert inp.labels == [1, 1, 0, 0]


def test_image_folder_errors(folder: Path, tmp_path: Path) -> None:
    only_dog = tmp_path / "classes.json"
    only_dog.write_text('["dog"]')
    with pytest.raises(DataError, match=r"cat: folder 'cat' is not one of the 1 classes"):
        read_classification_inputs(folder, classes=only_dog)
    with pytest.raises(DataError, match="image_root applies to a JSON list"):
        read_classification_inputs(folder, image_root=tmp_path)
    (tmp_path / "empty" / "a").mkdir(parents=True)
    with pytest.raises(DataError, match="no images"):
        read_classification_inputs(tmp_path / "empty")
    with pytest.raises(DataError, match="not found"):
        read_classification_inputs(tmp_path / "missing")


def test_json_list_resolves_paths_and_defaults_to_the_sorted_labels(tmp_path: Path) -> None:
    data = tmp_path / "sub" / "test.json"
    data.parent.mkdir()
    data.write_text(json.dumps([{"image": "x.png", "label": "zebra"}, {"image": "/abs/y.png", "label": "ant"}]))
    inp = read_classification_inputs(data)
    assert inp.classes == ["ant", "zebra"] and inp.labels == [1, 0]
    assert inp.images == [str(tmp_path / "sub" / "x.png"), "/abs/y.png"]
    assert read_classification_inputs(data, image_root=tmp_path / "imgs").images[0] == str(tmp_path / "imgs" / "x.png")


def test_json_label_outside_the_classes_is_an_entry_error(tmp_path: Path) -> None:
    data = tmp_path / "test.json"
    data.write_text(json.dumps([{"image": "a.png", "label": "cat"}, {"image": "b.png", "label": "dog"}]))
    classes = tmp_path / "classes.txt"
    classes.write_text("cat\n")
    with pytest.raises(EntryError, match=r"test.json: entry 1: label 'dog' is not one of the 1 classes") as e:
        read_classification_inputs(data, classes=classes)
    assert e.value.entry == 1 and e.value.key == "label"


def test_json_entry_errors_name_the_entry_and_key(tmp_path: Path) -> None:
    data = tmp_path / "test.json"
    data.write_text(json.dumps([{"image": "a.png", "label": "cat"}, {"image": "b.png"}]))
    with pytest.raises(EntryError, match=r"entry 1: missing key 'label'"):
        read_classification_inputs(data)
    data.write_text(json.dumps([{"image": "a.png", "label": 3}]))
    with pytest.raises(EntryError, match=r"entry 0: key 'label' is int"):
        read_classification_inputs(data)
    data.write_text(json.dumps({"image": "a.png"}))
    with pytest.raises(DataError, match="expected a JSON list"):
        read_classification_inputs(data)


def test_templates_from_text_and_json(tmp_path: Path) -> None:
    txt = tmp_path / "templates.txt"
    txt.write_text("a photo of a {}\n\n{} {{x}}\n")  # other braces stay as written
    assert read_templates(txt) == ["a photo of a {}", "{} {{x}}"]
    js = tmp_path / "templates.json"
    js.write_text('["a {}", "one {}"]')
    assert read_templates(js) == ["a {}", "one {}"]


def test_prompts_are_class_major(tmp_path: Path) -> None:
    data = tmp_path / "test.json"
    data.write_text(json.dumps([{"image": "a.png", "label": "cat"}, {"image": "b.png", "label": "dog"}]))
    t = tmp_path / "t.json"
    t.write_text('["a {}", "two {}s"]')
    assert read_classification_inputs(data, templates=t).prompts() == ["a cat", "two cats", "a dog", "two dogs"]


def test_a_template_without_exactly_one_slot_names_the_file_and_line(tmp_path: Path) -> None:
    txt = tmp_path / "templates.txt"
    txt.write_text("a {}\n\nno slot here\n")
    with pytest.raises(DataError, match=r"templates.txt: line 3: template 'no slot here' holds '\{\}' 0 times"):
        read_templates(txt)
    txt.write_text("{} and {}\n")
    with pytest.raises(DataError, match=r"line 1: .* 2 times"):
        read_templates(txt)
    js = tmp_path / "templates.json"
    js.write_text('["a {}", "b"]')
    with pytest.raises(DataError, match=r"templates.json: entry 1: template 'b'"):
        read_templates(js)
    js.write_text('["a {}", 5]')
    with pytest.raises(EntryError, match=r"entry 1: expected a non-empty template string, got 5"):
        read_templates(js)


def test_class_file_errors_name_the_file_and_line(tmp_path: Path) -> None:
    txt = tmp_path / "classes.txt"
    txt.write_text("cat\ndog\ncat\n")
    with pytest.raises(DataError, match=r"classes.txt: line 3: class 'cat' repeats line 1"):
        read_classes(txt)
    txt.write_text("\n\n")
    with pytest.raises(DataError, match="no class names"):
        read_classes(txt)
    with pytest.raises(DataError, match="class name file not found"):
        read_classes(tmp_path / "missing.txt")
    js = tmp_path / "classes.json"
    js.write_text('{"a": 1}')
    with pytest.raises(DataError, match="expected a JSON list of class name strings"):
        read_classes(js)

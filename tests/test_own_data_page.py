"""docs/own_data.md, "Train on your own data" (issue 54), run as written: a folder of generated photos
with ``.txt`` captions (and a CSV of them) is written into a fresh working directory with a link
``configs`` to vlp's ``configs/``, then every command of the page's ```bash blocks runs there in
order, unchanged (through :func:`vlp.cli.main`, in this process), and must succeed and leave the file
or folder it names with ``--out`` / ``output_dir=``."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from PIL import Image, ImageDraw

from tests.helpers import ROOT
from vlp.cli import main

PAGE = ROOT / "docs" / "own_data.md"
#: photos per split, as the page says (48 in all)
SPLITS = {"train": 32, "val": 8, "test": 8}
COLOURS = {"red": (220, 30, 30), "green": (30, 180, 60), "blue": (40, 70, 220), "yellow": (230, 210, 40)}
SHAPES = ("circle", "square")


def write_photos(root: Path) -> None:
    """``root/photos/{train,val,test}/NNNNNN.jpg`` (64 px: a coloured shape on the left or right)
    with a two-line caption file each (some in a sub-folder), and ``root/photos/train.csv``
    (open_clip's tab-separated defaults, paths relative to ``photos/``)."""
    rows = ["filepath\ttitle"]
    n = 0
    for split, count in SPLITS.items():
        for i in range(count):
            n += 1
            colour, shape, side = list(COLOURS)[n % 4], SHAPES[n // 4 % 2], ("left", "right")[n // 8 % 2]
            im = Image.new("RGB", (64, 64), (245, 245, 245))
            x = 4 if side == "left" else 34
            box = (x, 18, x + 26, 44)
            draw = ImageDraw.Draw(im)
            (draw.ellipse if shape == "circle" else draw.rectangle)(box, fill=COLOURS[colour])
            rel = f"{split}/{'trip/' if i % 5 == 4 else ''}{n:06d}.jpg"
            path = root / "photos" / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            im.save(path, quality=90)
            caption = f"a {colour} {shape}"
            path.with_suffix(".txt").write_text(f"{caption}\n{caption} on the {side}\n")
            if split == "train":
                rows.append(f"{rel}\t{caption} on the {side}")
    (root / "photos" / "train.csv").write_text("\n".join(rows) + "\n")


def page_commands(page: Path) -> list[list[str]]:
    """The commands of the page's ```bash blocks, in order, each split as a shell splits it
    (a backslash at a line's end continues it; ``#`` starts a comment)."""
    blocks = re.findall(r"^```bash\n(.*?)^```", page.read_text(), flags=re.S | re.M)
    commands = []
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            argv = shlex.split(line, comments=True)
            if argv:
                commands.append(argv)
    return commands


def written(argv: list[str]) -> list[str]:
    """What a command names as its output: ``--out X`` or ``output_dir=X``."""
    outs = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--out"]
    return outs + [a.split("=", 1)[1] for a in argv if a.startswith("output_dir=")]


def test_the_page_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    write_photos(tmp_path)
    (tmp_path / "configs").symlink_to(ROOT / "configs", target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    commands = page_commands(PAGE)
    assert [c[:3] for c in commands[:5]] == [["vlp", "prepare", "folder"]] * 3 + [
        ["vlp", "data", "check"],
        ["vlp", "prepare", "csv"],
    ]
    assert {c[1] for c in commands} == {"prepare", "data", "pretrain", "evaluate", "finetune", "make-shards"}
    for argv in commands:
        assert argv[0] == "vlp", argv
        capsys.readouterr()
        status = main(argv[1:])
        out = capsys.readouterr()
        assert status == 0, f"{shlex.join(argv)} exited with {status}:\n{out.out[-3000:]}\n{out.err[-3000:]}"
        for path in written(argv):
            assert (tmp_path / path).exists(), f"{shlex.join(argv)} wrote no {path}"
        if argv[1:3] == ["data", "check"]:
            assert "0 errors, 0 warnings" in out.out
    train = json.loads((tmp_path / "data/own_train.json").read_text())
    assert len(train) == SPLITS["train"] and all(len(e["caption"]) == 2 for e in train)
    from_csv = json.loads((tmp_path / "data/own_train_from_csv.json").read_text())
    assert sorted(e["image"] for e in from_csv) == sorted(e["image"] for e in train)  # one caption each
    zero_shot = json.loads((tmp_path / "runs/own/eval_test/metrics.json").read_text())
    fine_tuned = json.loads((tmp_path / "runs/own_retrieval/results.json").read_text())
    assert zero_shot["n_images"] == SPLITS["test"] and zero_shot["n_texts"] == 2 * SPLITS["test"]
    assert "r_mean" in zero_shot and "r_mean" in fine_tuned["test"] and "r_mean" in fine_tuned["val"]
    assert (tmp_path / "runs/own/eval_test/retrieval_examples.png").is_file()
    assert (tmp_path / "runs/own_retrieval/checkpoints/best").is_dir()
    stats = sorted(p.name for p in (tmp_path / "shards/own_train").glob("*_stats.json"))
    assert stats == ["shard-00000_stats.json", "shard-00001_stats.json"]

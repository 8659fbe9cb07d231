"""Text and images that cannot be used, caught before they crash or hang a run (issue 29, part 3):
lone surrogates and overlong captions, non-regular files named as images, the decoded size limit
in bytes, and a 16-bit image converted without float64 copies."""

from __future__ import annotations

import io
import json
import os
import re
import tarfile
import threading
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vlp.data.check import check_annotations
from vlp.data.formats import MAX_CAPTION_CHARS, load_pairs
from vlp.data.shard_format import ShardInfo, iter_shard
from vlp.errors import DataError
from vlp.preprocess.images import BadImage, open_image


def annotations(tmp_path: Path, captions: list[str]) -> Path:
    Image.new("RGB", (32, 32), (200, 30, 30)).save(tmp_path / "a.png")
    f = tmp_path / "ann.json"
    # json.dumps writes a lone surrogate as the escape "\ud800", which json.loads turns back into one
    f.write_text(json.dumps([{"image": "a.png", "caption": c} for c in captions]))
    return f


@pytest.mark.parametrize(
    "caption, message",
    [
        ("a red \ud800 circle", r"a lone surrogate '\\ud800' at character 6"),
        ("word " * (MAX_CAPTION_CHARS // 5 + 1), f"longer than {MAX_CAPTION_CHARS} characters"),
    ],
)
def test_captions_the_tokenizer_cannot_take_are_named(tmp_path: Path, caption: str, message: str) -> None:
    f = annotations(tmp_path, ["a fine caption", caption])
    with pytest.raises(DataError, match=rf"ann.json: entry 1: key 'caption' is .*{message}"):
        load_pairs([f], tmp_path)
    assert [s.captions for s in load_pairs([f], tmp_path, on_bad="skip")] == [("a fine caption",)]
    report = check_annotations([f], tmp_path, images=False)
    assert not report.ok and any(p.entry == 1 and re.search(message, p.message) for p in report.problems)


def test_a_shard_caption_with_a_lone_surrogate_is_a_data_error(tmp_path: Path) -> None:
    path = tmp_path / "00000.tar"
    with tarfile.open(path, "w") as tf:
        for name, data in (("k.jpg", b"\xff\xd8"), ("k.json", b'{"caption": "a \\ud800 b"}')):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    with pytest.raises(DataError, match=r"00000.tar: sample 'k'.*lone surrogate"):
        list(iter_shard(ShardInfo(path, 1, 1, 0, "img2dataset")))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_a_fifo_named_as_an_image_is_refused_without_opening_it(tmp_path: Path) -> None:
    fifo = tmp_path / "image.jpg"
    os.mkfifo(fifo)
    outcome: list[BaseException] = []

    def try_open() -> None:
        try:
            open_image(str(fifo), "ann.json entry 0")
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            outcome.append(e)

    t = threading.Thread(target=try_open, daemon=True)  # opening a FIFO blocks until a writer comes
    t.start()
    t.join(timeout=10)
    assert not t.is_alive(), "open_image blocked on a FIFO"
    assert isinstance(outcome[0], BadImage) and "is a FIFO (named pipe), not a regular file: not an image file" in str(
        outcome[0]
    )


def test_the_size_limit_counts_decoded_bytes(tmp_path: Path) -> None:
    """``max_pixels`` budgets the decoded bytes of an RGB image that size: a 30x30 RGBA image
    (3,600 bytes) passes a 1,000-pixel limit by pixels but not by bytes; 8-bit grey (900) passes."""
    for mode, ok in (("RGBA", False), ("L", True)):
        f = tmp_path / f"{mode}.png"
        Image.new(mode, (30, 30)).save(f)
        if ok:
            assert open_image(str(f), "x", max_pixels=1000).size == (30, 30)
        else:
            with pytest.raises(BadImage, match="30x30 RGBA = 3600 bytes decoded, more than the limit of 3000"):
                open_image(str(f), "x", max_pixels=1000)


def test_data_max_image_pixels_wins_over_pillows_own_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 41, item 9: Pillow refuses images over twice ``Image.MAX_IMAGE_PIXELS`` (178.9M pixels)
    by itself, so ``data.max_image_pixels=0`` ("no limit") or a limit above Pillow's did not apply.
    Pillow's cap is lowered here (a cheap stand-in for a 180M-pixel image): vlp's setting decides,
    in both directions, and Pillow's global is left as it was for every other caller."""
    f = tmp_path / "wide.png"
    Image.new("RGB", (40, 30), (10, 20, 30)).save(f)  # 1200 pixels, 3600 bytes decoded
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)  # Pillow alone refuses above 200 pixels
    with pytest.raises(Image.DecompressionBombError):
        Image.open(f)
    assert open_image(str(f), "x", max_pixels=0).getpixel((39, 29)) == (10, 20, 30)  # 0: no limit
    assert open_image(str(f), "x", max_pixels=1200).size == (40, 30)  # vlp's limit above Pillow's
    with pytest.raises(BadImage, match=r"3600 bytes decoded, more than the limit of 3000 .*data.max_image_pixels"):
        open_image(str(f), "x", max_pixels=1000)  # and below it: vlp's message, vlp's limit
    member = io.BytesIO(f.read_bytes())  # a shard member (a file object) as well
    assert open_image(member, "x", max_pixels=0).size == (40, 30)  # type: ignore[arg-type]
    assert Image.MAX_IMAGE_PIXELS == 100


def test_a_16_bit_image_is_converted_without_float64_copies(tmp_path: Path) -> None:
    """A 16-bit PNG converted to 8-bit RGB: numpy's allocations stay under 8 bytes a pixel (the float64
    conversion took 24, which made a 9000x9000 PNG of 157 KB cost 2 GB)."""
    a = (np.arange(1500 * 1200, dtype=np.uint32).reshape(1200, 1500) % 65536).astype(np.uint16)
    f = tmp_path / "deep.png"
    Image.fromarray(a).save(f)
    tracemalloc.start()
    try:
        im = open_image(str(f), "x")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert im.mode == "RGB" and im.size == (1500, 1200)
    assert peak < 8 * a.size, peak
    got = np.asarray(im)[..., 0].astype(np.int64)
    assert np.abs(got - (a.astype(np.int64) * 255 // 65535)).max() <= 1  # the same 8-bit values


def test_a_vlp_shard_member_with_non_string_captions_is_a_data_error(tmp_path: Path) -> None:
    """``"captions": [123, null, {}]`` in a vlp shard raised an AttributeError deep in training."""
    path = tmp_path / "shard-00000.tar"
    meta = json.dumps({"captions": [123, None, {}], "image_id": 0, "image_key": "k"}).encode()
    with tarfile.open(path, "w") as tf:
        for name, data in (("k.jpg", b"\xff\xd8"), ("k.json", meta)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    with pytest.raises(DataError, match=r"shard-00000.tar: sample 'k': k.json 'captions' holds 123, expected caption"):
        list(iter_shard(ShardInfo(path, 1, 1, 0)))

"""`vlp prepare eccv-caption`: ECCV Caption / CxC positives (COCO ids) -> a relevance file of a Karpathy
test file, on miniature id-consistent files in the formats of the eccv-caption package and COCO."""

import importlib.util
import json
import zipfile
from pathlib import Path

import pytest

from vlp.cli import main
from vlp.data.formats import load_retrieval_split
from vlp.data.relevance import Relevance, load_relevance_file
from vlp.errors import DataError
from vlp.eval.metrics import relevance_metrics
from vlp.prepare import eccv as eccv_mod
from vlp.prepare import eccv_caption


def dump(path, obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))
    return path


# The Karpathy test file: 4 images, 7 captions (t0..t6 in this order). Image 404 is named without
# COCO's file name; its id comes from the digits that end it.
KARPATHY = [
    {"image": "val2014/COCO_val2014_000000000101.jpg", "caption": ["A dog runs.", "two dogs", "two dogs"]},
    {"image": "val2014/COCO_val2014_000000000202.jpg", "caption": ["a cat sleeps", "a sleeping cat"]},
    {"image": "val2014/COCO_val2014_000000000303.jpg", "caption": ["a red bus"]},
    {"image": "birds/404.jpg", "caption": ["a bird"]},
]
COCO = {
    "images": [{"id": i, "file_name": f"COCO_val2014_{i:012d}.jpg"} for i in (101, 202, 303, 404, 999)],
    "annotations": [
        {"id": 11, "image_id": 101, "caption": "A dog  runs.\n"},  # whitespace differs: t0
        {"id": 13, "image_id": 101, "caption": "two dogs"},  # the first "two dogs" in file order: t1
        {"id": 12, "image_id": 101, "caption": "two dogs "},  # the second: t2
        {"id": 14, "image_id": 101, "caption": "a sixth caption"},  # not in the Karpathy file
        {"id": 21, "image_id": 202, "caption": "a cat sleeps"},  # t3
        {"id": 22, "image_id": 202, "caption": "a sleeping cat"},  # t4
        {"id": 31, "image_id": 303, "caption": "a red bus"},  # t5
        {"id": 41, "image_id": 404, "caption": "a bird"},  # t6
        {"id": 91, "image_id": 999, "caption": "not a test image"},
    ],
}
ECCV_I2T = {"101": [11, 12, 21], "303": [31, 41]}  # image id -> caption ids
ECCV_T2I = {"11": [101, 202], "41": [404, 303], "13": [101]}  # caption id -> image ids
CXC_I2T = {"202": [21, 22]}
CXC_T2I = {"22": [202]}


@pytest.fixture()
def files(tmp_path):
    data = tmp_path / "eccv_caption" / "data"  # the package's layout
    for name, obj in (
        ("eccv_image_to_caption.json", ECCV_I2T),
        ("eccv_caption_to_image.json", ECCV_T2I),
        ("cxc_image_to_caption.json", CXC_I2T),
        ("cxc_caption_to_image.json", CXC_T2I),
    ):
        dump(data / name, obj)
    return {
        "karpathy": dump(tmp_path / "coco_test.json", KARPATHY),
        "coco": dump(tmp_path / "captions_val2014.json", COCO),
        "data": data,
        "package": tmp_path / "eccv_caption",
        "out": tmp_path / "out" / "eccv_relevance.json",
    }


def prepare(files, eccv=None, **kw):
    return eccv_caption(files["karpathy"], files["coco"], eccv or files["data"], files["out"], **kw)


def loaded(files):
    return load_relevance_file(files["out"], load_retrieval_split(files["karpathy"]))


def test_maps_coco_ids_onto_the_karpathy_order(files):
    counts = prepare(files)
    assert counts == {
        "images": 4,
        "captions": 7,
        "captions_matched": 7,  # 14 (not in the file) and 91 (not a test image) are not
        "i2t_queries": 2,
        "i2t_positives": 5,
        "t2i_queries": 3,
        "t2i_positives": 5,
    }
    # image 101 (entry 0) -> captions 11, 12, 21 = t0, t2, t3; image 303 (entry 2) -> 31, 41 = t5, t6
    # caption 11 (t0) -> images 101, 202 = 0, 1; caption 41 (t6) -> 404, 303 = 3, 2; caption 13 (t1) -> 0
    want = Relevance(
        images=[[0, 1], [0], [], [], [], [], [2, 3]],
        texts=[[0, 2, 3], [], [5, 6], []],
        benchmark="eccv-caption",
    )
    assert loaded(files) == want
    record = json.loads(files["out"].read_text())
    assert record["format"] == "vlp-relevance-v2" and record["annotation"] == "coco_test.json"
    assert record["texts"] == [c for e in KARPATHY for c in e["caption"]] and record["num_images"] == 4


def test_cxc_and_every_source_of_the_id_files(files, tmp_path, monkeypatch):
    prepare(files, benchmark="cxc")
    assert loaded(files) == Relevance([[], [], [], [], [1], [], []], [[], [3, 4], [], []], "cxc")
    prepare(files, eccv=files["package"])  # the package folder (its data/ inside)
    want = loaded(files)
    wheel = tmp_path / "eccv_caption-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for p in files["data"].iterdir():
            z.write(p, f"eccv_caption/data/{p.name}")
    prepare(files, eccv=wheel)
    assert loaded(files) == want
    dump(files["package"] / "__init__.py", {})  # an installed package, found without importing it
    monkeypatch.syspath_prepend(str(files["package"].parent))
    prepare(files, eccv="auto")
    assert loaded(files) == want and want.texts == [[0, 2, 3], [], [5, 6], []]


def bad_id_file(files, name, obj):
    dump(files["data"] / name, obj)


@pytest.mark.parametrize(
    "name, obj, message",
    [
        (
            "eccv_image_to_caption.json",
            {"101": [77]},
            r"eccv_image_to_caption\.json: key '101': caption id 77 is not in .*captions_val2014\.json \(annotations\[\]\.id\)",
        ),
        ("eccv_image_to_caption.json", {"999": [11]}, r"key '999': image id 999 is not an image of .*coco_test\.json"),
        (
            "eccv_caption_to_image.json",
            {"91": [101]},
            r"key '91': caption id 91 \(image 999, 'not a test image'\) is not a caption of .*coco_test\.json "
            r"\(no entry: its image is not there\)",
        ),
        (
            "eccv_caption_to_image.json",
            {"14": [101]},
            r"caption id 14 \(image 101, 'a sixth caption'\) is not a caption of .*coco_test\.json \(entry 0\)",
        ),
        ("eccv_caption_to_image.json", {"11": [555]}, r"key '11': image id 555 is not an image of"),
        ("eccv_caption_to_image.json", {"abc": [101]}, r"key 'abc' is not a COCO id \(expected digits\)"),
        ("eccv_image_to_caption.json", {"101": 11}, r"key '101': expected a non-empty list of caption ids"),
        ("eccv_caption_to_image.json", {"11": [101.0]}, r"key '11': expected a non-empty list of image ids"),
        ("eccv_caption_to_image.json", [[11, 101]], r"expected a non-empty object of COCO id -> list of image ids"),
    ],
)
def test_bad_id_files_name_the_file_key_and_id(files, name, obj, message):
    bad_id_file(files, name, obj)
    with pytest.raises(DataError, match=message):
        prepare(files)
    assert not files["out"].exists()


def test_bad_coco_karpathy_and_sources(files, tmp_path, monkeypatch):
    bad = dict(COCO, annotations=[*COCO["annotations"][:2], {"id": 5, "image_id": 101}])
    dump(files["coco"], bad)
    with pytest.raises(DataError, match=r"captions_val2014\.json: annotations\[2\]: missing key 'caption'"):
        prepare(files)
    dump(files["coco"], COCO)
    dump(files["karpathy"], [*KARPATHY, {"image": "val2014/no_id.jpg", "caption": ["x"]}])
    with pytest.raises(DataError, match=r"coco_test\.json: entry 4: image 'no_id\.jpg' is not in the COCO captions"):
        prepare(files)
    dump(files["karpathy"], KARPATHY)
    (files["data"] / "eccv_caption_to_image.json").unlink()
    with pytest.raises(DataError, match=r"no eccv_caption_to_image\.json there, in data/ or in eccv_caption/data/"):
        prepare(files)
    wheel = tmp_path / "other.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("eccv_caption/data/eccv_image_to_caption.json", "{not json")
    with pytest.raises(DataError, match=r"other\.whl:eccv_caption/data/eccv_image_to_caption\.json: invalid JSON"):
        prepare(files, eccv=wheel)
    with pytest.raises(DataError, match=r"--eccv .*nowhere: no such file or folder"):
        prepare(files, eccv=tmp_path / "nowhere")
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("eccv_caption/__init__.py", "")
    with pytest.raises(DataError, match=r"other\.whl: no eccv_image_to_caption\.json in this archive"):
        prepare(files, eccv=wheel)
    monkeypatch.setattr(eccv_mod, "find_spec", lambda name: None)
    with pytest.raises(DataError, match=r"--eccv auto: the eccv-caption package is not installed"):
        prepare(files, eccv="auto")
    with pytest.raises(DataError, match="unknown benchmark 'coco'; expected one of eccv-caption, cxc"):
        prepare(files, benchmark="coco")
    assert not files["out"].exists()


def test_cli(files, capsys):
    args = ["prepare", "eccv-caption", "--karpathy-test", str(files["karpathy"]), "--coco-captions", str(files["coco"])]
    assert main([*args, "--eccv", str(files["data"]), "--out", str(files["out"])]) == 0
    out = capsys.readouterr().out
    assert "eccv-caption: images=4, captions=7, captions_matched=7, i2t_queries=2" in out and "wrote " in out
    assert main([*args, "--eccv", str(files["data"]), "--benchmark", "cxc", "--out", str(files["out"])]) == 0
    assert loaded(files).benchmark == "cxc"
    bad_id_file(files, "eccv_image_to_caption.json", {"101": [77]})
    assert main([*args, "--eccv", str(files["data"]), "--out", str(files["out"])]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vlp: error: ") and "caption id 77" in err[0]


def test_the_check_script_on_generated_coco_files(files, tmp_path, capsys):
    """scripts/eccv_check.py (run on the real package in docs/evaluation.md): its generated Karpathy
    and COCO files hold every id of the benchmark, so the prepare step maps them all."""
    path = Path(__file__).parents[2] / "scripts" / "eccv_check.py"
    spec = importlib.util.spec_from_file_location("eccv_check", path)
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    # the package's original COCO positives: 4 images x their captions; 14 and 91 are not among them
    original = {"101": [11, 12, 13], "202": [21, 22], "303": [31], "404": [41]}
    dump(files["data"] / "original_image_to_caption.json", original)
    bad_id_file(files, "eccv_caption_to_image.json", {**ECCV_T2I, "91": [202]})  # 91: an extra caption id
    result = check.main(["--eccv", str(files["data"]), "--out", str(tmp_path / "c")])
    assert result["counts"]["captions"] == 8 and result["counts"]["captions_matched"] == 8  # 7 + the extra 91
    assert result["counts"]["t2i_queries"] == 4 and result["eccv_caption"] == {}
    split = load_retrieval_split(tmp_path / "c" / "coco_test.json")
    assert split.texts[3] == "caption 91" and split.txt2img[3] == 0  # the extra id: a caption of the first image
    rel = load_relevance_file(tmp_path / "c" / "relevance.json", split)
    s = check.scores(split)
    want = relevance_metrics(s, s.T.contiguous(), rel.images, relevant_texts=rel.texts)
    assert result["vlp"]["txt_map_at_r"] == want["txt_map_at_r"] and "img_map_at_r" in capsys.readouterr().out

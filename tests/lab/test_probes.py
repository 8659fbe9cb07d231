"""`vlp analyze probes | minimal-pairs | ltd-floor` (vlp.lab.probes, vlp.lab.minimal_pairs, vlp.lab.ltd_floor) on a tiny shapes world: a
stand-in model that sees only colours (what must and must not be found), and a tiny real checkpoint."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from tests.helpers import dual_checkpoint
from vlp.errors import DataError
from vlp.features.targets import write_targets
from vlp.lab import ltd_floor, minimal_pairs, probes
from vlp.lab.attributes import attribute_value
from vlp.losses.ltd import reconstruction_floor
from vlp.world.scene import COLOR_RGB, COLORS, SHAPES

WORLD = dict(seed=0, n_train=20, n_val=2, n_test=40)


class ColourModel:
    """Stands in for :class:`vlp.api.VLPModel`: a caption is the colour and shape words it contains,
    an image the colours present in it. It keeps colour (and, in text, shape) and drops everything else."""

    source: dict = {}

    def encode_text(self, texts: list[str]) -> torch.Tensor:
        words = [*COLORS, *SHAPES]
        return torch.tensor([[float(w in t.split() or f"{w}s" in t.split()) for w in words] for t in texts])

    def encode_image(self, images: list) -> torch.Tensor:
        out = []
        for im in images:
            px = np.asarray(Image.open(im).convert("RGB") if isinstance(im, str) else im).reshape(-1, 3)
            present = {tuple(p) for p in np.unique(px, axis=0).tolist()}
            out.append([float(COLOR_RGB[c] in present) for c in COLORS] + [0.0] * len(SHAPES))
        return torch.tensor(out)


def test_probes_find_what_the_embedding_keeps_and_not_what_it_drops(world, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(probes, "load_model", lambda *a: ColourModel())
    rec = probes.run_probes("unused", world["root"], tmp_path, seed=1)
    res = rec["attributes"]
    records = json.loads(world["scenes"].read_text())["splits"]["test"]
    texts = {c["text"]: c["predicate"] for r in records for c in r["captions"]}
    assert rec["n_captions"] == len(texts)
    for a, r in res.items():
        labelled = sum(attribute_value(p, a) is not None for p in texts.values())
        assert r["n_train"] + r["n_test"] == labelled
    assert res["color"]["accuracy"] == 1.0 and res["shape"]["accuracy"] == 1.0
    assert res["color"]["majority"] < 0.5
    for a in ("size", "cell"):  # not in the embedding: no better than the majority class (small-sample slack)
        assert res[a]["accuracy"] <= res[a]["majority"] + 0.15
    assert json.loads((tmp_path / "probes.json").read_text()) == rec
    assert (tmp_path / "probes.png").stat().st_size > 0


def test_minimal_pairs_find_colour_changes_and_tie_on_the_rest(world, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(probes, "load_model", lambda *a: ColourModel())
    rec = minimal_pairs.run_minimal_pairs("unused", world["root"], tmp_path, n_captions=15, per_attribute=2)
    res = rec["attributes"]
    assert rec["n_captions"] == 15
    for a in ("shape", "size", "cell"):  # the same colours in target and distractor: every pair a tie
        assert res[a]["accuracy"] == 0.5
    assert res["color"]["accuracy"] > 0.75
    pairs = json.loads((tmp_path / "minimal_pairs_detail.json").read_text())["pairs"]
    assert (
        len(pairs)
        == res["all"]["n_pairs"]
        == sum(res[a]["n_pairs"] for a in ("shape", "color", "size", "cell", "count"))
    )
    for a in ("color", "count", "all"):  # the accuracy is the per-pair record's share of wins (ties 1/2)
        mine = [p for p in pairs if a in ("all", p["attribute"])]
        won = [
            (p["score_target"] > p["score_distractor"]) + 0.5 * (p["score_target"] == p["score_distractor"])
            for p in mine
        ]
        assert res[a]["accuracy"] == pytest.approx(sum(won) / len(won))
    assert (tmp_path / "minimal_pairs.png").stat().st_size > 0


def test_probes_and_minimal_pairs_run_on_a_checkpoint(world, tmp_path) -> None:
    ckpt = dual_checkpoint(tmp_path / "run")
    rec = probes.run_probes(ckpt, world["root"], tmp_path / "p", device="cpu")
    assert {a for a, r in rec["attributes"].items() if 0.0 <= r["accuracy"] <= 1.0} == set(probes.PROBE_ATTRIBUTES)
    mp = minimal_pairs.run_minimal_pairs(tmp_path / "run", world["root"], tmp_path / "m", n_captions=4, device="cpu")
    assert mp["n_captions"] == 4 and 0.0 <= mp["attributes"]["all"]["accuracy"] <= 1.0


def test_ltd_floor_is_zero_for_attributes_the_targets_ignore(world, tmp_path) -> None:
    entries = json.loads(world["pretrain"].read_text())
    texts = sorted({c for e in entries for c in e["caption"]})
    # a target that depends on the caption's colour words only (plus a constant dimension)
    vectors = torch.tensor([[1.0] + [float(c in t.split()) for c in COLORS] for t in texts])
    targets = write_targets(tmp_path / "t.safetensors", texts, vectors, "test-encoder", [str(world["pretrain"])])
    rec = ltd_floor.run_ltd_floor(targets, [world["pretrain"]], tmp_path / "f")
    floors = rec["floors"]
    assert rec["n_captions"] == 5 * len(entries)
    for a in ("shape", "size", "cell", "count", "relation", "size+cell+relation"):
        assert floors[a]["floor"] == pytest.approx(0.0, abs=1e-12)
    assert 0.0 < floors["color"]["floor"] < floors["caption"]["floor"]
    f = floors["color"]
    assert f["floor_mentioning"] * f["share_mentioning"] == pytest.approx(f["floor"])
    assert floors["caption"]["groups"] == 1 and floors["caption"]["share_mentioning"] == 1.0
    one_group = torch.zeros(len(texts), dtype=torch.long)  # each distinct text once
    assert floors["caption"]["floor_distinct"] == pytest.approx(reconstruction_floor(vectors, one_group))
    assert json.loads((tmp_path / "f" / "ltd_floor.json").read_text()) == rec
    bad = tmp_path / "other.json"
    bad.write_text(json.dumps([{"image": str(world["root"] / entries[0]["image"]), "caption": "a dog on a sofa"}]))
    t2 = write_targets(tmp_path / "t2.safetensors", ["a dog on a sofa"], torch.ones(1, 3), "x", [str(bad)])
    assert ltd_floor.run_ltd_floor(t2, [bad], tmp_path / "g", attributes=("caption",))["floors"]["caption"][
        "floor"
    ] == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(DataError, match="not a shapes-world caption"):
        ltd_floor.run_ltd_floor(t2, [bad], tmp_path / "g", attributes=("color",))

"""``vlp search`` (vlp.search.query): a text query's ranking equals a brute-force ranking of
``encode_text(query) @ features.T``, ``--json`` prints the hits exactly, ``--rerank-itm K`` orders the
ITC top K by the ITM match logit as ALBEF's evaluation does, ``--image`` ranks by image-image
cosine, and bad input is one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.search.conftest import GOOD, tiny_run
from vlp import VLPModel
from vlp.api import pixel_values, tokenize
from vlp.cli import main
from vlp.search import Searcher, open_index

QUERY = "a red circle left of a blue square"


@pytest.fixture(scope="module")
def searcher(index: Path) -> Searcher:
    return Searcher.open(index, device="cpu")


def _brute(features: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every row by ``features @ q``, highest first (ties by row), and the scores."""
    scores = np.asarray(features) @ q
    return np.lexsort((np.arange(len(scores)), -scores)), scores


def test_a_text_query_ranks_as_brute_force(searcher: Searcher, index: Path, photos: Path) -> None:
    q = searcher.embedder.model.encode_text([QUERY])[0].numpy()
    order, scores = _brute(open_index(index).features, q)
    hits = searcher.text(QUERY, top=5)
    assert [h.row for h in hits] == order[:5].tolist()
    assert [h.rank for h in hits] == [1, 2, 3, 4, 5]
    assert [h.path for h in hits] == [str(photos / GOOD[r]) for r in order[:5]]
    np.testing.assert_allclose([h.itc for h in hits], scores[order[:5]], atol=1e-6, rtol=0)
    assert all(h.itm is None for h in hits)


def test_json_prints_the_hits_exactly_and_top_beyond_the_index_gives_all(
    searcher: Searcher, index: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["search", str(index), QUERY, "--top", "50", "--json", "--device", "cpu"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == [h.to_json() for h in searcher.text(QUERY, top=50)]
    assert len(printed) == 7 and set(printed[0]) == {"rank", "row", "path", "itc", "itm"}


def test_the_table_has_a_line_per_hit_with_paths_below_the_working_folder_relative(
    searcher: Searcher, index: Path, photos: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    monkeypatch.chdir(photos)
    assert main(["search", str(index), QUERY, "--top", "3", "--device", "cpu"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    hits = searcher.text(QUERY, top=3)
    assert lines[0].split() == ["rank", "itc", "path"] and len(lines) == 4
    assert [line.split() for line in lines[1:]] == [[str(h.rank), f"{h.itc:.4f}", GOOD[h.row]] for h in hits]
    monkeypatch.chdir(index)
    assert main(["search", str(index), QUERY, "--top", "1", "--device", "cpu"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[1].split()[2] == str(photos / GOOD[hits[0].row])


def test_a_dual_encoder_indexes_and_searches_but_cannot_rerank(
    photos: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.helpers import dual_checkpoint
    from tests.search.conftest import index_argv

    run = tmp_path / "dual"
    dual_checkpoint(run)
    assert main(index_argv(photos, run, tmp_path / "idx")) == 0
    capsys.readouterr()
    assert main(["search", str(tmp_path / "idx"), QUERY, "--top", "2", "--json", "--device", "cpu"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 2
    assert main(["search", str(tmp_path / "idx"), QUERY, "--rerank-itm", "2", "--device", "cpu"]) == 2
    _one_error(capsys, "--rerank-itm: VLPModel.itm_score needs")


def test_itm_rerank_orders_the_itc_top_k_by_the_match_logit(
    searcher: Searcher, index: Path, photos: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain = searcher.text(QUERY, top=7)
    assert main(["search", str(index), QUERY, "--top", "6", "--rerank-itm", "4", "--json", "--device", "cpu"]) == 0
    hits = json.loads(capsys.readouterr().out)
    head, rest = hits[:4], hits[4:]
    assert {h["row"] for h in head} == {h.row for h in plain[:4]}  # the ITC top 4, re-ordered
    assert [h["row"] for h in rest] == [h.row for h in plain[4:6]] and all(h["itm"] is None for h in rest)
    logits = [h["itm"] for h in head]
    assert logits == sorted(logits, reverse=True)
    # the ITM head's class-1 logit, recomputed from the model's parts
    vm = searcher.embedder.model
    files = [str(photos / GOOD[h["row"]]) for h in head]
    tok = tokenize(vm, [QUERY] * 4)
    m = vm.model
    fused = m.fuse(
        m.text_states(tok["input_ids"], tok["attention_mask"]),
        tok["attention_mask"],
        m.encode_image(pixel_values(vm, files)).tokens,
    )
    np.testing.assert_allclose(logits, m.itm_logits(fused)[:, 1].detach().numpy(), atol=1e-5, rtol=0)
    itc = {h.row: h.itc for h in plain}
    assert all(h["itc"] == itc[h["row"]] for h in hits)  # both scores printed
    assert [h["rank"] for h in hits] == [1, 2, 3, 4, 5, 6]


def test_an_image_query_ranks_by_image_image_cosine(searcher: Searcher, index: Path, photos: Path) -> None:
    features = open_index(index).features
    hits = searcher.image(photos / GOOD[2], top=7)
    order, scores = _brute(features, np.asarray(features[2]))
    assert hits[0].row == 2 and abs(hits[0].itc - 1) < 1e-5
    assert [h.row for h in hits] == order.tolist()
    q = VLPModel.from_pretrained(searcher.embedder.folder, device="cpu").encode_image([str(photos / GOOD[2])])[0]
    rows = [h.row for h in hits]
    np.testing.assert_allclose([h.itc for h in hits], (np.asarray(features) @ q.numpy())[rows], atol=1e-5, rtol=0)


def _one_error(capsys: pytest.CaptureFixture[str], *parts: str) -> None:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vlp: error: "), err
    assert all(p in err[0] for p in parts), err


def test_bad_input_is_one_line(index: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cpu = ["--device", "cpu"]
    assert main(["search", str(tmp_path / "nope"), QUERY, *cpu]) == 2
    _one_error(capsys, "nope: no such index folder")
    other = tmp_path / "other"
    shutil.copytree(index, other)
    meta = json.loads((other / "meta.json").read_text())
    (other / "meta.json").write_text(json.dumps({**meta, "format_version": 2}))
    assert main(["search", str(other), QUERY, *cpu]) == 2
    _one_error(capsys, "index format version 2 is newer than this vlp reads (1); upgrade vlp")
    (other / "meta.json").write_text(json.dumps({**meta, "format": "clip-retrieval"}))
    assert main(["search", str(other), QUERY, *cpu]) == 2
    _one_error(capsys, "not a vlp image index (format 'clip-retrieval'")
    for query in ("", "   "):
        assert main(["search", str(index), query, *cpu]) == 2
        _one_error(capsys, "the query is empty")
    assert main(["search", str(index), *cpu]) == 2
    _one_error(capsys, "give a query text (or --image PATH)")
    assert main(["search", str(index), QUERY, "--image", "x.png", *cpu]) == 2
    _one_error(capsys, "not both")
    assert main(["search", str(index), "--image", "x.png", "--rerank-itm", "3", *cpu]) == 2
    _one_error(capsys, "--rerank-itm re-ranks text queries")
    assert main(["search", str(index), "--image", str(tmp_path / "x.png"), *cpu]) == 2
    _one_error(capsys, "query image: image file not found")
    assert main(["search", str(index), QUERY, "--top", "0", *cpu]) == 2
    _one_error(capsys, "--top 0")
    wide = tiny_run(tmp_path / "wide", embed_dim=8)
    assert main(["search", str(index), QUERY, "--checkpoint", str(wide), *cpu]) == 2
    _one_error(capsys, "gives 8-dim features, but the index", "holds 16-dim ones")


def test_other_weights_of_the_same_width_search_with_a_note(
    index: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tiny_run(tmp_path / "other", seed=1)
    assert main(["search", str(index), QUERY, "--checkpoint", str(other), "--device", "cpu"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vlp search: note: the index") and "other weights" in err[0]

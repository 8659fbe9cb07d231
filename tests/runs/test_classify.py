"""`vlp evaluate classification` (vlp.runs.evaluation.zero_shot_classification) end to end: a tiny world's classification splits,
a tiny checkpoint trained two steps, the files and keys it writes, and the ITM re-rank."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.helpers import QUICK, TINY_ALBEF, dual_checkpoint
from vlp.api import VLPModel
from vlp.cli import main
from vlp.data.classification import read_classification_inputs
from vlp.errors import CheckpointError, ConfigError, DataError
from vlp.runs.evaluation.zero_shot_classification import classification_scores, run_evaluate_classification
from vlp.world.task_files.classification import write_classification_splits

WORLD = dict(seed=0, n_train=40, n_val=4, n_test=20)
PRETRAIN = [*TINY_ALBEF, *QUICK, "train.steps=2", "train.log_every=1", "train.warmup_steps=1"]


@pytest.fixture(scope="module")
def splits(world) -> dict[str, Path]:
    """The world's classification splits of the test images."""
    return write_classification_splits(world["root"], "test")


def _evaluate(run: Path, splits, attr: str, out: Path, rerank_k: int = 0) -> dict:
    return run_evaluate_classification(
        run,
        splits[f"classification_{attr}_test"],
        out,
        classes=splits[f"classification_{attr}_classes"],
        templates=splits[f"classification_{attr}_templates"],
        rerank_k=rerank_k,
        batch_size=8,
        device="cpu",
        show_progress=False,
    )


def test_writes_metrics_predictions_and_confusion_plots(pretrained, splits, tmp_path) -> None:
    rec = _evaluate(pretrained, splits, "count", tmp_path, rerank_k=2)
    n, c = rec["n_images"], rec["n_classes"]
    assert (n, c, rec["n_templates"]) == (20, 4, 1)
    assert json.loads((tmp_path / "metrics.json").read_text()) == rec
    for key in ("itc", "rerank"):
        m = rec[key]
        assert {"top1", "top5", "top5_k", "mean_per_class", "per_class", "per_class_n", "confusion", "n"} <= set(m)
        assert m["n"] == n and m["top5_k"] == 4 and m["top5"] == 100.0  # k = all 4 classes
        conf = torch.tensor(m["confusion"])
        assert conf.shape == (c, c) and conf.sum() == n
        assert m["top1"] == pytest.approx(100.0 * conf.trace().item() / n)
        assert (tmp_path / ("confusion.png" if key == "itc" else "confusion_rerank.png")).stat().st_size > 0
    assert rec["chance"]["top1"] == 25.0
    assert rec["chance"]["majority"] == pytest.approx(100.0 * max(rec["itc"]["per_class_n"]) / n)
    preds = json.loads((tmp_path / "predictions.json").read_text())
    labels = [e["label"] for e in json.loads(splits["classification_count_test"].read_text())]
    assert [p["label"] for p in preds] == labels
    for p in preds:
        itc = [x["class"] for x in p["top5"]]
        assert [x["itc"] for x in p["top5"]] == sorted((x["itc"] for x in p["top5"]), reverse=True)
        reranked = [x["class"] for x in p["rerank_top5"]]
        # the re-rank only permutes the ITC top 2; the rest keep their ITC order
        assert set(reranked[:2]) == set(itc[:2]) and reranked[2:] == itc[2:]
        itm = [x["itm"] for x in p["rerank_top5"][:2]]
        assert itm == sorted(itm, reverse=True) and all("itm" not in x for x in p["rerank_top5"][2:])


def test_itm_scores_are_the_template_mean_of_the_match_probability(pretrained, splits) -> None:
    vm = VLPModel.from_pretrained(pretrained, device="cpu", batch_size=4)
    inp = read_classification_inputs(
        splits["classification_shape_test"],
        splits["classification_shape_classes"],
        splits["classification_shape_templates"],
    )
    itc, top, itm = classification_scores(vm, inp, rerank_k=2, show_progress=False)
    assert itc.shape == (len(inp.images), 4) and top.shape == itm.shape == (len(inp.images), 2)
    # the ITC scores are the cosine with the prompt ensemble (templates averaged, as open_clip)
    t = len(inp.templates)
    feats = vm.encode_text(inp.prompts()).view(4, t, -1).mean(1)
    expected_itc = vm.encode_image(inp.images) @ torch.nn.functional.normalize(feats, dim=-1).T
    torch.testing.assert_close(itc, expected_itc, atol=1e-5, rtol=1e-5)
    assert torch.equal(top, itc.topk(2, dim=1).indices)
    # the ITM score of (image, class) from VLPModel.itm_score, one aligned pair per template
    for n in (0, len(inp.images) - 1):
        for j, c in enumerate(top[n].tolist()):
            prompts = inp.prompts()[c * t : (c + 1) * t]
            probs = vm.itm_score([inp.images[n]] * t, prompts)
            assert itm[n, j].item() == pytest.approx(probs.mean().item(), abs=1e-5)


def test_bad_rerank_k_fails_before_loading(splits, tmp_path) -> None:
    with pytest.raises(DataError, match="rerank_k 5 exceeds the 4 classes"):
        _evaluate(tmp_path / "no-run", splits, "shape", tmp_path, rerank_k=5)
    with pytest.raises(ConfigError, match="rerank_k: -1"):
        _evaluate(tmp_path / "no-run", splits, "shape", tmp_path, rerank_k=-1)


def test_a_dual_encoder_classifies_but_cannot_rerank(splits, tmp_path) -> None:
    ckpt = dual_checkpoint(tmp_path / "dual")
    with pytest.raises(CheckpointError, match="rerank_k 2 needs a fusion encoder .* dual encoder"):
        _evaluate(ckpt, splits, "colour", tmp_path / "e", rerank_k=2)
    rec = _evaluate(ckpt, splits, "colour", tmp_path / "e")
    assert "rerank" not in rec and rec["n_classes"] == 6 and rec["itc"]["top5_k"] == 5
    assert not (tmp_path / "e" / "confusion_rerank.png").exists()


def test_cli_evaluate_classification_writes_the_library_result(pretrained, splits, tmp_path, capsys) -> None:
    out = tmp_path / "cli"
    args = ["evaluate", "classification", "--checkpoint", str(pretrained), "--out", str(out), "--rerank-k", "2"]
    files = ["--data", str(splits["classification_colour_test"])]
    files += ["--classes", str(splits["classification_colour_classes"])]
    files += ["--templates", str(splits["classification_colour_templates"])]
    assert main([*args, *files, "--batch-size", "8"]) == 0
    cli = json.loads((out / "metrics.json").read_text())
    lib = _evaluate(pretrained, splits, "colour", tmp_path / "lib", rerank_k=2)
    assert (
        cli["itc"]["top1"] == pytest.approx(lib["itc"]["top1"])
        and cli["rerank"]["confusion"] == lib["rerank"]["confusion"]
    )
    assert (out / "confusion.png").is_file() and (out / "confusion_rerank.png").is_file()
    # a bad template file is one line on stderr naming the file, exit status 2
    bad = tmp_path / "t.txt"
    bad.write_text("a {} shape\nno placeholder\n")
    capsys.readouterr()
    assert main([*args, *files[:4], "--templates", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(bad) in err[0] and "line 2" in err[0]

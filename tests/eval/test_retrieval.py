import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from tests.helpers import TINY_ALBEF, table_rows, untrained_checkpoint
from vlp.cli import main
from vlp.config import EvalConfig, ModelConfig, PretrainConfig, TextConfig, VisionConfig, load_config
from vlp.data.formats import RetrievalSplit
from vlp.errors import ConfigError
from vlp.eval.metrics import map_at, ndcg_at, positives_mask, retrieval_metrics
from vlp.eval.retrieval import RERANK_OFFSET, Embeddings, evaluate_retrieval
from vlp.models.albef import ALBEF
from vlp.runs.evaluation.image_text_retrieval import run_evaluate_retrieval


def setup():
    torch.manual_seed(0)
    model = ALBEF(
        ModelConfig(
            vision=VisionConfig(depth=1),
            text=TextConfig(layers=1, fusion_layers=1, dropout=0.0),
            queue_size=8,
            embed_dim=16,
        )
    ).eval()
    n_img, per, t = 6, 2, 5
    with torch.no_grad():
        img = model.encode_image(torch.randn(n_img, 3, 64, 64))
        ids = torch.randint(1000, 2000, (n_img * per, t))
        ids[:, 0] = 101
        mask = torch.ones_like(ids)
        mask[::3, 3:] = 0
        txt = model.encode_text(ids, mask)
    emb = Embeddings(img.tokens, img.feat, txt.hidden, mask, txt.feat)
    split = RetrievalSplit(
        [f"{i}.png" for i in range(n_img)],
        [str(i) for i in range(n_img * per)],
        [i // per for i in range(n_img * per)],
        [[per * i, per * i + 1] for i in range(n_img)],
        "mem",
    )
    return model, emb, split


def brute_itm(model, emb, i, t):
    with torch.no_grad():
        fused = model.fuse(emb.text_hidden[t : t + 1], emb.text_mask[t : t + 1], emb.image_tokens[i : i + 1])
        return model.itm_logits(fused)[0, 1].item()


def test_full_rerank_equals_brute_force_itm_for_every_pair():
    model, emb, split = setup()
    # k_test = 6 = every image: each caption re-ranks all images, each image its top 6 of 12 captions
    res = evaluate_retrieval(model, emb, split, EvalConfig(k_test=6, score="itm", batch_size=5), show_progress=False)
    top_i2t = (emb.image_feat @ emb.text_feat.T).topk(6, dim=1).indices
    for i in range(6):
        for t in range(12):
            ref = brute_itm(model, emb, i, t)
            assert abs(res.scores_t2i[t, i].item() - RERANK_OFFSET - ref) < 1e-5
            if t in top_i2t[i].tolist():
                assert abs(res.scores_i2t[i, t].item() - RERANK_OFFSET - ref) < 1e-5
            else:
                assert res.scores_i2t[i, t].item() < RERANK_OFFSET / 2  # ITC-ordered below the re-ranked
    assert res.metrics["itm_pairs"] == 6 * 12  # every pair is a candidate of some query: scored once


def test_k_test_larger_than_the_candidate_set_is_refused():
    model, emb, split = setup()
    with pytest.raises(
        ConfigError,
        match=r"config key 'eval.k_test': 7 candidates per query, but the evaluation "
        r"split has 6 images and 12 captions; set eval.k_test <= 6",
    ):
        evaluate_retrieval(model, emb, split, EvalConfig(k_test=7, score="itm"), show_progress=False)
    assert evaluate_retrieval(model, emb, split, EvalConfig(k_test=7, score="itc"), show_progress=False).metrics


def test_topk_rerank_keeps_itc_order_below_and_adds_itc_in_itm_plus_itc():
    model, emb, split = setup()
    sim = emb.image_feat @ emb.text_feat.T
    res = evaluate_retrieval(
        model, emb, split, EvalConfig(k_test=2, score="itm+itc", batch_size=4), show_progress=False
    )
    for t in range(12):
        top = sim[:, t].topk(2).indices.tolist()
        for i in range(6):
            got = res.scores_t2i[t, i].item()
            if i in top:
                assert abs(got - RERANK_OFFSET - (brute_itm(model, emb, i, t) + sim[i, t].item())) < 1e-3
            else:
                assert abs(got - sim[i, t].item()) < 1e-6
    union = {(i, t) for i in range(6) for t in sim[i].topk(2).indices.tolist()}
    union |= {(i, t) for t in range(12) for i in sim[:, t].topk(2).indices.tolist()}
    assert res.metrics["itm_pairs"] == len(union) < 6 * 2 + 12 * 2


def test_itc_score_is_plain_cosine():
    model, emb, split = setup()
    res = evaluate_retrieval(model, emb, split, EvalConfig(score="itc"), show_progress=False)
    sim = emb.image_feat @ emb.text_feat.T
    assert torch.allclose(res.scores_i2t, sim)
    assert res.metrics == {**retrieval_metrics(sim, sim.T, split.img2txt, split.txt2img), "itm_pairs": 0}


# ---------------------------------------------------------------- run_evaluate_retrieval with relevance files

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "pretrain" / "shapes_tiny.yaml"


@pytest.fixture(scope="module")
def tiny_eval(make_world, tmp_path_factory):
    """A 6-image test world and an untrained tiny checkpoint (evaluation only needs weights + config)."""
    world = make_world("eval_world", seed=1, n_train=0, n_val=2, n_test=6)
    return world, untrained_checkpoint(tmp_path_factory.mktemp("eval_ckpt") / "ckpt", TINY_ALBEF)


NEW_KEYS = (
    "img_ndcg10",
    "img_ndcg25",
    "txt_map5",
    "txt_map10",
    "img_r_precision",
    "txt_r_precision",
    "img_map_at_r",
    "txt_map_at_r",
)


def test_run_evaluate_retrieval_reports_graded_and_binary_relevance_metrics(tiny_eval, tmp_path):
    world, ckpt = tiny_eval
    res = run_evaluate_retrieval(
        ckpt,
        world["retrieval_test"],
        world["relevance_test"],
        tmp_path / "e",
        overrides=["eval.k_test=2"],
        show_progress=False,
        graded_relevance=world["relevance_graded_test"],
    )
    m = json.loads((tmp_path / "e" / "metrics.json").read_text())
    assert m["ndcg_gains"] == "graded" and m["n_texts"] == 30
    assert all(0.0 <= m[k] <= 100.0 for k in NEW_KEYS)
    graded = torch.from_numpy(np.load(world["relevance_graded_test"]))
    rel = positives_mask(json.loads(world["relevance_test"].read_text())["relevant_images"], 6)
    assert m["img_ndcg10"] == pytest.approx(ndcg_at(res.scores_t2i, graded, 10))
    assert m["txt_map5"] == pytest.approx(map_at(res.scores_i2t, rel.T, 5))
    # without the graded file: binary gains, and the other metrics are unchanged
    res_b = run_evaluate_retrieval(
        ckpt,
        world["retrieval_test"],
        world["relevance_test"],
        tmp_path / "b",
        overrides=["eval.k_test=2"],
        show_progress=False,
    )
    assert json.loads((tmp_path / "b" / "metrics.json").read_text())["ndcg_gains"] == "binary"
    assert res_b.metrics["img_ndcg25"] == pytest.approx(ndcg_at(res_b.scores_t2i, rel.float(), 25))
    assert {k: v for k, v in res_b.metrics.items() if "ndcg" not in k} == {
        k: v for k, v in res.metrics.items() if "ndcg" not in k
    }


def test_evaluate_retrieval_cli_graded_relevance(tiny_eval, tmp_path, capsys):
    world, ckpt = tiny_eval
    base = ["evaluate", "retrieval", "--checkpoint", str(ckpt), "--data", str(world["retrieval_test"])]
    assert main([*base, "--graded-relevance", str(world["relevance_graded_test"]), "--out", str(tmp_path / "x")]) == 2
    assert "needs the relevance file" in capsys.readouterr().err
    relevance = [*base, "--relevance", str(world["relevance_test"]), "--graded-relevance"]
    rc = main([*relevance, str(world["relevance_graded_val"]), "--out", str(tmp_path / "y")])
    err = capsys.readouterr().err
    assert rc == 2 and "relevance_graded_val.npy: shape (10, 2) does not match" in err and "expected (30, 6)" in err
    graded = [str(world["relevance_graded_test"]), "--out", str(tmp_path / "z")]
    rc = main([*relevance, *graded, "eval.k_test=2", "eval.score=itc"])
    assert rc == 0
    m = json.loads((tmp_path / "z" / "metrics.json").read_text())
    assert m["ndcg_gains"] == "graded" and all(k in m for k in NEW_KEYS)


def test_evaluate_retrieval_with_a_v2_relevance_file(tiny_eval, tmp_path, capsys):
    """A v2 file (what `vlp prepare eccv-caption` writes): only the listed queries count, and the
    image->text positives are its own lists, not the transpose of the text->image ones."""
    from vlp.data.formats import load_retrieval_split
    from vlp.data.relevance import relevance_record
    from vlp.eval.metrics import relevance_metrics

    world, ckpt = tiny_eval
    split = load_retrieval_split(world["retrieval_test"])
    v1 = json.loads(world["relevance_test"].read_text())["relevant_images"]
    images = [r if t % 2 == 0 else [] for t, r in enumerate(v1)]  # the even texts are the queries
    texts = [split.img2txt[i][:2] if i < 3 else [] for i in range(6)]  # images 0-2, two own captions each
    path = tmp_path / "v2.json"
    path.write_text(json.dumps(relevance_record("retrieval_test.json", split.texts, 6, images, texts, "eccv-caption")))
    res = run_evaluate_retrieval(
        ckpt, world["retrieval_test"], path, tmp_path / "e", overrides=["eval.score=itc"], show_progress=False
    )
    want = relevance_metrics(res.scores_i2t, res.scores_t2i, images, relevant_texts=texts)
    assert {k: res.metrics[k] for k in want} == want
    assert want["img_rel_queries"] == 15 and want["txt_rel_queries"] == 3
    assert want["txt_map_at_r"] != relevance_metrics(res.scores_i2t, res.scores_t2i, images)["txt_map_at_r"]
    m = json.loads((tmp_path / "e" / "metrics.json").read_text())
    assert m["relevance_benchmark"] == "eccv-caption" and m["relevance"] == str(path)
    assert m["img_map_at_r"] == want["img_map_at_r"]
    base = ["evaluate", "retrieval", "--checkpoint", str(ckpt), "--data", str(world["retrieval_test"])]
    assert main([*base, "--relevance", str(path), "--out", str(tmp_path / "c"), "eval.score=itc"]) == 0
    printed = capsys.readouterr().out
    assert "img_map_at_r" in printed and "txt_map_at_r" in printed and "txt_r_precision" in printed
    # printed: a table rounded to two decimals; metrics.json: every digit (the library's values)
    rows, exact = table_rows(printed), json.loads((tmp_path / "c" / "metrics.json").read_text())
    assert {k: exact[k] for k in res.metrics} == res.metrics
    floats = {k: v for k, v in res.metrics.items() if isinstance(v, float)}
    assert any(round(v, 2) != v for v in floats.values())  # some value has more digits than printed
    assert all(rows[k] == [f"{v:.2f}"] for k, v in floats.items()), printed
    with Image.open(tmp_path / "c" / "retrieval_examples.png") as im:  # the checkpoint's folder and step
        assert im.text["Title"].splitlines()[0] == f"{ckpt.name}, step 0"


def test_graded_relevance_needs_relevance_lists():
    model, emb, split = setup()
    with pytest.raises(ValueError, match="needs relevant_images"):
        evaluate_retrieval(
            model, emb, split, EvalConfig(score="itc"), show_progress=False, graded_relevance=torch.ones(12, 6)
        )
    with pytest.raises(ValueError, match="relevant_texts needs relevant_images"):
        evaluate_retrieval(model, emb, split, EvalConfig(score="itc"), show_progress=False, relevant_texts=[[0]] * 6)


# ---------------------------------------------------------------- eval.precision and eval.itm_batch_size


def test_bf16_scores_are_close_to_fp32_and_itm_batch_size_changes_nothing(tiny_eval, tmp_path):
    """bf16 (CPU autocast): the same top-k candidates, ITM logits within 0.02 and ITC cosines within
    0.01 of fp32 (measured: 0.003 and 0.0012), so recall@K moves by at most one query. The pair batch
    changes only how pairs are grouped: the same scores (to float32 rounding)."""
    world, ckpt = tiny_eval
    runs = {
        name: run_evaluate_retrieval(
            ckpt,
            world["retrieval_test"],
            None,
            tmp_path / name,
            show_progress=False,
            overrides=["eval.k_test=3", *extra],
        )
        for name, extra in {"fp32": [], "bf16": ["eval.precision=bf16"], "pairs1": ["eval.itm_batch_size=1"]}.items()
    }
    fp32, bf16 = runs["fp32"], runs["bf16"]
    top = fp32.scores_i2t > RERANK_OFFSET / 2
    assert torch.equal(top, bf16.scores_i2t > RERANK_OFFSET / 2) and top.sum() == 6 * 3
    diff = (fp32.scores_i2t - bf16.scores_i2t).abs()
    assert diff[top].max() < 0.02 and diff[~top].max() < 0.01
    assert diff.max() > 0  # bf16 did run
    for k in ("r1", "r5", "r10"):  # one of 6 image queries, one of 30 caption queries
        assert abs(fp32.metrics[f"txt_{k}"] - bf16.metrics[f"txt_{k}"]) <= 100 / 6 + 1e-9
        assert abs(fp32.metrics[f"img_{k}"] - bf16.metrics[f"img_{k}"]) <= 100 / 30 + 1e-9
    assert json.loads((tmp_path / "bf16" / "metrics.json").read_text())["precision"] == "bf16"
    # the same scores up to float32 rounding (the exact float64 scores show the ~1e-7 differences of
    # matrix products of other batch shapes) and the same metrics
    assert torch.allclose(runs["pairs1"].scores_i2t, fp32.scores_i2t, rtol=0, atol=1e-6)
    assert runs["pairs1"].metrics == fp32.metrics


@pytest.mark.parametrize(
    "override, message",
    [
        ("eval.precision=fp16", "eval.precision"),
        ("eval.itm_batch_size=0", "eval.itm_batch_size"),
        ("eval.offload=gpu", "eval.offload"),
        ("eval.num_workers=-1", "eval.num_workers"),
    ],
)
def test_eval_keys_are_validated(override, message):
    with pytest.raises(ValueError, match=message):
        load_config(PretrainConfig, CONFIG, [override])


# ---------------------------------------------------------------- exact re-ranked scores (defect 13)


def test_rerank_keeps_itm_logits_6e4_apart_in_order_and_exact(monkeypatch):
    """ITM logits 2.5005 and 2.5011 (6e-4 apart) both round to 10002.500977 once the float32 re-rank
    offset is added: the caption's own image would tie with the other one and, ties counting against
    the query, drop to rank 2. The final scores keep them apart and hold the exact logits (+ the offset)."""
    import vlp.eval.retrieval as retrieval

    n_img, per = 2, 2
    own, other = torch.tensor(2.5011), torch.tensor(2.5005)  # float32 logits
    assert torch.tensor(RERANK_OFFSET) + own == torch.tensor(RERANK_OFFSET) + other  # the float32 collision
    txt2img = [t // per for t in range(n_img * per)]

    def fake_score_pairs(model, emb, p_img, p_txt, cfg, show_progress=True, distributed=False):
        return torch.where(p_img == torch.tensor(txt2img)[p_txt], own, other)

    monkeypatch.setattr(retrieval, "score_pairs", fake_score_pairs)
    g = torch.Generator().manual_seed(0)
    feat = lambda n: torch.nn.functional.normalize(torch.randn(n, 8, generator=g), dim=-1)  # noqa: E731
    emb = Embeddings(
        torch.zeros(n_img, 1, 1),
        feat(n_img),
        torch.zeros(n_img * per, 1, 1),
        torch.ones(n_img * per, 1),
        feat(n_img * per),
    )
    split = RetrievalSplit(["a.png", "b.png"], ["w", "x", "y", "z"], txt2img, [[0, 1], [2, 3]], "mem")
    res = evaluate_retrieval(None, emb, split, EvalConfig(k_test=2, score="itm"), show_progress=False)
    for t, i in enumerate(txt2img):  # every caption re-ranks both images
        assert res.scores_t2i[t, i] > res.scores_t2i[t, 1 - i]
        assert res.scores_t2i[t, i] - RERANK_OFFSET == own.item()  # the float32 logit, bit for bit
        assert res.scores_t2i[t, 1 - i] - RERANK_OFFSET == other.item()
    assert res.metrics["img_r1"] == 100.0
    for i in range(n_img):  # image -> text: its top-2 captions re-ranked, own captions above the others
        top = (emb.image_feat[i] @ emb.text_feat.T).topk(2).indices.tolist()
        for t in top:
            assert res.scores_i2t[i, t] - RERANK_OFFSET == (own if txt2img[t] == i else other).item()


# ---------------------------------------------------------------- K/V broadcast in the ITM pass


@pytest.mark.parametrize("index", [[0, 0, 0, 0, 0], [2, 0, 1, 1, 0, 2, 2, 2, 1], [0, 1, 2, 3], [1, 1, 0, 1, 0, 0, 0]])
def test_image_kv_broadcast_equals_per_pair_copies(index):
    """ITM re-ranking projects each distinct image's cross-attention K/V once and broadcasts them to
    its captions (``image_index``); the fused states equal those with the K/V copied per pair
    (``select_kv``), for one image, several of any group sizes in any order, and with an image mask."""
    from vlp.models.text import select_kv

    model, emb, _ = setup()
    idx = torch.tensor(index)
    n_img = int(idx.max()) + 1
    tokens = emb.image_tokens[:n_img]
    txt = torch.arange(len(idx)) % len(emb.text_hidden)
    hidden, mask = emb.text_hidden[txt], emb.text_mask[txt]
    with torch.no_grad():
        kv = model.image_kv(tokens)
        ref = model.fuse(hidden, mask, select_kv(kv, idx))
        got = model.fuse(hidden, mask, kv, image_index=idx)
        assert torch.allclose(got, ref, rtol=0, atol=1e-5)
        image_mask = torch.ones(n_img, tokens.shape[1], dtype=torch.long)
        image_mask[0, -7:] = 0
        ref_m = model.fusion(hidden, mask, select_kv(kv, idx), image_mask=image_mask[idx])
        got_m = model.fusion(hidden, mask, kv, image_mask=image_mask, image_index=idx)
        assert torch.allclose(got_m, ref_m, rtol=0, atol=1e-5) and not torch.allclose(got_m, got, atol=1e-4)


def test_auto_precision_and_loader_workers(tiny_eval, tmp_path):
    """``eval.precision=auto`` (the default) is fp32 on the CPU and metrics.json records the precision
    used; image decoding in 2 loader workers gives the embeddings of the main process."""
    from vlp.checkpoint import image_size, load_model
    from vlp.data.formats import load_retrieval_split
    from vlp.eval.retrieval import embed
    from vlp.preprocess.transforms import test_transform

    world, ckpt = tiny_eval
    assert EvalConfig().precision == "auto" and EvalConfig().resolved_precision(torch.device("cpu")) == "fp32"
    assert EvalConfig().resolved_precision(torch.device("cuda")) == "bf16"
    assert (
        EvalConfig().resolved_offload(torch.device("cuda")) == "images"
        and EvalConfig(num_workers=3).resolved_workers() == 3
    )
    res = run_evaluate_retrieval(
        ckpt, world["retrieval_test"], None, tmp_path / "auto", show_progress=False, overrides=["eval.k_test=2"]
    )
    fp32 = run_evaluate_retrieval(
        ckpt,
        world["retrieval_test"],
        None,
        tmp_path / "fp32",
        show_progress=False,
        overrides=["eval.k_test=2", "eval.precision=fp32", "eval.num_workers=0"],
    )
    written = json.loads((tmp_path / "auto" / "metrics.json").read_text())
    assert (written["precision"], written["offload"]) == ("fp32", "none")
    assert torch.equal(res.scores_i2t, fp32.scores_i2t)
    model, cfg, tok = load_model(ckpt, torch.device("cpu"))
    split = load_retrieval_split(world["retrieval_test"])
    transform = test_transform(image_size(cfg), cfg.data.image)
    a, b = (embed(model, split, tok, transform, 32, 4, torch.device("cpu"), False, num_workers=w) for w in (0, 2))
    assert torch.equal(a.image_tokens, b.image_tokens) and torch.equal(a.image_feat, b.image_feat)


def test_run_evaluate_retrieval_caption_groups(tiny_eval, tmp_path):
    """The world's caption_kinds_test.json: per-kind and generic text->image metrics beside the
    unchanged ungrouped ones, equal to grouped_text_metrics of the returned scores."""
    from vlp.eval.metrics import grouped_text_metrics

    world, ckpt = tiny_eval
    args = (ckpt, world["retrieval_test"], world["relevance_test"])
    kw = dict(overrides=["eval.k_test=2"], show_progress=False, graded_relevance=world["relevance_graded_test"])
    plain = run_evaluate_retrieval(*args, tmp_path / "plain", **kw)
    res = run_evaluate_retrieval(*args, tmp_path / "g", caption_groups=world["caption_kinds_test"], **kw)
    m = json.loads((tmp_path / "g" / "metrics.json").read_text())
    assert m["caption_groups"] == str(world["caption_kinds_test"])
    assert {k: v for k, v in res.metrics.items() if "@" not in k} == plain.metrics
    labels = json.loads(world["caption_kinds_test"].read_text())["labels"]
    assert m["n_queries@scene"] == labels.count("scene") == 6
    assert m["n_queries@generic"] == 30 - 6
    split_rel = json.loads(world["relevance_test"].read_text())["relevant_images"]
    graded = torch.from_numpy(np.load(world["relevance_graded_test"]))
    groups = {"scene": [q for q, k in enumerate(labels) if k == "scene"]}
    groups["generic"] = [q for q, k in enumerate(labels) if k != "scene"]
    want = grouped_text_metrics(res.scores_t2i, [t // 5 for t in range(30)], groups, split_rel, graded)
    for key in ("img_r1@scene", "img_r_precision@generic", "img_ndcg10@generic", "img_r5_rel@scene"):
        assert m[key] == pytest.approx(want[key])


def test_load_caption_groups_formats_and_errors(tmp_path):
    from vlp.errors import DataError
    from vlp.runs.evaluation.image_text_retrieval import load_caption_groups

    split = RetrievalSplit(["a.png", "b.png"], ["t0", "t1", "t2"], [0, 0, 1], [[0, 1], [2]], "split.json")
    plain = tmp_path / "labels.json"
    plain.write_text(json.dumps(["x", "y", "x"]))
    assert load_caption_groups(plain, split) == {"x": [0, 2], "y": [1]}
    full = tmp_path / "groups.json"
    full.write_text(
        json.dumps({"format": "vlp-caption-groups-v1", "labels": ["x", "y", "z"], "unions": {"xz": ["x", "z"]}})
    )
    assert load_caption_groups(full, split) == {"x": [0], "y": [1], "z": [2], "xz": [0, 2]}
    assert load_caption_groups({"first": [0]}, split) == {"first": [0]}
    with pytest.raises(
        DataError, match=r"labels.json: key 'labels' has 2 entries, expected 3 \(captions in split.json\)"
    ):
        plain.write_text(json.dumps(["x", "y"]))
        load_caption_groups(plain, split)
    with pytest.raises(DataError, match='"format": "vlp-caption-groups-v1"'):
        full.write_text(json.dumps({"labels": ["x", "y", "z"]}))
        load_caption_groups(full, split)
    with pytest.raises(DataError, match="'x' is a label already"):
        full.write_text(json.dumps({"format": "vlp-caption-groups-v1", "labels": ["x", "y", "z"], "unions": {"x": []}}))
        load_caption_groups(full, split)
    with pytest.raises(DataError, match="index 3 is not a caption of split.json"):
        load_caption_groups({"g": [0, 3]}, split)


def test_a_wrong_image_root_fails_before_any_encoding_in_one_line(tiny_eval, tmp_path, capsys, monkeypatch):
    """Issue 31, item 3: one line naming the data file, the missing images and --image-root, before
    the captions are encoded (not a loader-worker traceback at the images)."""
    world, ckpt = tiny_eval
    import vlp.runs.evaluation.image_text_retrieval

    monkeypatch.setattr(
        vlp.runs.evaluation.image_text_retrieval, "embed", lambda *a, **k: pytest.fail("encoded before checking images")
    )
    base = ["evaluate", "retrieval", "--checkpoint", str(ckpt), "--data", str(world["retrieval_test"])]
    assert main([*base, "--image-root", str(tmp_path / "wrong"), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"vlp: error: {world['retrieval_test']}: 6 of 6 image files not found")
    assert str(tmp_path / "wrong") in err[0] and "check --image-root" in err[0]

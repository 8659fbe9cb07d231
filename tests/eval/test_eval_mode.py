"""Every evaluation entry point scores in eval mode (dropout off) and gives the model back in the mode
it had: a model with text dropout 0.3, left in train mode after training, scores the same twice,
the same as an explicit ``eval()`` run, and is still in train mode afterwards (an eval-mode model
stays in eval mode)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import NO_TASKS
from vlp.api import Preprocessor, VLPModel
from vlp.config import EvalConfig, ImageConfig, ModelConfig, TextConfig, VisionConfig
from vlp.data.formats import load_retrieval_split
from vlp.eval.mode import evaluating
from vlp.eval.retrieval import embed, evaluate_retrieval
from vlp.models.albef import ALBEF
from vlp.models.build import build_model_of_kind
from vlp.preprocess.transforms import load_tokenizer
from vlp.preprocess.transforms import test_transform as eval_transform
from vlp.runs.training.finetune import nlvr_accuracy, predict_answers

CPU = torch.device("cpu")
DROPOUT = 0.3


def config() -> ModelConfig:
    return ModelConfig(
        vision=VisionConfig(depth=1, img_size=32),
        text=TextConfig(layers=1, fusion_layers=1, dropout=DROPOUT),
        queue_size=0,
        embed_dim=16,
    )


def flags(model: torch.nn.Module) -> list[bool]:
    return [m.training for m in model.modules()]


def run_three_ways(model: torch.nn.Module, score):
    """``score()`` twice with the model in train mode, then once after an explicit ``eval()``;
    checks the flags are restored. Returns the three results."""
    model.train()
    model.text.encoder.layer[0].eval()  # a submodule the caller put in eval mode stays so
    before = flags(model)
    first, second = score(), score()
    assert flags(model) == before and model.training  # train mode restored, submodule by submodule
    model.eval()
    reference = score()
    assert not any(flags(model))  # eval mode stays eval mode
    return first, second, reference


def test_evaluating_restores_every_flag_even_on_error() -> None:
    model = ALBEF(config())
    model.train()
    model.fusion.eval()
    before = flags(model)
    with evaluating(model):
        assert not any(flags(model))
    assert flags(model) == before
    with pytest.raises(RuntimeError), evaluating(model):
        raise RuntimeError("boom")
    assert flags(model) == before


WORLD = dict(seed=2, n_train=0, n_val=0, n_test=5, image_size=32, **NO_TASKS)


def test_retrieval_scores_in_eval_mode_and_restores_the_mode(world) -> None:
    torch.manual_seed(0)
    cfg = config()
    model = ALBEF(cfg)
    tokenizer = load_tokenizer(cfg.text)
    split = load_retrieval_split(world["retrieval_test"])
    ecfg = EvalConfig(k_test=3, score="itm", batch_size=4)

    def score():
        emb = embed(model, split, tokenizer, eval_transform(32, ImageConfig()), 16, 4, CPU, show_progress=False)
        return emb, evaluate_retrieval(model, emb, split, ecfg, show_progress=False)

    (e1, r1), (e2, r2), (e_ref, r_ref) = run_three_ways(model, score)
    for a in (e1, e2):
        assert torch.equal(a.text_feat, e_ref.text_feat) and torch.equal(a.text_hidden, e_ref.text_hidden)
    for r in (r1, r2):
        assert torch.equal(r.scores_i2t, r_ref.scores_i2t) and torch.equal(r.scores_t2i, r_ref.scores_t2i)
        assert r.metrics == r_ref.metrics
    # the evaluation alone (embeddings from an eval-mode run) is also in eval mode
    model.train()
    assert torch.equal(evaluate_retrieval(model, e_ref, split, ecfg, show_progress=False).scores_i2t, r_ref.scores_i2t)
    assert model.training
    # and dropout does change the scores in train mode, so the check above has teeth
    with torch.no_grad():
        ids = torch.tensor([[101, 2417, 4418, 102]])
        model.train()
        assert not torch.equal(
            model.encode_text(ids, torch.ones_like(ids)).feat, model.encode_text(ids, torch.ones_like(ids)).feat
        )


def _vqa_inputs(model):
    g = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(2):
        ids = torch.randint(2000, 3000, (3, 6), generator=g)
        ids[:, 0] = 101
        batches.append(
            {"images": torch.randn(3, 3, 32, 32, generator=g), "input_ids": ids, "attention_mask": torch.ones_like(ids)}
        )
    cand = torch.tensor([[101, 2417, 102, 0], [101, 2630, 102, 0], [101, 2048, 3924, 102], [101, 2748, 102, 0]])
    return batches, cand, (cand != 0).long(), ["red", "blue", "two circles", "yes"]


def test_vqa_ranking_in_eval_mode_and_restores_the_mode() -> None:
    torch.manual_seed(0)
    model = build_model_of_kind("vqa", config(), 30522)
    batches, cand, cand_mask, answers = _vqa_inputs(model)

    def score():
        preds = predict_answers(model, batches, cand, cand_mask, answers, 3, CPU)
        with evaluating(model), torch.no_grad():  # the scores behind the predictions
            b = batches[0]
            _, scores = model.rank_answers(
                model.encode_question(b["images"], b["input_ids"], b["attention_mask"]),
                b["attention_mask"],
                cand,
                cand_mask,
                3,
            )
        return preds, scores

    (p1, _), (p2, _), (p_ref, s_ref) = run_three_ways(model, score)
    assert p1 == p2 == p_ref and len(p_ref) == 6
    assert torch.isfinite(s_ref).sum() == 3 * 3


def test_nlvr_accuracy_in_eval_mode_and_restores_the_mode() -> None:
    torch.manual_seed(0)
    model = build_model_of_kind("nlvr2", config(), 30522)
    g = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(3):
        ids = torch.randint(2000, 3000, (4, 7), generator=g)
        ids[:, 0] = 101
        batches.append(
            {
                "images0": torch.randn(4, 3, 32, 32, generator=g),
                "images1": torch.randn(4, 3, 32, 32, generator=g),
                "input_ids": ids,
                "attention_mask": torch.ones_like(ids),
                "labels": torch.randint(0, 2, (4,), generator=g),
            }
        )
    a1, a2, ref = run_three_ways(model, lambda: nlvr_accuracy(model, batches, CPU))
    assert a1 == a2 == ref


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(TextConfig())


def _api(model, kind, tokenizer) -> VLPModel:
    return VLPModel(
        model,
        kind,
        config(),
        tokenizer,
        Preprocessor(32, [0.5] * 3, [0.25] * 3, 16),
        answers=["red", "blue", "two circles", "yes"],
        vqa_k_test=3,
    )


def test_api_methods_run_in_eval_mode_and_restore_the_mode(tokenizer) -> None:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(2)
    images = torch.randn(3, 3, 32, 32, generator=g)
    texts = ["a red circle", "two blue squares", "a green triangle"]
    m = _api(ALBEF(config()), "pretrain", tokenizer)
    for method in (
        lambda: m.similarity(images, texts),
        lambda: m.itm_score(images, texts),
        lambda: m.encode_text(texts),
    ):
        a, b, ref = run_three_ways(m.model, method)
        assert torch.equal(a, ref) and torch.equal(b, ref)
    vqa = _api(build_model_of_kind("vqa", config(), 30522), "vqa", tokenizer)
    a, b, ref = run_three_ways(vqa.model, lambda: vqa.answer(images, ["what colour?", "how many?", "is it?"]))
    assert a == b == ref
    nlvr = _api(build_model_of_kind("nlvr2", config(), 30522), "nlvr2", tokenizer)
    a, b, ref = run_three_ways(nlvr.model, lambda: nlvr.nlvr(images, images.flip(0), texts))
    assert torch.equal(a, ref) and torch.equal(b, ref)


def test_evaluation_modules_import_no_training_code() -> None:
    """vlp.eval is a lower layer: importing its modules loads neither vlp.train nor vlp.runs."""
    import subprocess
    import sys

    code = (
        "import sys, vlp.eval.retrieval, vlp.eval.metrics, vlp.eval.mode, vlp.eval.vqa; "
        "print([m for m in sys.modules if m.startswith(('vlp.train', 'vlp.runs'))])"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip().splitlines()[-1] == "[]"

"""``vlp finetune vqa``: the answer decoder, validated and tested by ranked answers."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader

from vlp.config import FinetuneConfig
from vlp.dist import gather_rows, rank
from vlp.errors import ConfigError
from vlp.eval.mode import evaluating
from vlp.kinds import VQA
from vlp.runs.training.finetune.recipe import finetune_job, fit, load_best, make_loader, shard_of, start, write_results
from vlp.runs.training.finetune.registry import RUNNERS


@RUNNERS.register(VQA)
def run_finetune_vqa(cfg: FinetuneConfig) -> dict:
    """Answer decoder from the pretrained fusion layers; weighted answer NLL (+ distillation);
    validation = VQA accuracy of the ranked candidate answers; test predictions in the official
    ``[{"question_id", "answer"}]`` format; the most-frequent-answer-per-type baseline for reference."""
    from vlp.data.formats import load_answer_list, load_vqa, write_vqa_predictions
    from vlp.data.vqa import VQACollator, VQADataset, tokenize_answers
    from vlp.eval.vqa import baseline_predictions, mean_vqa_accuracy, most_frequent_answers, per_type_accuracy
    from vlp.tasks.vqa import VQATask

    if not cfg.data.answer_list:
        raise ConfigError("config key 'data.answer_list': VQA ranks a fixed list of candidate answers; none given")
    d = cfg.data
    answers = load_answer_list(d.answer_list)
    if cfg.vqa.k_test > len(answers):  # before any work
        raise ConfigError(
            f"config key 'vqa.k_test': {cfg.vqa.k_test} candidates per question, but the answer list "
            f"{d.answer_list} has {len(answers)}; set vqa.k_test <= {len(answers)}"
        )
    job = finetune_job(cfg)
    train_q = load_vqa(d.train, d.image_root, d.vg_root)
    val_q = load_vqa([d.val], d.image_root, d.vg_root) if d.val else []
    test_q = load_vqa([d.test], d.image_root, d.vg_root, require_answers=False) if d.test else []
    collate = VQACollator(job.tokenizer, d.max_len, cfg.vqa.answer_max_len)
    loader = make_loader(
        job, VQADataset(train_q, job.train_transform(), train=True, **job.bad_samples(train_q)), collate, train=True
    )
    run_dir = start(job, loader, len(train_q))
    task = VQATask(job.model, cfg.loss.alpha, cfg.loss.alpha_ramp_steps, cfg.loss.distill)
    cand_ids, cand_mask = tokenize_answers(job.tokenizer, answers, cfg.vqa.answer_max_len)

    def predict(questions) -> list[str]:
        """Every rank ranks the answers of its contiguous shard of ``questions``; all in order."""
        bounds, shard = shard_of(questions)
        loader = make_loader(job, VQADataset(shard, job.test_transform(), train=False), collate, train=False)
        picked = rank_answer_indices(job.model, loader, cand_ids, cand_mask, cfg.vqa.k_test, job.device)
        return [answers[i] for i in gather_rows(picked, bounds).tolist()]

    def val_metrics(preds: list[str]) -> dict[str, float]:
        acc = mean_vqa_accuracy(preds, [q.raw_answers for q in val_q])
        official = mean_vqa_accuracy(preds, [q.raw_answers for q in val_q], official=True)
        return {
            "acc": acc,
            "acc_official": official,
            **{f"acc_{k}": v for k, v in per_type_accuracy(preds, val_q).items()},
        }

    validate = (lambda _task, _step: val_metrics(predict(val_q))) if val_q else None
    fit(job, task, validate, "acc")
    results: dict[str, Any] = {
        "task": cfg.task,
        "k_test": cfg.vqa.k_test,
        "answers": len(answers),
        "best": str(load_best(job)),
    }
    if val_q:
        results["val"] = val_metrics(predict(val_q))
        base = baseline_predictions(most_frequent_answers(train_q), val_q)
        results["val_baseline_most_frequent_per_type"] = val_metrics(base)
    if test_q:
        preds = predict(test_q)
        if rank() == 0:
            path = write_vqa_predictions(run_dir / "vqa_test_predictions.json", [q.question_id for q in test_q], preds)
            results["test_predictions"] = str(path)
    return write_results(job, results)


@torch.no_grad()
def rank_answer_indices(
    model, loader: DataLoader, cand_ids: torch.Tensor, cand_mask: torch.Tensor, k: int, device: torch.device
) -> torch.Tensor:
    """The ranked answer (an index into the candidates) of every question of ``loader``, in order:
    [n] long on ``device``. Eval mode inside, the model's modes restored after."""
    cand_ids, cand_mask = cand_ids.to(device), cand_mask.to(device)
    out = [torch.zeros(0, dtype=torch.long, device=device)]
    with evaluating(model):
        for batch in loader:
            mask = batch["attention_mask"].to(device, non_blocking=True)
            states = model.encode_question(
                batch["images"].to(device, non_blocking=True), batch["input_ids"].to(device, non_blocking=True), mask
            )
            out.append(model.rank_answers(states, mask, cand_ids, cand_mask, k)[0])
    return torch.cat(out)


def predict_answers(
    model,
    loader: DataLoader,
    cand_ids: torch.Tensor,
    cand_mask: torch.Tensor,
    answers: list[str],
    k: int,
    device: torch.device,
) -> list[str]:
    """The ranked answer (a string of ``answers``) for every question of ``loader``, in order (eval
    mode inside, the model's modes restored after)."""
    return [answers[i] for i in rank_answer_indices(model, loader, cand_ids, cand_mask, k, device).tolist()]

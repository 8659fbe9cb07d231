"""`vlp finetune ve` through the command line on a tiny shapes world: checkpoints, best-by-dev, results,
the hypothesis-only baseline, and the fine-tuned checkpoint's ALBEF export."""

import json

import torch
from safetensors.torch import load_file

from tests.helpers import FT, QUICK, TINY_ALBEF, splits, table_rows
from vlp.checkpoint import load_model
from vlp.cli import main
from vlp.interop.albef import detect_kind
from vlp.models.ve import VEModel
from vlp.world.task_files.ve import write_ve_splits

WORLD = dict(seed=5, n_train=16, n_val=4, n_test=4)
PRETRAIN = [*TINY_ALBEF, "model.embed_dim=32", *QUICK, "train.steps=2"]


def test_finetune_ve_cli(world, pretrained, tmp_path, capsys):
    ve = write_ve_splits(world["root"], per_image=1)
    data = splits(ve, "ve", "dev")
    out = tmp_path / "ve"
    cmd = ["finetune", "ve", "--config", "configs/finetune/shapes_ve.yaml", f"pretrained={pretrained}", *FT, *data]
    capsys.readouterr()
    assert main([*cmd, f"output_dir={out}"]) == 0
    printed = capsys.readouterr().out
    val = [json.loads(line) for line in (out / "val_metrics.jsonl").read_text().splitlines()]
    assert [v["step"] for v in val] == [2, 4]
    best = max(val, key=lambda v: v["acc"])  # ties keep the first
    state = json.loads((out / "checkpoints" / "best" / "state.json").read_text())
    assert state["task"] == "ve" and state["best"]["step"] == best["step"]
    res = json.loads((out / "results.json").read_text())
    assert res["task"] == "ve" and res["hypothesis_only"] is False and res["best"].endswith("best")
    assert res["val"]["acc"] == best["acc"]  # the best checkpoint is what the final dev pass scores
    assert res["test"]["n"] == 4 and 0 <= res["test"]["acc"] <= 100
    # printed: the results as a table (splits side by side, rounded), the text entries on a line above
    rows = table_rows(printed)
    assert rows["metric"] == ["val", "test"] and rows["n"] == ["4", "4"]
    assert rows["acc"] == [f"{res['val']['acc']:.2f}", f"{res['test']['acc']:.2f}"]
    assert f"task: ve, hypothesis_only: False, majority_class: {res['majority_class']}, best: {res['best']}" in printed
    assert printed.rstrip().endswith(f"wrote {out / 'results.json'}")
    labels = [e["label"] for e in json.loads(ve["ve_train"].read_text())]
    assert res["majority_class"] in labels and labels.count(res["majority_class"]) == max(
        map(labels.count, set(labels))
    )
    sd = load_file(str(out / "checkpoints" / "step_0000004" / "model.safetensors"))
    assert sd["cls_head.2.weight"].shape[0] == 3 and not any(
        k.startswith(("mlm_head", "itm_head", "queue")) for k in sd
    )
    model, _, _ = load_model(out, torch.device("cpu"))
    assert isinstance(model, VEModel)
    # the fine-tuned checkpoint exports to ALBEF's SNLI-VE layout
    assert main(["convert", "to-albef", str(out / "checkpoints" / "best"), str(tmp_path / "ve.pth")]) == 0
    assert detect_kind(torch.load(str(tmp_path / "ve.pth"), weights_only=True)["model"]) == "ve"
    # the hypothesis-only baseline: constant images
    base = tmp_path / "hyp"
    two = [o.replace("train.steps=4", "train.steps=2") for o in cmd]  # a key is given once
    assert main([*two, f"output_dir={base}", "ve.hypothesis_only=true"]) == 0
    assert json.loads((base / "results.json").read_text())["hypothesis_only"] is True
    # the inference API: VLPModel.entailment is the classifier's softmax, one image per hypothesis
    from vlp.api import VE_LABELS, VLPModel, pixel_values, tokenize

    m = VLPModel.from_pretrained(out, device="cpu")
    entries = json.loads(ve["ve_test"].read_text())
    imgs = [str(ve["ve_test"].parent / e["image"]) for e in entries]
    probs = m.entailment(imgs, [e["sentence"] for e in entries])
    assert probs.shape == (len(entries), 3) and torch.allclose(probs.sum(1), torch.ones(len(entries)))
    assert VE_LABELS == ("contradiction", "neutral", "entailment")
    pix = pixel_values(m, imgs)
    tok = tokenize(m, [e["sentence"] for e in entries])
    with torch.no_grad():
        direct = m.model.classify(pix, tok["input_ids"], tok["attention_mask"]).float().softmax(-1)
    assert torch.allclose(probs, direct, atol=1e-5)

"""LTD, the loss zoo and COCOS end to end through the command line on a tiny shapes world."""

import json

import pytest
from safetensors.torch import load_file

from tests.helpers import pretrain
from vlp.cli import main
from vlp.train.logging import read_metrics
from vlp.weights import find_checkpoint, load_task_state, read_state

SMALL = [
    "model.dual.image_kwargs={channels: [8, 8, 16, 16]}",
    "model.dual.word_dim=16",
    "model.dual.gru_hidden=16",
    "model.dual.proj_hidden=32",
    "model.embed_dim=16",
    "loss.ltd.hidden=32",
    "data.batch_size=8",
    "data.num_workers=0",
    "train.warmup_steps=2",
    "train.log_every=2",
    "train.progress=false",
]


WORLD = dict(seed=3, n_train=24, n_val=4, n_test=12)
CONFIG = "configs/ltd/shapes_dual.yaml"


@pytest.fixture(scope="module")
def targets(world, tmp_path_factory):
    out = tmp_path_factory.mktemp("targets") / "minilm.safetensors"
    assert main(["make-targets", "--data", str(world["pretrain"]), "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def ltd_run(world, targets, tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "ltd"
    evaluation = [f"data.eval={world['retrieval_test']}", f"data.relevance={world['relevance_test']}"]
    ltd = ["loss.ltd.mode=constraint", "loss.ltd.eta=0.1", f"loss.ltd.targets={targets}", "loss.ltd.encoder=minilm"]
    averaging = ["train.steps=6", "train.average.snapshots=2", "train.average.fraction=0.5"]
    rc = pretrain(out, world["pretrain"], *evaluation, *ltd, *averaging, *SMALL, config=CONFIG)
    assert rc == 0
    return out


def test_ltd_constraint_run_logs_lambda_checkpoints_it_and_evaluates(ltd_run):
    rows = read_metrics(ltd_run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [2, 4, 6]
    for r in rows:
        assert 0.0 <= r["ltd_lambda"] <= 100.0 and 0.0 <= r["ltd_rec"] <= 2.0
        assert r["ltd_violation"] == pytest.approx(r["ltd_rec"] / 0.1 - 1.0, rel=1e-5)
    ckpt = find_checkpoint(ltd_run)
    state = load_task_state(ckpt)
    assert state["reconstruction.multiplier.steps"].item() == 6
    assert state["reconstruction.decoder.net.4.weight"].shape == (384, 32)  # to the MiniLM target
    assert read_state(ckpt)["averaged"] == [[5, 6]]
    assert not any(
        k.startswith("reconstruction") for k in load_file(str(ckpt / "model.safetensors"))
    )  # eval needs none
    m = json.loads((ltd_run / "eval" / "metrics.json").read_text())
    assert {"txt_r1", "img_r10", "img_r_precision", "txt_r_precision"} <= set(m) and m["score"] == "itc"


def test_stale_or_mismatched_targets_are_refused(world, targets, tmp_path, capsys):
    entries = json.loads(world["pretrain"].read_text())
    entries[0]["caption"] = ["a caption the targets never saw"]
    changed = tmp_path / "changed.json"
    changed.write_text(json.dumps([{**e, "image": str(world["pretrain"].parent / e["image"])} for e in entries]))
    args = [
        "pretrain",
        "--config",
        CONFIG,
        f"output_dir={tmp_path / 'r'}",
        "train.steps=1",
        "loss.ltd.mode=dual",
        f"loss.ltd.targets={targets}",
        *SMALL,
    ]
    assert main([*args, f"data.train=[{changed}]"]) == 2
    assert "stale: 1 training captions have no target" in capsys.readouterr().err
    assert (
        main([*args, f"data.train=[{world['pretrain']}]", "loss.ltd.encoder=sentence-transformers/all-mpnet-base-v2"])
        == 2
    )
    assert "asks for 'sentence-transformers/all-mpnet-base-v2'" in capsys.readouterr().err
    assert not (tmp_path / "r" / "metrics.jsonl").exists()


@pytest.mark.parametrize(
    "variant",
    [
        ["loss.contrastive.name=smoothap", "data.captions_per_image=5", "data.batch_size=4"],
        [
            "loss.contrastive.name=triplet_sh",
            "loss.ltd.mode=dual",
            "loss.ltd.decoder=tokens",
            "loss.ltd.itd_word_dim=8",
        ],
    ],
)
def test_zoo_and_itd_runs(world, tmp_path, variant):
    out = tmp_path / "run"
    given = {o.split("=")[0] for o in variant}  # a key is given once: the variant's value
    small = [o for o in SMALL if o.split("=")[0] not in given]
    assert pretrain(out, world["pretrain"], "train.steps=2", *small, *variant, config=CONFIG) == 0
    rows = read_metrics(out / "metrics.jsonl")
    assert rows[-1]["contrastive"] > 0
    if "loss.ltd.decoder=tokens" in variant:  # token NLL summed per caption: ~ length x log(vocab)
        assert rows[-1]["ltd_rec"] > 5.0


@pytest.mark.parametrize("loss", ["infonce", "triplet", "triplet_sh", "smoothap"])
def test_analyze_cocos_writes_json_and_plot(ltd_run, world, tmp_path, loss):
    out = tmp_path / loss
    extra = ["data.captions_per_image=5", "data.batch_size=4"] if loss == "smoothap" else []
    assert (
        main(
            [
                "analyze",
                "cocos",
                "--checkpoint",
                str(ltd_run),
                "--data",
                str(world["pretrain"]),
                "--loss",
                loss,
                "--out",
                str(out),
                *extra,
            ]
        )
        == 0
    )
    rec = json.loads((out / "cocos.json").read_text())
    assert rec["loss"] == loss and rec["batches"] == (6 if loss == "smoothap" else 3)
    stats = rec["stats"]
    for d in ("i2t", "t2i"):
        assert 0 <= stats[f"{d}_zeros"]["mean"] <= (4 if loss == "smoothap" else 8)
    if loss == "infonce":
        assert 0.0 < stats["i2t_one_minus_p_pos"]["mean"] < 1.0
        assert stats["i2t_count_mean"]["mean"] <= 7  # at most the 7 negatives of a batch of 8
    if loss == "triplet_sh":
        assert stats["i2t_count_total"]["mean"] <= 8  # at most one hardest negative per query
    assert (out / "cocos.png").stat().st_size > 0

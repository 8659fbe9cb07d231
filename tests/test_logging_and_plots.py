"""Optional metric sinks (TensorBoard, W&B), run_info.json and the `vlp plot` figures."""

from __future__ import annotations

import importlib.util
import json
import sys
import time
import types
from pathlib import Path

import pytest
import torch
from PIL import Image
from torch import nn

from vlp.cli import main
from vlp.config import PretrainConfig, TrainConfig, apply_overrides
from vlp.data.formats import RetrievalSplit
from vlp.errors import ConfigError
from vlp.pictures import RunStep
from vlp.runs.training.run_dir import prepare_run_dir
from vlp.train import logging as logging_mod
from vlp.train.logging import read_metrics
from vlp.train.loop import train
from vlp.train.validation import Validation
from vlp.viz import plot_losses, plot_retrieval_examples, plot_trajectories, plot_weight_heatmap, replot_retrieval

HAS_TB = importlib.util.find_spec("tensorboard") is not None
HAS_WANDB = importlib.util.find_spec("wandb") is not None


class ToyTask(nn.Module):
    """Linear regression that also reports a temperature and a distillation weight, like ITC."""

    def __init__(self):
        super().__init__()
        self.model = nn.Linear(4, 1)

    def forward(self, batch, step=0):
        pred = self.model(batch["x"]).squeeze(1)
        return {
            "loss": ((pred - batch["y"]) ** 2).mean(),
            "temp": torch.tensor(0.07 + 0.001 * step),
            "alpha": torch.tensor(min(1.0, step / 4) * 0.4),
        }

    def batch_report(self, batch):
        return len(batch["input_ids"]), batch.get("bad_samples")


def loader():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 4, generator=g)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0])
    return [{"x": x[i : i + 8], "y": y[i : i + 8], "input_ids": x[i : i + 8]} for i in range(0, 32, 8)]


def toy_cfg(**kw) -> TrainConfig:
    return TrainConfig(**{"steps": 6, "lr": 0.05, "warmup_steps": 0, "log_every": 2, "progress": False, **kw})


def png_size(path: Path) -> tuple[int, int]:
    assert path.is_file() and path.stat().st_size > 0
    with Image.open(path) as im:
        assert im.format == "PNG"
        return im.size


# ----------------------------------------------------------------------------- backends


@pytest.mark.skipif(not HAS_TB, reason="tensorboard is not installed (pip install tensorboard)")
def test_tensorboard_scalars_equal_metrics_jsonl(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    val = Validation(lambda task, step: {"r_mean": 10.0 * step, "note": "not a number"}, "r_mean", every=3)
    train(ToyTask(), loader(), toy_cfg(loggers=["tensorboard"]), tmp_path, validation=val)
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [2, 4, 6]
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"loss", "lr", "temp", "alpha", "pairs_per_s", "bad_samples", "val/r_mean"} <= tags
    assert "step" not in tags and "val/note" not in tags
    for key in ("loss", "lr", "temp", "alpha", "pairs_per_s", "data_time", "bad_samples"):
        events = acc.Scalars(key)
        assert [e.step for e in events] == [r["step"] for r in rows]
        assert [e.value for e in events] == pytest.approx([r[key] for r in rows], rel=1e-6, abs=1e-12)  # float32
    val_rows = read_metrics(tmp_path / "val_metrics.jsonl")
    assert [(e.step, e.value) for e in acc.Scalars("val/r_mean")] == [(r["step"], r["r_mean"]) for r in val_rows]


@pytest.mark.skipif(not HAS_TB, reason="tensorboard is not installed (pip install tensorboard)")
def test_zero_shot_evaluations_reach_tensorboard_and_the_loss_plot(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    val = Validation(
        lambda task, step: {"r_mean": 10.0 * step, "txt_r1": 1.0 * step}, None, every=4
    )  # train.eval_every
    train(ToyTask(), loader(), toy_cfg(loggers=["tensorboard"]), tmp_path, validation=val)
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows if "loss" in r] == [2, 4, 6]
    assert [r for r in rows if "loss" not in r] == [
        {"step": 4, "eval/r_mean": 40.0, "eval/txt_r1": 4.0},
        {"step": 6, "eval/r_mean": 60.0, "eval/txt_r1": 6.0},
    ]
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("eval/r_mean")] == [(4, 40.0), (6, 60.0)]
    assert [e.step for e in acc.Scalars("loss")] == [2, 4, 6]
    assert main(["plot", "losses", str(tmp_path)]) == 0  # the loss panel; below: R@1, r_mean
    assert png_size(tmp_path / "loss_curves.png") == (800, 640)


@pytest.mark.skipif(not HAS_TB, reason="tensorboard is not installed (pip install tensorboard)")
def test_tensorboard_resume_purges_the_steps_run_again(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    train(ToyTask(), loader(), toy_cfg(loggers=["tensorboard"], ckpt_every=2), tmp_path)
    # resume from step 4 (the step-6 checkpoint is the final one: set it aside as a crash would)
    import shutil

    shutil.rmtree(tmp_path / "checkpoints" / "step_0000006")
    train(ToyTask(), loader(), toy_cfg(loggers=["tensorboard"], ckpt_every=2, resume="auto"), tmp_path)
    rows = read_metrics(tmp_path / "metrics.jsonl")
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    events = acc.Scalars("loss")
    assert [e.step for e in events] == [r["step"] for r in rows] == [2, 4, 6]
    assert [e.value for e in events] == pytest.approx([r["loss"] for r in rows], rel=1e-6)


def test_unknown_logger_is_a_config_error_naming_the_key():
    with pytest.raises(ConfigError, match=r"train\.loggers.*'mlflow'"):
        TrainConfig(loggers=["tensorboard", "mlflow"])
    with pytest.raises(ConfigError, match=r"train\.loggers"):
        apply_overrides(PretrainConfig(), ["train.loggers=[tensorbord]"])
    assert apply_overrides(PretrainConfig(), ["train.loggers=[tensorboard,wandb]"]).train.loggers == [
        "tensorboard",
        "wandb",
    ]


@pytest.mark.parametrize("name", ["tensorboard", "wandb"])
def test_a_missing_backend_package_is_one_clear_error_at_run_start(tmp_path, monkeypatch, name):
    real = importlib.util.find_spec
    monkeypatch.setattr(logging_mod.importlib.util, "find_spec", lambda m, *a: None if m == name else real(m, *a))
    with pytest.raises(ConfigError, match=rf"train\.loggers.*pip install {name}"):
        train(ToyTask(), loader(), toy_cfg(loggers=[name]), tmp_path)
    assert not (tmp_path / "metrics.jsonl").exists()  # before any step


class FakeWandb(types.ModuleType):
    """Records what vlp hands to ``wandb.init`` and ``run.log``."""

    def __init__(self):
        super().__init__("wandb")
        self.inits, self.logged, self.finished = [], [], 0

    def init(self, **kw):
        self.inits.append(kw)
        fake = self

        class Run:
            def log(self, data, step):
                fake.logged.append((step, dict(data)))

            def finish(self):
                fake.finished += 1

        return Run()


def test_wandb_backend_with_a_fake_module(tmp_path, monkeypatch):
    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.setattr(logging_mod, "check_loggers", lambda names: None)  # the fake has no spec to find
    monkeypatch.setenv("WANDB_MODE", "offline")
    val = Validation(lambda task, step: {"r_mean": 1.5}, "r_mean", every=6)
    train(
        ToyTask(),
        loader(),
        toy_cfg(loggers=["wandb"], wandb_project="proj"),
        tmp_path,
        state={"config": {"train": {"steps": 6}}},
        validation=val,
    )
    [init] = fake.inits
    assert init["project"] == "proj" and init["dir"] == str(tmp_path) and init["mode"] == "offline"
    assert init["config"] == {"train": {"steps": 6}}
    assert (tmp_path / "wandb_run_id").read_text().strip() == init["id"]
    rows = read_metrics(tmp_path / "metrics.jsonl")
    train_logs = [(s, d) for s, d in fake.logged if "loss" in d]
    assert [s for s, _ in train_logs] == [2, 4, 6]
    for (_, d), r in zip(train_logs, rows):
        assert d == {k: float(v) for k, v in r.items() if k != "step"}
    assert (6, {"val/r_mean": 1.5}) in fake.logged
    assert fake.finished == 1


@pytest.mark.skipif(not HAS_WANDB, reason="wandb is not installed (pip install wandb)")
def test_wandb_backend_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_MODE", "offline")
    train(ToyTask(), loader(), toy_cfg(loggers=["wandb"], wandb_project="vlp-test"), tmp_path)
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    run_id = (tmp_path / "wandb_run_id").read_text().strip()
    assert runs[0].name.endswith(run_id)
    # wandb's service process writes the offline file after the run's finish() returns: on a loaded
    # machine its records can land a moment later (seen once in three suite runs), so wait for them
    deadline, data = time.monotonic() + 60, b""
    while time.monotonic() < deadline and not (b"loss" in data and b"alpha" in data):
        [data] = [p.read_bytes() for p in runs[0].glob("run-*.wandb")] or [b""]
        time.sleep(0.2)
    assert b"loss" in data and b"alpha" in data


# ----------------------------------------------------------------------------- run_info.json

RUN_INFO_KEYS = {"vlp_version", "git", "versions", "device", "processes", "argv", "hostname", "start_time", "resumes"}


def test_run_info_written_and_a_resume_appends(tmp_path, monkeypatch):
    monkeypatch.setattr(logging_mod, "git_revision", lambda root: {"commit": "abc123", "dirty": False})
    cfg = PretrainConfig(output_dir=str(tmp_path / "run"))
    run_dir = prepare_run_dir(cfg)
    info = json.loads((run_dir / "run_info.json").read_text())
    assert set(info) == RUN_INFO_KEYS
    assert info["git"] == {"commit": "abc123", "dirty": False} and info["resumes"] == []
    assert set(info["versions"]) == {"python", "torch", "timm", "transformers", "accelerate"}
    assert info["versions"]["torch"] == torch.__version__
    assert info["device"]["cpu"] and isinstance(info["device"]["gpus"], list)
    assert info["processes"] == 1 and info["argv"] == sys.argv and info["start_time"].endswith("+00:00")
    (run_dir / "metrics.jsonl").write_text("")
    resumed = apply_overrides(cfg, ["train.resume=auto"])
    prepare_run_dir(resumed)
    prepare_run_dir(resumed)
    again = json.loads((run_dir / "run_info.json").read_text())
    assert {k: v for k, v in again.items() if k != "resumes"} == {k: v for k, v in info.items() if k != "resumes"}
    assert len(again["resumes"]) == 2 and set(again["resumes"][0]) == RUN_INFO_KEYS - {"resumes"} | {"config_changes"}
    assert again["resumes"][0]["config_changes"] == {}


def test_git_revision_reads_the_checkout_files(tmp_path, monkeypatch):
    assert logging_mod.git_revision(tmp_path) is None  # not a checkout: no failure
    git = tmp_path / ".git"
    (git / "refs" / "heads").mkdir(parents=True)
    (git / "HEAD").write_text("ref: refs/heads/main\n")
    (git / "packed-refs").write_text("# pack-refs\n" + "a" * 40 + " refs/heads/main\n")

    class Done:
        returncode, stdout = 0, " M vlp/viz.py\n"

    calls = []
    monkeypatch.setattr(logging_mod.subprocess, "run", lambda args, **kw: calls.append(args) or Done())
    assert logging_mod.git_revision(tmp_path) == {"commit": "a" * 40, "dirty": True}
    assert "--no-optional-locks" in calls[0]  # read-only: takes no index lock
    (git / "refs" / "heads" / "main").write_text("b" * 40 + "\n")  # a loose ref wins over packed-refs
    Done.stdout = ""
    assert logging_mod.git_revision(tmp_path) == {"commit": "b" * 40, "dirty": False}


# ----------------------------------------------------------------------------- plots


def write_metrics(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def png_title(path: Path) -> str:
    """The ``Title`` a picture was saved with (its PNG text chunk)."""
    with Image.open(path) as im:
        return im.text.get("Title", "")


def test_trajectories_and_losses_from_a_run(tmp_path):
    train(ToyTask(), loader(), toy_cfg(), tmp_path)
    last = read_metrics(tmp_path / "metrics.jsonl")[-1]["step"]
    assert main(["plot", "trajectories", str(tmp_path)]) == 0
    assert png_size(tmp_path / "trajectories.png") == (800, 320)  # alpha, temp: 2 panels of 4 x 3.2 in at 100 dpi
    assert main(["plot", "losses", str(tmp_path)]) == 0
    assert png_size(tmp_path / "loss_curves.png") == (400, 320)  # loss only
    # titled with the run (its folder) and the last logged step
    for name in ("trajectories.png", "loss_curves.png"):
        assert png_title(tmp_path / name) == f"{tmp_path.name}, step {last}"


def test_trajectories_of_every_key_and_a_clear_error_without_any(tmp_path, capsys):
    rows = [
        {
            "step": s,
            "alpha": 0.1 * s,
            "temp": 0.07,
            "ltd_lambda": 1.0 + s,
            "ltd_violation": -0.5 + 0.1 * s,
            "srcl_alpha_h": 0.5 if s < 3 else None,
        }
        for s in (1, 2, 3)
    ]
    m = write_metrics(tmp_path / "metrics.jsonl", rows)
    assert png_size(plot_trajectories(m, tmp_path / "t.png")) == (2000, 320)
    write_metrics(m, [{"step": 1, "loss": 2.0, "lr": 1e-4}])
    assert main(["plot", "trajectories", str(tmp_path)]) == 2
    assert "no trajectories to plot (none of alpha, temp, ltd_lambda" in capsys.readouterr().err
    assert main(["plot", "trajectories", str(tmp_path / "nowhere")]) == 2


def test_losses_with_a_window_of_only_skipped_steps(tmp_path, capsys):
    rows = [
        {"step": 2, "lr": 1e-4, "loss": 3.0, "itc": 1.0, "itm": 1.0, "mlm": 1.0, "bad_samples": 0},
        {"step": 4, "lr": 1e-4, "bad_samples": 0, "skipped_steps": 2},  # no loss logged in this window
        {"step": 6, "lr": 1e-4, "loss": None, "itc": 0.8, "itm": 0.9, "mlm": 1.1, "bad_samples": 0},
    ]
    m = write_metrics(tmp_path / "metrics.jsonl", rows)
    assert png_size(plot_losses(m, tmp_path / "l.png")) == (1600, 320)
    write_metrics(m, [rows[1]])
    assert main(["plot", "losses", str(tmp_path)]) == 2
    assert "no losses to plot" in capsys.readouterr().err


def test_retrieval_grid_and_its_replot(tmp_path, capsys):
    images = []
    for i in range(6):
        p = tmp_path / f"img{i}.png"
        Image.new("RGB", (16, 16), (40 * i, 0, 255 - 40 * i)).save(p)
        images.append(str(p))
    texts = [f"caption {i} of image {i // 2}" for i in range(12)]
    split = RetrievalSplit(
        images=images,
        texts=texts,
        txt2img=[i // 2 for i in range(12)],
        img2txt=[[2 * i, 2 * i + 1] for i in range(6)],
        source="toy",
    )
    scores = torch.randn(12, 6, generator=torch.Generator().manual_seed(0))
    scores[0, 0] = 10.0  # query 0 finds its image first
    relevant = [[i // 2, (i // 2 + 1) % 6] for i in range(12)]
    eval_dir = tmp_path / "run" / "eval"
    eval_dir.mkdir(parents=True)
    out = plot_retrieval_examples(
        split, scores, eval_dir / "retrieval_examples.png", relevant, shows=RunStep("run", 40)
    )
    assert png_size(out) == (1080, 1140)  # 6 rows x (caption + top-5) cells of 1.8 x 1.9 in at 100 dpi
    assert png_title(out).splitlines()[0] == "run, step 40"
    saved = json.loads((eval_dir / "retrieval_examples.json").read_text())
    assert (
        saved["run"] == "run"
        and saved["step"] == 40
        and saved["k"] == 5
        and [r["query"] for r in saved["rows"]] == [0, 2, 4, 6, 8, 10]
    )
    first = saved["rows"][0]["top"]
    assert first[0] == {"index": 0, "path": str(Path(images[0]).resolve()), "mark": "truth"}
    for row in saved["rows"]:
        q = row["query"]
        assert [t["index"] for t in row["top"]] == scores[q].topk(5).indices.tolist()
        for t in row["top"]:
            assert t["mark"] == ("truth" if t["index"] == q // 2 else "relevant" if t["index"] in relevant[q] else None)
    out.unlink()
    assert main(["plot", "retrieval", str(tmp_path / "run")]) == 0  # a run directory: its eval/
    assert png_size(out) == (1080, 1140)
    assert png_size(replot_retrieval(eval_dir, tmp_path / "again.png")) == (1080, 1140)
    assert png_title(out).splitlines()[0] == png_title(tmp_path / "again.png").splitlines()[0] == "run, step 40"
    assert main(["plot", "retrieval", str(tmp_path)]) == 2
    assert "no retrieval_examples.json" in capsys.readouterr().err


def test_srcl_weight_heatmap_size(tmp_path):
    n = 10
    paths = []
    for i in range(n):
        p = tmp_path / f"i{i}.png"
        Image.new("RGB", (8, 8), (20 * i, 100, 100)).save(p)
        paths.append(str(p))
    w = torch.rand(n, n, generator=torch.Generator().manual_seed(0)) * 2
    out = plot_weight_heatmap(w, paths, [f"caption {i}" for i in range(n)], tmp_path / "h.png", "title")
    assert png_size(out) == (814, 847)  # (1.2 + 0.62 n) x (2.2 + 0.55 n) in at 110 dpi


def test_metrics_log_survives_a_kill_mid_line(tmp_path) -> None:
    """SIGKILL can cut the last record of metrics.jsonl short; reading (and a resume's truncation)
    drops that line, while a bad line elsewhere is an error naming it."""
    from vlp.errors import DataError
    from vlp.train.logging import MetricsLog

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 2.5}\n{"step": 2, "loss": 2.25}\n{"step": 3, "lo')
    assert read_metrics(path) == [{"step": 1, "loss": 2.5}, {"step": 2, "loss": 2.25}]
    log = MetricsLog(path)
    log.truncate_after(1)
    log.write({"step": 2, "loss": 2.0})
    assert read_metrics(path) == [{"step": 1, "loss": 2.5}, {"step": 2, "loss": 2.0}]
    path.write_text('{"step": 1}\n{"step": 2,,}\n{"step": 3}\n')
    with pytest.raises(DataError, match=r"metrics.jsonl, line 2: not a JSON record"):
        read_metrics(path)

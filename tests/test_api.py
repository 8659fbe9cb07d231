"""vlp.api: VLPModel.from_pretrained / save_pretrained and the inference methods, on tiny randomly
initialised checkpoints written in the formats pretraining and fine-tuning write."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors import SafetensorError
from safetensors.torch import load_file

from tests.helpers import DUAL
from vlp import VLPModel
from vlp.api import CONFIG, PREPROCESSOR, WEIGHTS, UnsupportedKind, build_inference_model, pixel_values, tokenize
from vlp.checkpoint import image_size, load_model
from vlp.config import (
    FinetuneConfig,
    FinetuneDataConfig,
    ModelConfig,
    PretrainConfig,
    TextConfig,
    VisionConfig,
    VQAConfig,
    load_config,
    to_dict,
)
from vlp.data.formats import RetrievalSplit
from vlp.errors import CheckpointError
from vlp.eval.retrieval import embed
from vlp.models.albef import ALBEF
from vlp.models.build import build_model_of_kind
from vlp.models.nlvr import NLVRModel
from vlp.models.vqa import VQAModel
from vlp.preprocess import transforms
from vlp.version import __version__
from vlp.weights import MANIFEST, save_checkpoint

ROOT = Path(__file__).parents[1]
CPU = torch.device("cpu")
TEXTS = ["A red circle.", "two blue squares", "a green triangle left of a circle", "nothing at all here"]
TOKENIZER_FILES = {"tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"}


def tiny_config(**kw) -> ModelConfig:
    return ModelConfig(
        vision=VisionConfig(depth=1, img_size=32),
        text=TextConfig(layers=1, fusion_layers=1, dropout=0.0),
        queue_size=8,
        embed_dim=16,
        **kw,
    )


def _perturb_training_state(model: torch.nn.Module) -> None:
    """Twins and queues that differ from the online weights: the inference files must not need them."""
    with torch.no_grad():
        for p in model.momentum.twin.parameters():
            p.add_(0.5)
        if model.queue is not None and model.queue.size:
            model.queue.get("image").normal_()


def _finetune_state(task: str, mcfg: ModelConfig, **data) -> dict:
    cfg = FinetuneConfig(task=task, data=FinetuneDataConfig(**data), vqa=VQAConfig(k_test=3))
    return {"task": task, "vlp_version": __version__, "config": to_dict(cfg), "model": to_dict(mcfg), "step": 4}


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> list[str]:
    """Five PNGs of different sizes (one below the minimum side, upscaled on load)."""
    d = tmp_path_factory.mktemp("img")
    g = torch.Generator().manual_seed(0)
    paths = []
    for i, (w, h) in enumerate([(40, 40), (64, 48), (12, 30), (90, 70), (33, 33)]):
        arr = torch.randint(0, 256, (h, w, 3), generator=g, dtype=torch.uint8).numpy()
        paths.append(str(d / f"{i}.png"))
        Image.fromarray(arr).save(paths[-1])
    return paths


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A pretraining run directory with one step checkpoint (state.json as pretraining writes it)."""
    torch.manual_seed(0)
    mcfg = tiny_config()
    model = ALBEF(mcfg)
    _perturb_training_state(model)
    return pretrain_run(tmp_path_factory.mktemp("run"), model, mcfg, step=2)


def pretrain_run(run: Path, model: ALBEF, mcfg: ModelConfig, step: int) -> Path:
    """``run`` holding one step checkpoint of ``model``, its state.json as pretraining writes it."""
    state = {"task": "pretrain", "vlp_version": __version__, "model": to_dict(mcfg), "step": step}
    state["config"] = to_dict(PretrainConfig(model=mcfg))
    save_checkpoint(run / "checkpoints" / f"step_{step:07d}", model, state)
    return run


@pytest.fixture(scope="module")
def pretrained(run_dir, tmp_path_factory):
    """(model from the run, the same after save_pretrained -> from_pretrained, the saved directory)."""
    m = VLPModel.from_pretrained(run_dir, device="cpu")
    out = m.save_pretrained(tmp_path_factory.mktemp("saved") / "tiny")
    return m, VLPModel.from_pretrained(out, device="cpu"), out


def test_round_trip_gives_identical_outputs(pretrained, images):
    m, m2, _ = pretrained
    assert (m.kind, m2.kind) == ("pretrain", "pretrain") and isinstance(m2.model, ALBEF)
    for method, args in (
        ("encode_image", (images,)),
        ("encode_text", (TEXTS,)),
        ("similarity", (images, TEXTS)),
        ("itm_score", (images[:4], TEXTS)),
    ):
        a, b = getattr(m, method)(*args), getattr(m2, method)(*args)
        assert torch.equal(a, b), method
    assert m.encode_image(images).shape == (5, 16) and m.encode_text(TEXTS).shape == (4, 16)
    assert m.similarity(images, TEXTS).shape == (5, 4) and m.itm_score(images[:4], TEXTS).shape == (4,)
    assert torch.allclose(m.encode_image(images).norm(dim=-1), torch.ones(5))
    assert torch.allclose(m.encode_text(TEXTS).norm(dim=-1), torch.ones(4))
    # the saved twin is dropped: the loaded one is a copy of the online weights
    online = dict(m2.model.fusion.named_parameters())
    assert all(torch.equal(p, online[n]) for n, p in m2.model.momentum["fusion"].named_parameters())


def test_inputs_paths_pil_tensors_and_single_items_agree(pretrained, images):
    m = pretrained[1]
    feats = m.encode_image(images)
    pil = [Image.open(p) for p in images]
    assert torch.equal(m.encode_image(pil), feats)
    assert torch.equal(m.encode_image(pixel_values(m, images)), feats)
    assert torch.allclose(m.encode_image(images, batch_size=2), feats, atol=1e-5)
    assert torch.allclose(m.encode_image(images[1])[0], feats[1], atol=1e-5)
    assert m.encode_text("one caption").shape == (1, 16)
    assert pixel_values(m, images).shape == (5, 3, 32, 32)
    with pytest.raises(ValueError, match="aligned pairs: got 2 images and 3 texts"):
        m.itm_score(images[:2], TEXTS[:3])


def test_saved_directory_holds_exactly_the_documented_files(pretrained, run_dir):
    m, m2, out = pretrained
    written = set(m.tokenizer.save_pretrained(str(out.parent / "tok")))
    tok_files = {Path(p).name for p in written}
    assert "tokenizer_config.json" in tok_files and tok_files <= TOKENIZER_FILES
    assert {p.name for p in out.iterdir()} == {CONFIG, WEIGHTS, PREPROCESSOR, MANIFEST} | tok_files
    cfg = json.loads((out / CONFIG).read_text())
    assert (cfg["format"], cfg["kind"], cfg["vlp_version"], cfg["architecture"]) == (
        "vlp-pretrained",
        "pretrain",
        __version__,
        "ALBEF",
    )
    assert cfg["weights"] == {"file": WEIGHTS, "momentum_twins": "dropped", "queues": "dropped"}
    assert cfg["model"]["vision"]["img_size"] == 32 and cfg["model"]["queue_size"] == 8  # recorded as trained
    assert cfg["source"]["step"] == 2 and cfg["source"]["checkpoint"].endswith("step_0000002")
    pre = json.loads((out / PREPROCESSOR).read_text())
    assert pre["image_size"] == 32 and pre["max_len"] == 30 and pre["caption_cleaning"] == "pre_caption"
    assert pre["mean"] == PretrainConfig().data.image.mean and pre["resize"] == "bicubic, no crop"
    saved = load_file(str(out / WEIGHTS))
    full = load_file(str(run_dir / "checkpoints" / "step_0000002" / WEIGHTS))
    assert not any(k.startswith(("momentum.", "queue.")) for k in saved)
    assert set(saved) == {k for k in full if not k.startswith(("momentum.", "queue."))}
    assert all(torch.equal(v, full[k]) for k, v in saved.items())
    assert (out / WEIGHTS).stat().st_size < 0.6 * (run_dir / "checkpoints" / "step_0000002" / WEIGHTS).stat().st_size
    mask = os.umask(0)
    os.umask(mask)
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in out.iterdir()} == {
        p.name: oct(0o666 & ~mask) for p in out.iterdir()
    }  # readable by colleagues as the umask allows (safetensors alone writes 0600)
    # saving again replaces the directory; a foreign non-empty directory is refused
    assert m2.save_pretrained(out) == out
    assert {p.name for p in out.iterdir()} == {CONFIG, WEIGHTS, PREPROCESSOR, MANIFEST} | tok_files
    foreign = out.parent / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep")
    with pytest.raises(FileExistsError, match="not a vlp save_pretrained directory"):
        m.save_pretrained(foreign)
    assert (foreign / "notes.txt").read_text() == "keep"


def test_a_changed_or_truncated_file_of_a_saved_directory_is_refused(pretrained, tmp_path):
    out = shutil.copytree(pretrained[2], tmp_path / "copy")
    files = json.loads((out / MANIFEST).read_text())["files"]
    assert set(files) == {p.name for p in out.iterdir()} - {MANIFEST}
    weights = bytearray((out / WEIGHTS).read_bytes())
    weights[-100] ^= 0xFF  # inside the tensor data: safetensors itself would load it
    (out / WEIGHTS).write_bytes(bytes(weights))
    with pytest.raises(CheckpointError, match=r"model.safetensors does not match its SHA-256 in manifest.json"):
        VLPModel.from_pretrained(out, device="cpu")
    shutil.copy(pretrained[2] / WEIGHTS, out / WEIGHTS)
    with open(out / PREPROCESSOR, "a") as f:
        f.write(" ")
    with pytest.raises(CheckpointError, match=r"preprocessor.json is \d+ bytes, the manifest says"):
        VLPModel.from_pretrained(out, device="cpu")


def test_an_edited_tokenizer_file_is_reported_as_changed_not_truncated(pretrained, tmp_path):
    """Issue 41, item 9: an edited ``tokenizer_config.json`` (longer, or the same length) is "changed
    since it was saved"; "truncated" is kept for a file shorter than the manifest says."""
    out = shutil.copytree(pretrained[2], tmp_path / "copy")
    f = out / "tokenizer_config.json"
    saved = f.read_text()
    f.write_text(saved.replace("{", '{"model_max_length": 7, ', 1))  # longer
    with pytest.raises(CheckpointError) as e:
        VLPModel.from_pretrained(out, device="cpu")
    assert "truncated" not in str(e.value)
    assert str(e.value).endswith(
        f"tokenizer_config.json is {f.stat().st_size} bytes, the manifest says {len(saved.encode())} "
        "(changed since it was saved)"
    )
    f.write_text(saved.replace("[CLS]", "[SEP]", 1))  # the same length
    with pytest.raises(
        CheckpointError,
        match=r"tokenizer_config.json does not match its SHA-256 in manifest.json "
        r"\(changed since it was saved, or corrupted\)$",
    ):
        VLPModel.from_pretrained(out, device="cpu")
    f.write_text(saved[:-10])  # shorter
    with pytest.raises(
        CheckpointError, match=r"tokenizer_config.json is \d+ bytes, the manifest says \d+ \(truncated\)$"
    ):
        VLPModel.from_pretrained(out, device="cpu")


@pytest.mark.parametrize("stray", ["special_tokens_map.json", "added_tokens.json", "vocab.txt"])
def test_a_tokenizer_file_the_manifest_does_not_list_is_refused_by_name(pretrained, tmp_path, stray):
    """Issue 41, item 3: a file dropped into a saved folder that the tokenizer loader would read
    (``[unused1]``/``[unused2]`` as CLS/SEP changed ``similarity`` silently) is refused; a file no
    loader reads (the Hub's README.md) is not."""
    out = shutil.copytree(pretrained[2], tmp_path / "copy")
    (out / "README.md").write_text("model card\n")
    VLPModel.from_pretrained(out, device="cpu")
    (out / stray).write_text(json.dumps({"cls_token": "[unused1]", "sep_token": "[unused2]"}))
    with pytest.raises(CheckpointError, match=rf"{stray} is not in manifest.json, and the tokenizer would read it"):
        VLPModel.from_pretrained(out, device="cpu")


def test_a_saved_folder_without_a_manifest_is_refused(pretrained, tmp_path):
    """With its manifest deleted, a stray tokenizer file (or any edit) could not be caught: the
    folder is refused by name instead of loading unchecked."""
    out = shutil.copytree(pretrained[2], tmp_path / "copy")
    (out / MANIFEST).unlink()
    with pytest.raises(CheckpointError, match=rf"{out}: no manifest.json, so vlp cannot tell whether its files"):
        VLPModel.from_pretrained(out, device="cpu")


def test_the_refused_tokenizer_files_cover_what_transformers_reads():
    import transformers.tokenization_utils_base as tub
    from transformers import BertTokenizerFast

    from vlp.weights import TOKENIZER_FILES

    read = {tub.SPECIAL_TOKENS_MAP_FILE, tub.ADDED_TOKENS_FILE, tub.TOKENIZER_CONFIG_FILE, tub.FULL_TOKENIZER_FILE}
    read |= set(BertTokenizerFast.vocab_files_names.values())
    assert read <= set(TOKENIZER_FILES)


def test_a_full_disk_while_saving_leaves_no_staging_folder(pretrained, tmp_path, monkeypatch):
    def full(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr("vlp.weights.save_file", full)  # what safetensors raises on a full disk
    with pytest.raises(CheckpointError, match=r"cannot write .*saved: no space left on the device \(.* free in "):
        pretrained[1].save_pretrained(tmp_path / "saved")
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_while_saving_over_a_saved_folder_keeps_it_and_gives_save_advice(pretrained, tmp_path, monkeypatch):
    """Issue 41, item 9: the message of a full disk under ``save_pretrained`` is about saving (free
    space or another folder), not training's ``train.keep_last`` and resume; and it is true that the
    earlier save is kept: its files are unchanged and it loads."""
    out = shutil.copytree(pretrained[2], tmp_path / "saved")
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("vlp.weights.save_file", full)
    with pytest.raises(CheckpointError) as e:
        pretrained[1].save_pretrained(out)
    message = str(e.value)
    assert "keep_last" not in message and "resume" not in message
    assert message.startswith(f"cannot write {out}: no space left on the device (")
    assert message.endswith(
        f"free some space, or save to a folder on another disk; {out} is as it was (the new files were "
        f"written to {out}.tmp first, now removed)"
    )
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before and sorted(tmp_path.iterdir()) == [out]
    VLPModel.from_pretrained(out, device="cpu")


def test_encoders_match_the_retrieval_evaluator(pretrained, run_dir, images):
    """Same features as vlp.eval.retrieval.embed with the evaluation job's transform and max_len."""
    model, cfg, tokenizer = load_model(run_dir, CPU)
    split = RetrievalSplit(images, TEXTS[:3] + TEXTS[:2], [0, 1, 2, 3, 4], [[i] for i in range(5)], "mem")
    transform = transforms.test_transform(image_size(cfg), cfg.data.image)
    emb = embed(model, split, tokenizer, transform, cfg.model.text.max_len, 8, CPU, show_progress=False)
    m2 = pretrained[1]
    assert torch.equal(m2.encode_image(images, batch_size=8), emb.image_feat)
    assert torch.equal(m2.encode_text(split.texts, batch_size=8), emb.text_feat)
    assert torch.equal(m2.similarity(images, split.texts, batch_size=8), emb.image_feat @ emb.text_feat.T)


def test_itm_score_is_the_itm_head_softmax(pretrained, images):
    m = pretrained[1]
    pixels, tok = pixel_values(m, images[:4]), tokenize(m, TEXTS)
    with torch.no_grad():
        txt = m.model.encode_text(tok["input_ids"], tok["attention_mask"])
        fused = m.model.fuse(txt.hidden, txt.mask, m.model.encode_image(pixels).tokens)
        ref = m.model.itm_logits(fused).softmax(-1)[:, 1]
    got = m.itm_score(images[:4], TEXTS)
    assert torch.equal(got, ref) and ((got >= 0) & (got <= 1)).all()


def test_pretrained_directory_loads_without_training_code(pretrained, images):
    out = pretrained[2]
    ref = pretrained[1].encode_text(TEXTS).tolist()
    code = (
        "import sys, json; from vlp import VLPModel; "
        f"m = VLPModel.from_pretrained({str(out)!r}, device='cpu'); "
        f"f = m.encode_text({TEXTS!r}).tolist(); "
        "bad = [n for n in ('vlp.runs', 'vlp.train.loop', 'vlp.data.datasets', 'datasets') "
        "if n in sys.modules]; print(json.dumps([bad, f]))"
    )
    res = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
    )
    assert res.returncode == 0, res.stderr[-3000:]
    bad, feats = json.loads(res.stdout.strip().splitlines()[-1])
    assert bad == [] and torch.allclose(torch.tensor(feats), torch.tensor(ref), atol=1e-6)


@pytest.mark.parametrize("kind", ["pretrain", "retrieval", "vqa", "nlvr2", "nlvr-ta"])
def test_inference_model_is_the_model_of_its_kind(kind):
    mcfg = tiny_config()
    a, b = build_inference_model(kind, mcfg, 30522), build_model_of_kind(kind, mcfg, 30522)
    assert type(a) is type(b) and set(a.state_dict()) == set(b.state_dict())


@pytest.fixture(scope="module")
def vqa_run(tmp_path_factory):
    torch.manual_seed(1)
    mcfg = tiny_config()
    model = VQAModel(mcfg)
    _perturb_training_state(model)
    d = tmp_path_factory.mktemp("vqa")
    answers = d / "answer_list.json"
    answers.write_text(json.dumps(["red", "blue", "two", "yes", "no", "green circle"]))
    state = _finetune_state("vqa", mcfg, answer_list=str(answers), max_len=25)
    save_checkpoint(d / "run" / "checkpoints" / "step_0000004", model, state)
    return d / "run", answers


def test_vqa_answers_like_the_finetune_predictor(vqa_run, images, tmp_path):
    from vlp.data.vqa import VQACollator, pre_question, tokenize_answers
    from vlp.runs.training.finetune import predict_answers

    run, answers_file = vqa_run
    m = VLPModel.from_pretrained(run, device="cpu")
    assert m.kind == "vqa" and m.preprocessor.max_len == 25 and m.preprocessor.caption_cleaning == "pre_question"
    qs = ["What colour is the circle?", "How many squares?", "Is there a triangle?"]
    got = m.answer(images[:3], qs)
    answers = json.loads(answers_file.read_text())
    assert len(got) == 3 and set(got) <= set(answers)
    # the fine-tuning job's prediction path on the same inputs
    tok = m.tokenizer
    batch = VQACollator(tok, 25, 10)(
        [
            {"image": p, "question": pre_question(q, 50), "answers": [], "weights": [], "index": i}
            for i, (p, q) in enumerate(zip(pixel_values(m, images[:3]), qs))
        ]
    )
    ids, mask = tokenize_answers(tok, answers, 10)
    assert predict_answers(m.model, [batch], ids, mask, answers, 3, CPU) == got
    assert m.answer(images[:3], qs, candidates=["yes", "no"], k=2) == predict_answers(
        m.model, [batch], *tokenize_answers(tok, ["yes", "no"], 10), ["yes", "no"], 2, CPU
    )
    # the answer list travels in config.json
    out = m.save_pretrained(tmp_path / "vqa")
    cfg = json.loads((out / CONFIG).read_text())
    assert cfg["vqa"] == {"k_test": 3, "answers": answers} and not any(
        k.startswith("momentum.") for k in load_file(str(out / WEIGHTS))
    )
    assert VLPModel.from_pretrained(out, device="cpu").answer(images[:3], qs) == got
    calls = (("encode_image", (images,)), ("itm_score", (images[:1], "x")), ("nlvr", (images[0], images[1], "x")))
    for method, args in calls:
        with pytest.raises(UnsupportedKind, match=f"VLPModel.{method} needs .*this is a vqa checkpoint"):
            getattr(m, method)(*args)


def test_vqa_without_a_stored_answer_list_needs_candidates(images, tmp_path):
    mcfg = tiny_config()
    lost = tmp_path / "lost"
    save_checkpoint(lost, VQAModel(mcfg), _finetune_state("vqa", mcfg, answer_list=str(tmp_path / "gone.json")))
    m = VLPModel.from_pretrained(lost, device="cpu")
    with pytest.raises(ValueError, match="stores no answer list .* pass candidates"):
        m.answer(images[0], "what colour?")
    assert m.answer(images[0], "what colour?", candidates=["red", "blue"]) in (["red"], ["blue"])


def test_nlvr2_probabilities_and_round_trip(images, tmp_path):
    torch.manual_seed(2)
    mcfg = tiny_config()
    model = NLVRModel(mcfg, head="cls")
    save_checkpoint(tmp_path / "nlvr", model, _finetune_state("nlvr2", mcfg, max_len=40))
    m = VLPModel.from_pretrained(tmp_path / "nlvr", device="cpu")
    assert m.kind == "nlvr2" and m.preprocessor.max_len == 40
    sents = ["the left image has two circles", "there is a red square", "both images are blue"]
    p = m.nlvr(images[:3], images[2:5], sents)
    assert p.shape == (3,) and ((p >= 0) & (p <= 1)).all()
    tok = tokenize(m, sents)
    with torch.no_grad():
        ref = m.model.classify(
            pixel_values(m, images[:3]), pixel_values(m, images[2:5]), tok["input_ids"], tok["attention_mask"]
        ).softmax(-1)[:, 1]
    assert torch.equal(p, ref)
    one = m.nlvr(images[0], images[2], sents[0])
    assert isinstance(one, float) and abs(one - float(p[0])) < 1e-5
    m2 = VLPModel.from_pretrained(m.save_pretrained(tmp_path / "saved"), device="cpu")
    assert torch.equal(m2.nlvr(images[:3], images[2:5], sents), p)
    for method, args in (("encode_text", (sents,)), ("answer", (images[0], "q", ["a"]))):
        with pytest.raises(UnsupportedKind, match=f"VLPModel.{method} needs .*this is a nlvr2 checkpoint"):
            getattr(m, method)(*args)
    with pytest.raises(ValueError, match="one image pair per sentence"):
        m.nlvr(images[:2], images[:2], sents)


def test_wrong_kind_errors_name_the_kind(pretrained, images, tmp_path):
    m = pretrained[1]
    with pytest.raises(
        UnsupportedKind,
        match=r"VLPModel.answer needs the VQA answer decoder \(vqa checkpoint\); "
        r"this is a pretrain checkpoint",
    ):
        m.answer(images[0], "what?", candidates=["a"])
    with pytest.raises(UnsupportedKind, match="VLPModel.nlvr needs the NLVR2 classifier .*a pretrain checkpoint"):
        m.nlvr(images[0], images[1], "x")
    mcfg = tiny_config()
    save_checkpoint(tmp_path / "ta", NLVRModel(mcfg, head="ta"), _finetune_state("nlvr-ta", mcfg))
    ta = VLPModel.from_pretrained(tmp_path / "ta", device="cpu")
    for method, args in (("encode_image", (images,)), ("nlvr", (images[0], images[1], "x"))):
        with pytest.raises(UnsupportedKind, match="this is a nlvr-ta checkpoint"):
            getattr(ta, method)(*args)


def test_dual_encoder_encodes_but_has_no_itm(images, tmp_path):
    from vlp.config import DualConfig
    from vlp.models.dual import DualEncoder

    torch.manual_seed(3)
    mcfg = tiny_config(
        arch="dual", dual=DualConfig(image="resnet10t", img_size=32, word_dim=16, gru_hidden=16, proj_hidden=32)
    )
    cfg = load_config(
        PretrainConfig,
        overrides=DUAL,
    )
    cfg.model = mcfg
    state = {"task": "pretrain", "vlp_version": __version__, "config": to_dict(cfg), "model": to_dict(mcfg), "step": 1}
    save_checkpoint(tmp_path / "dual", DualEncoder(mcfg, 30522).eval(), state)
    m = VLPModel.from_pretrained(tmp_path / "dual", device="cpu")
    m2 = VLPModel.from_pretrained(m.save_pretrained(tmp_path / "saved"), device="cpu")
    assert torch.equal(m.similarity(images, TEXTS), m2.similarity(images, TEXTS))
    assert m2.similarity(images, TEXTS).shape == (5, 4)
    with pytest.raises(UnsupportedKind, match="itm_score needs the ITM head .*model.arch=dual"):
        m.itm_score(images[:1], "x")


def test_vlpmodel_stays_slim():
    """VLPModel holds what a user calls, the work is in the task modules (issue 53): at most 14
    methods (properties, private and dunder ones and the task functions it takes as methods
    counted) and at most 200 lines."""
    import inspect

    from vlp.api import answer, classify, gradcam, loading, retrieval

    kinds = (property, classmethod, staticmethod)
    methods = [n for n, v in vars(VLPModel).items() if inspect.isfunction(v) or isinstance(v, kinds)]
    lines, _ = inspect.getsourcelines(VLPModel)
    assert len(methods) <= 14 and len(lines) <= 200, (len(methods), methods, len(lines))
    assert VLPModel.answer is answer.answer and VLPModel.nlvr is classify.nlvr
    assert VLPModel.explain is gradcam.explain and VLPModel.itm_score is retrieval.itm_score
    assert VLPModel.save_pretrained is loading.save_pretrained


def test_gradcam_through_the_model_and_gradcam_layer(pretrained, images, vqa_run):
    from vlp.api import gradcam_layer, grounding_maps
    from vlp.models.gradcam import fusion_layer_index

    m = pretrained[1]
    layer = gradcam_layer(m)
    assert layer == fusion_layer_index(m.model, None)
    e = m.explain(images[0], TEXTS[0])
    assert e.layer == layer and e.maps.shape[0] == len(e.tokens) and 0 <= e.itm_score <= 1
    maps = grounding_maps(m, images[:2], TEXTS[:2])
    assert maps.shape == (2, *e.maps.shape[1:]) and not any(p.grad is not None for p in m.model.parameters())
    with pytest.raises(ValueError):
        gradcam_layer(m, 99)
    vqa = VLPModel.from_pretrained(vqa_run[0], device="cpu")
    with pytest.raises(UnsupportedKind, match=r"vlp.api.gradcam_layer needs the ITM head .*this is a vqa checkpoint"):
        gradcam_layer(vqa)
    with pytest.raises(UnsupportedKind, match=r"VLPModel.explain needs the ITM head .*this is a vqa checkpoint"):
        vqa.explain(images[0], "x")


def test_the_capability_check_reads_the_kind_registry(pretrained, images):
    """A kind registered in KINDS runs the methods its capabilities name and no other."""
    from dataclasses import replace

    from vlp.kinds import KINDS

    m = pretrained[1]
    toy = replace(KINDS.get("pretrain"), name="toy-text", capabilities=("encode_text",))
    with KINDS.registered("toy-text", toy):
        vm = VLPModel(m.model, "toy-text", m.model_config, m.tokenizer, m.preprocessor)
        assert torch.equal(vm.encode_text(TEXTS), m.encode_text(TEXTS))
        with pytest.raises(
            UnsupportedKind,
            match=r"VLPModel.encode_image needs ITC projections \(pretrain or helper or retrieval checkpoint\); "
            r"this is a toy-text checkpoint$",
        ):
            vm.encode_image(images)
    with pytest.raises(CheckpointError, match="unknown checkpoint kind 'toy-text'; expected one of"):
        VLPModel(m.model, "toy-text", m.model_config, m.tokenizer, m.preprocessor)


def test_albef_compat_survives_save_pretrained(tmp_path):
    """A converted ALBEF checkpoint's ``model.text.albef_compat`` (ALBEF's own caption cleaning and
    tokenizer behaviour) is kept by save_pretrained -> from_pretrained and by vlp.get_tokenizer's cleaning."""
    torch.manual_seed(0)
    mcfg = tiny_config()
    mcfg.text.albef_compat = True
    m = VLPModel.from_pretrained(pretrain_run(tmp_path / "run", ALBEF(mcfg), mcfg, step=1), device="cpu")
    m2 = VLPModel.from_pretrained(m.save_pretrained(tmp_path / "saved"), device="cpu")
    assert transforms.is_albef_compat(m.tokenizer) and transforms.is_albef_compat(m2.tokenizer)
    text = "A  dog's ball -- on the grass!"
    assert torch.equal(tokenize(m, [text])["input_ids"], tokenize(m2, [text])["input_ids"])

import pytest

from vlp.config import PretrainConfig, apply_overrides, from_dict, load_config, to_dict, to_yaml
from vlp.errors import ConfigError


def test_defaults_yaml_and_overrides(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("train:\n  steps: 7\nmodel:\n  vision: {preset: tiny, depth: 3}\n")
    cfg = load_config(PretrainConfig, f, ["train.lr=0.5", "model.vision.depth=2", "data.train=[a.json,b.json]"])
    assert cfg.train.steps == 7 and cfg.train.lr == 0.5
    assert cfg.model.vision.depth == 2
    assert cfg.data.train == ["a.json", "b.json"]
    assert cfg.loss.mlm_probability == 0.15  # default kept


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["train.stepz=3"], "train.stepz"),
        (["model.vision.widht=3"], "model.vision.widht"),
        (["train.steps=many"], "train.steps"),
        (["train.precision=fp8"], "train.precision"),
        (["eval.score=bm25"], "eval.score"),
        (["loss.itc_bank=world"], "loss.itc_bank"),
        (["loss.itc_bank=global", "loss.regulation=srcl"], "loss.itc_bank'/'loss.regulation"),
    ],
)
def test_bad_overrides_name_the_key(overrides, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(PretrainConfig, None, overrides)


def test_bad_yaml_names_file_and_key(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("data:\n  batch_sise: 3\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml.*data\.batch_sise"):
        load_config(PretrainConfig, f)
    f.write_text("train: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(PretrainConfig, f)
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(PretrainConfig, tmp_path / "none.yaml")


def test_override_without_equals():
    with pytest.raises(ConfigError, match="expected key=value"):
        load_config(PretrainConfig, None, ["train.steps"])


def test_round_trip_through_dict_and_yaml():
    cfg = load_config(PretrainConfig, None, ["train.steps=11", "model.text.preset=small"])
    again = from_dict(PretrainConfig, to_dict(cfg))
    assert again == cfg
    assert "steps: 11" in to_yaml(cfg)
    assert apply_overrides(cfg, ["eval.k_test=3"]).eval.k_test == 3


@pytest.mark.parametrize(
    "override, expected",
    [
        ("data.train=[http://h:8/{00000..00007}.tar]", ["http://h:8/{00000..00007}.tar"]),
        ("data.train=[s3://b/{0..3}.tar,s3://c/{a,b}.tar]", ["s3://b/{0..3}.tar", "s3://c/{a,b}.tar"]),
        ("data.train=['gs://b/{0..3}.tar']", ["gs://b/{0..3}.tar"]),  # the quoted form, as before
        ("data.train=[plain/folder, s3://b/{0..1}.tar]", ["plain/folder", "s3://b/{0..1}.tar"]),
    ],
)
def test_a_brace_url_in_a_list_override_needs_no_quotes(override, expected):
    assert load_config(PretrainConfig, overrides=[override]).data.train == expected


def test_an_unbalanced_brace_in_a_list_override_is_one_clear_error():
    with pytest.raises(ConfigError, match=r"^command-line override .*: unbalanced braces in the list"):
        load_config(PretrainConfig, overrides=["data.train=[s3://b/{0..3.tar, x]"])

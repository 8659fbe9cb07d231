"""``loss.contrastive.smoothap_tau`` and ``loss.contrastive.margin`` are their losses' own
hyperparameters now (``loss.contrastive.params.tau`` / ``.margin``, issue 53): a saved config with the
old keys is migrated (an old run still opens, resumes and computes what it computed), a user's config
that sets them gets one error naming the new key."""

from __future__ import annotations

import pytest

from vlp.config import PretrainConfig, from_dict, load_config, to_dict
from vlp.config.loss import migrate_saved_contrastive, refuse_moved_contrastive
from vlp.config.resume import resume_changes
from vlp.errors import ConfigError
from vlp.losses import build_loss


def old_saved(name: str, **contrastive: object) -> dict:
    """A run config as an older vlp saved it: ``loss.contrastive`` with margin and smoothap_tau."""
    saved = to_dict(load_config(PretrainConfig, None, [f"loss.contrastive.name={name}", "loss.distill=false"]))
    saved["loss"]["contrastive"].update({"margin": 0.2, "smoothap_tau": 0.01, **contrastive})
    return saved


def test_a_saved_config_with_the_old_keys_is_migrated_to_the_losses_params():
    cases = {
        "smoothap": ({"smoothap_tau": 0.02}, {"tau": 0.02}),
        "triplet": ({"margin": 0.3}, {"margin": 0.3}),
        "triplet_sh": ({}, {"margin": 0.2}),
        "infonce": ({"margin": 0.3, "smoothap_tau": 0.5}, {}),  # never reached InfoNCE: dropped
    }
    for name, (old, params) in cases.items():
        saved = old_saved(name, **old)
        migrated = migrate_saved_contrastive(saved)
        assert migrated["loss"]["contrastive"] == {"name": name, "tau": None, "params": params}
        assert "margin" in saved["loss"]["contrastive"]  # the caller's dict is left as it was
        cfg = from_dict(PretrainConfig, migrated)
        assert build_loss(cfg.loss.contrastive).hyperparameters() == (params or {})
    # params set in the saved config win over the old key; a config without old keys is unchanged
    saved = old_saved("smoothap", params={"tau": 0.05})
    assert migrate_saved_contrastive(saved)["loss"]["contrastive"]["params"] == {"tau": 0.05}
    new = to_dict(PretrainConfig())
    assert migrate_saved_contrastive(new) == new


def test_resuming_an_old_run_compares_with_its_migrated_config():
    """The resume check on an old run's config: the same settings are no change; a different SmoothAP
    temperature is refused, named by its new key."""
    saved = migrate_saved_contrastive(old_saved("smoothap", smoothap_tau=0.02))
    same = load_config(
        PretrainConfig,
        None,
        ["loss.contrastive.name=smoothap", "loss.distill=false", "loss.contrastive.params.tau=0.02"],
    )
    assert resume_changes(saved, to_dict(same), [], "state.json") == {}
    other = load_config(
        PretrainConfig,
        None,
        ["loss.contrastive.name=smoothap", "loss.distill=false", "loss.contrastive.params.tau=0.05"],
    )
    with pytest.raises(ConfigError, match=r"loss.contrastive.params.tau: 0.02 -> 0.05"):
        resume_changes(saved, to_dict(other), [], "state.json")
    # without the migration an old config is no refusal either (the old keys are not compared)
    new = load_config(PretrainConfig, None, ["loss.distill=false"])
    assert resume_changes(old_saved("infonce"), to_dict(new), [], "state.json") == {}


def test_a_users_config_with_an_old_key_gets_one_error_naming_the_new_key():
    tree = {"loss": {"contrastive": {"name": "smoothap", "smoothap_tau": 0.02}}}
    with pytest.raises(
        ConfigError, match=r"my.yaml: config key 'loss.contrastive.smoothap_tau' .* loss.contrastive.params.tau"
    ):
        refuse_moved_contrastive(tree, "my.yaml")
    with pytest.raises(
        ConfigError, match=r"'loss.contrastive.margin' .* loss.contrastive.params.margin \(.*triplet/triplet_sh"
    ):
        refuse_moved_contrastive({"loss": {"contrastive": {"margin": 0.3}}}, "command line")
    refuse_moved_contrastive({"loss": {"contrastive": {"params": {"tau": 0.02}}}}, "my.yaml")  # the new key: fine
    with pytest.raises(ConfigError, match="'loss.contrastive.smoothap_tau'"):  # loading it fails, naming the key
        load_config(PretrainConfig, None, ["loss.contrastive.smoothap_tau=0.02"])


def test_smoothap_temperature_must_be_positive():
    cfg = load_config(
        PretrainConfig,
        None,
        ["loss.contrastive.name=smoothap", "loss.distill=false", "loss.contrastive.params.tau=0.03"],
    )
    assert build_loss(cfg.loss.contrastive).hyperparameters() == {"tau": 0.03}
    with pytest.raises(ConfigError, match=r"'loss.contrastive.params.tau': got 0.0, expected > 0"):
        load_config(
            PretrainConfig,
            None,
            ["loss.contrastive.name=smoothap", "loss.distill=false", "loss.contrastive.params.tau=0"],
        )


def test_the_hooks_migrate_every_saved_config_and_refuse_every_users_tree(tmp_path):
    """Where configs are read: ``from_dict`` (checkpoints) and a resumed run's ``config.yaml`` are
    migrated without the caller asking; a YAML file, overrides and ``apply_overrides`` refuse the old
    keys naming the new ones."""
    from vlp.config import apply_overrides
    from vlp.runs.training.run_dir import compare_with_saved

    cfg = from_dict(PretrainConfig, old_saved("smoothap", smoothap_tau=0.02))  # not migrated by the caller
    assert build_loss(cfg.loss.contrastive).hyperparameters() == {"tau": 0.02}
    yaml = tmp_path / "my.yaml"
    yaml.write_text("loss:\n  contrastive:\n    name: smoothap\n    smoothap_tau: 0.02\n")
    with pytest.raises(ConfigError, match=r"my.yaml: config key 'loss.contrastive.smoothap_tau' .*params.tau"):
        load_config(PretrainConfig, yaml)
    with pytest.raises(ConfigError, match=r"^command-line override: config key 'loss.contrastive.margin'"):
        load_config(PretrainConfig, None, ["loss.contrastive.margin=0.3"])
    with pytest.raises(ConfigError, match=r"^command-line override: config key 'loss.contrastive.margin'"):
        apply_overrides(PretrainConfig(), ["loss.contrastive.margin=0.3"])
    run = tmp_path / "run"
    run.mkdir()
    import yaml as pyyaml

    (run / "config.yaml").write_text(pyyaml.safe_dump(old_saved("smoothap", smoothap_tau=0.02)))
    args = ["loss.contrastive.name=smoothap", "loss.distill=false", f"train.resume={run}"]
    same = load_config(PretrainConfig, None, [*args, "loss.contrastive.params.tau=0.02"])
    assert compare_with_saved(same, run) == {}
    other = load_config(PretrainConfig, None, [*args, "loss.contrastive.params.tau=0.05"])
    with pytest.raises(ConfigError, match=r"loss.contrastive.params.tau: 0.02 -> 0.05"):
        compare_with_saved(other, run)

from pathlib import Path

import pytest

from mmrl.config import Config, ConfigError, load_config
from pipelines.cli import parse

CONFIGS = sorted(Path(__file__).resolve().parents[2].joinpath("configs").glob("*.yaml"))


def test_there_are_configs():
    assert CONFIGS, "configs/ holds no YAML"


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_config_loads(path):
    cfg = load_config(path)
    assert isinstance(cfg, Config)


def test_overrides_are_typed():
    cfg = load_config(None, ["rollout.n=4", "actor.lr=3e-4", "actor.use_kl_loss=true", "data.tasks={count: 1.0}"])
    assert cfg.rollout.n == 4 and cfg.actor.lr == 3e-4 and cfg.actor.use_kl_loss is True
    assert cfg.data.tasks == {"count": 1.0}


@pytest.mark.parametrize("override,message", [
    ("rollout.nn=3", r"unknown key rollout\.nn \(did you mean rollout\.n\?\).*temperature"),
    ("bogus.x=1", "unknown key bogus"),
    ("actor.loss_agg_mode=mean", "actor.loss_agg_mode='mean'.*token-mean, seq-mean-token-sum"),
    ("rollout.n=many", "rollout.n='many' must be of type int"),
    ("actor.use_kl_loss=3", "actor.use_kl_loss=3 must be of type bool"),
])
def test_bad_key_or_value_names_the_key_and_what_is_allowed(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_cross_field_checks():
    with pytest.raises(ConfigError, match="rollout.n >= 2"):
        load_config(None, ["rollout.n=1"])
    with pytest.raises(ConfigError, match="adv_estimator='ppo2'.*allowed: gae, grpo, rloo"):
        load_config(None, ["algorithm.adv_estimator=ppo2"])
    with pytest.raises(ConfigError, match="trainer.steps=0 must be a positive"):
        load_config(None, ["trainer.steps=0"])


def test_base_chain_and_missing_file(tmp_path):
    (tmp_path / "base.yaml").write_text("rollout: {n: 3}\nactor: {lr: 0.5}\n")
    (tmp_path / "child.yaml").write_text("base: base.yaml\nrollout: {temperature: 0.7}\n")
    cfg = load_config(tmp_path / "child.yaml", ["actor.lr=0.25"])
    assert (cfg.rollout.n, cfg.rollout.temperature, cfg.actor.lr) == (3, 0.7, 0.25)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_cli_exits_with_the_message_before_anything_starts(capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse("test", ["--config", "", "rollout.temprature=0.5"])
    assert "did you mean rollout.temperature" in str(exit_info.value.code)


def test_part_layouts_are_checked():
    cfg = load_config(None, ["actor.vision.strategy=fsdp", "actor.llm.strategy=hsdp", "actor.llm.shard_size=2",
                             "resources.num_workers=4", "critic.vision.freeze=true"])
    assert (cfg.actor.vision.strategy, cfg.actor.llm.shard_size, cfg.critic.vision.freeze) == ("fsdp", 2, True)
    with pytest.raises(ConfigError, match="actor.llm.strategy=hsdp needs actor.llm.shard_size dividing"):
        load_config(None, ["actor.llm.strategy=hsdp", "actor.llm.shard_size=3", "resources.num_workers=4"])
    with pytest.raises(ConfigError, match="critic.vision.strategy='zero3' is not allowed; allowed values: replicate"):
        load_config(None, ["critic.vision.strategy=zero3"])
    with pytest.raises(ConfigError, match="critic.placement='gpu0'"):
        load_config(None, ["critic.placement=gpu0"])


def test_gae_needs_the_critic_and_not_groups():
    cfg = load_config(None, ["algorithm.adv_estimator=gae", "rollout.n=1"])
    assert cfg.uses_critic
    assert not load_config(None, []).uses_critic

import dataclasses
import typing
from pathlib import Path

import pytest

from mmrl.algos import build_algorithm
from mmrl.config import Config, ConfigError, load_config, resolve, to_dict
from mmrl.run_config import load_run_config, prepare_run_config
from pipelines.cli import parse

ROOT = Path(__file__).resolve().parents[2]

CONFIGS = sorted(ROOT.joinpath("configs").glob("*.yaml"))


def test_there_are_configs():
    assert CONFIGS, "configs/ holds no YAML"


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_config_loads(path):
    cfg = load_run_config(path)
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
        load_run_config(None, ["rollout.n=1"])
    with pytest.raises(ConfigError, match="algorithm.name='ppo2' is unknown; allowed: dapo, dr_grpo, grpo, grpo_pass_k, gspo, opo, otb, pf_ppo, ppo, reinforce_plus_plus"):
        load_run_config(None, ["algorithm.name=ppo2"])
    with pytest.raises(ConfigError, match="algorithm.adv_estimator was renamed: use algorithm.name"):
        load_run_config(None, ["algorithm.adv_estimator=gae"])
    with pytest.raises(ConfigError, match="actor.loss.policy='clip' is unknown; allowed: cispo, clip_cov, dppo_kl, dppo_tv, dual_clip, gmpo, gpg, gspo, kl_cov, ppo_clip, sapo, sppo"):
        load_run_config(None, ["actor.loss.policy=clip"])
    with pytest.raises(ConfigError, match="rollout.engine='sglang' is unknown; allowed: hf"):
        load_run_config(None, ["rollout.engine=sglang"])
    with pytest.raises(ConfigError, match="critic.num_mini_batches=64 mini-batches"):
        load_run_config(None, ["critic.num_mini_batches=64", "trainer.prompts_per_step=2", "rollout.n=8"])
    with pytest.raises(ConfigError, match="trainer.eval_every=0 evaluates only at the last: set trainer.eval_every"):
        load_run_config(None, ["trainer.stop_val_acc=0.9", "trainer.eval_every=0"])


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


def test_validation_reads_the_algorithm_declarations():
    """PPO declares a critic and no group size, so n=1 is fine; GRPO and RLOO declare groups of 2."""
    for name in ("grpo", "rloo"):
        with pytest.raises(ConfigError, match=f"rollout.n=1: {name} compares.*rollout.n >= 2"):
            load_run_config(None, [f"algorithm.name={name}", "rollout.n=1"])
    cfg = load_run_config(None, ["algorithm.name=ppo", "rollout.n=1"])
    assert build_algorithm(cfg).needs_critic and not build_algorithm(load_run_config(None, [])).needs_critic


@pytest.mark.parametrize("override,message", [
    ("actor.lr=-1e-4", "actor.lr=-0.0001 must be >= 0"),
    ("critic.lr=-1", "critic.lr=-1.0 must be >= 0"),
    ("sft.lr=nan", "sft.lr=nan must be a finite number"),
    ("actor.grad_clip=0", "actor.grad_clip=0.0 must be > 0"),
    ("critic.grad_clip=-1", "critic.grad_clip=-1.0 must be > 0"),
    ("rollout.temperature=.nan", "rollout.temperature=nan must be a finite number"),
    ("rollout.temperature=0", "rollout.temperature=0.0 must be > 0"),
    ("rollout.top_p=1.5", "rollout.top_p=1.5 must be <= 1"),
    ("algorithm.epsilon=0", "algorithm.epsilon=0.0 must be > 0"),
    ("actor.clip_ratio_low=0", "actor.clip_ratio_low=0.0 must be > 0"),
    ("actor.clip_ratio_high=1.5", "actor.clip_ratio_high=1.5 must be <= 1"),
    ("sft.steps=0", "sft.steps=0 must be >= 1"),
    ("trainer.val_size=0", "trainer.val_size=0 must be >= 1"),
    ("trainer.steps=0", "trainer.steps=0 must be >= 1"),
    ("critic.ppo_epochs=0", "critic.ppo_epochs=0 must be >= 1"),
    ("critic.micro_batch_size=-1", "critic.micro_batch_size=-1 must be >= 0"),
    ("critic.num_mini_batches=0", "critic.num_mini_batches=0 must be >= 1"),
    ("critic.cliprange_value=0", "critic.cliprange_value=0.0 must be > 0"),
    ("algorithm.gamma=1.1", "algorithm.gamma=1.1 must be <= 1"),
    ("reward.timeout_s=0", "reward.timeout_s=0.0 must be > 0"),
    ("tiny_model.hidden_size=0", "tiny_model.hidden_size=0 must be >= 8"),
    ("data.min_pixels=1000000", "data.min_pixels=1000000 exceeds data.max_pixels"),
    ("data.sizes={train: -1}", r"data.sizes values must be finite and >= 0, got \{'train': -1\}"),
    ("reward.weights={answer_match: .inf}", "reward.weights values must be finite"),
])
def test_bad_numbers_are_refused_with_the_key_and_the_range(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_every_numeric_field_has_bounds_and_the_defaults_meet_them():
    """A numeric key without bounds would accept a negative lr or a NaN temperature silently."""
    def numeric_fields(cls, prefix=""):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if dataclasses.is_dataclass(hints[f.name]):
                yield from numeric_fields(hints[f.name], f"{prefix}{f.name}.")
            elif hints[f.name] in (int, float):
                yield f"{prefix}{f.name}", f.metadata.get("bounds")

    bounds = dict(numeric_fields(Config))
    unbounded = [key for key, b in bounds.items() if b is None]
    assert not unbounded, f"numeric config keys without bounds: {unbounded}"
    assert len(bounds) > 40 and "critic.micro_batch_size" in bounds
    load_config(None, [])  # the defaults pass their own bounds


def test_old_log_probs_from_the_rollout_need_the_untruncated_distribution() -> None:
    load_config(None, ["actor.old_log_probs=rollout"])
    for bad in ("rollout.top_p=0.9", "rollout.top_k=5"):
        with pytest.raises(ConfigError, match="actor.old_log_probs=rollout needs rollout.top_p=1"):
            load_config(None, ["actor.old_log_probs=rollout", bad])


def test_algorithm_family_cross_field_checks():
    with pytest.raises(ConfigError, match="sppo policy loss is one term per sequence"):
        load_run_config(None, ["algorithm.name=sppo"])
    cfg = load_run_config(None, ["algorithm.name=sppo", "actor.loss_agg_mode=seq-mean-token-mean"])
    assert cfg.actor.loss.policy == "" and cfg.algorithm.name == "sppo"
    with pytest.raises(ConfigError, match="grpo trains no critic; use ppo, vapo, pf_ppo"):
        load_run_config(None, ["algorithm.critic_warmup_steps=3"])
    with pytest.raises(ConfigError,
                       match="algorithm.pf_ppo.filter_k belongs to pf_ppo: algorithm.name=grpo does not read"):
        load_run_config(None, ["algorithm.pf_ppo.filter_k=2"])
    load_run_config(None, ["algorithm.name=pf_ppo", "algorithm.pf_ppo.filter_k=2"])
    with pytest.raises(ConfigError, match="actor.loss.policy=sppo reads win_rates"):
        load_run_config(None, ["actor.loss.policy=sppo", "actor.loss_agg_mode=seq-mean-token-mean"])
    assert load_run_config(None, ["algorithm.name=vapo", "algorithm.critic_warmup_steps=3"]).algorithm.critic_warmup_steps == 3
    # seq-mean-token-sum-norm's constant defaults to the longest response, and can be set
    assert load_run_config(None, ["rollout.max_new_tokens=12"]).actor.loss_horizon == 12
    assert load_run_config(None, ["rollout.max_new_tokens=12", "actor.loss_horizon=40"]).actor.loss_horizon == 40
    with pytest.raises(ConfigError, match="actor.loss.dual_clip.clip_ratio_c"):
        load_run_config(None, ["actor.loss.dual_clip.clip_ratio_c=1.0"])


def test_a_bad_judge_engine_is_named_by_its_own_key():
    with pytest.raises(ConfigError, match="reward.judge.engine='sglang' is unknown; allowed: hf"):
        load_run_config(None, ["reward.judge.engine=sglang"])
    assert load_run_config(None, ["reward.judge.engine=hf"]).reward.judge.engine == "hf"


def test_given_keys_are_the_yaml_chain_and_the_overrides_and_no_config_key(tmp_path):
    (tmp_path / "base.yaml").write_text("rollout: {n: 3}\ndata: {tasks: {count: 1.0}}\n")
    (tmp_path / "child.yaml").write_text("base: base.yaml\nactor: {vision: {freeze: true}}\n")
    cfg = load_config(tmp_path / "child.yaml", ["algorithm.pf_ppo.filter_k=2", "seed=3"])
    assert cfg.given_keys == {"rollout.n", "data.tasks", "actor.vision.freeze", "algorithm.pf_ppo.filter_k", "seed"}
    assert load_run_config(tmp_path / "child.yaml").given_keys == {"rollout.n", "data.tasks", "actor.vision.freeze"}
    assert Config().given_keys == frozenset() and "given_keys" not in to_dict(cfg)
    with pytest.raises(ConfigError, match="unknown key given_keys"):
        load_config(None, ["given_keys=[rollout.n]"])


def test_validation_does_not_write_and_resolve_returns_a_new_config():
    loaded = load_config(None, ["trainer.steps=7", "actor.ppo_epochs=3", "rollout.max_new_tokens=12",
                                "critic.loss_horizon=5"])
    before = to_dict(loaded)
    loaded.check()
    assert to_dict(loaded) == before and loaded.actor.loss_horizon == 0 and loaded.actor.decay_steps == 0
    resolved = resolve(loaded)
    assert to_dict(loaded) == before  # the input is untouched
    assert (resolved.actor.loss_horizon, resolved.actor.decay_steps) == (12, 7 * 2 * 3)
    assert (resolved.critic.loss_horizon, resolved.critic.decay_steps) == (5, 7 * 2 * 1)  # a value set is kept
    assert resolve(resolved) == resolved and prepare_run_config(resolved) == resolved
    resolved.actor.vision.freeze = True  # the new config shares no section with the old one
    assert loaded.actor.vision.freeze is False
    loaded.trainer.steps = 40  # changed before resolution: the derived value follows
    assert resolve(loaded).actor.decay_steps == 40 * 2 * 3
    assert resolve(loaded).given_keys == loaded.given_keys


def test_stages_build_their_configs_with_overrides_so_derived_values_follow():
    """make gpu-check runs 10 steps: its cosine spans 10 steps' updates (it spanned the demo's 400 before);
    bench-peer's response length sets the loss horizon."""
    from benchmarks.peer import peer_overrides
    from pipelines.cli import Command
    from benchmarks.gpu_check import check_overrides

    command = Command(str(ROOT / "configs/demo.yaml"), ("resources.device=cpu",))
    small = command.load(*check_overrides(command.load()))
    assert small.trainer.steps == 10 and small.actor.decay_steps == 10 * small.actor.num_mini_batches
    peer = command.load(*peer_overrides(2, 2, 24, 1))
    assert (peer.rollout.max_new_tokens, peer.actor.loss_horizon, peer.actor.decay_steps) == (24, 24, 4)

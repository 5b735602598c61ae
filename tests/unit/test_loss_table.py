"""The loss table and the algorithm table are the single source of their config sections and their rules: each
loss's section appears under ``actor.loss`` and each algorithm's under ``algorithm`` (in the config and in its
reference), a section set for a loss or an algorithm the run does not read is refused naming its owner, and the
flat keys they replace are refused naming the new key."""

from __future__ import annotations

import dataclasses
import re
import typing
from dataclasses import dataclass

import pytest
import torch

from mmrl.algos import ALGORITHMS
from mmrl.algos.losses import LOSSES, LossSpec, extra_losses, policy_losses
from mmrl.algos.losses.gpg import gpg_loss
from mmrl.algos.losses.spec import agg_settings
from mmrl.config import RENAMED, ActorConfig, AlgorithmConfig, Config, LossConfig, LossKeys, load_config
from mmrl.config_fields import ConfigError, gather_sections, num
from mmrl.run_config import load_run_config
from pipelines import docs


def sections_of(cls: type) -> dict[str, type]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if dataclasses.is_dataclass(hints[f.name])}


def test_each_loss_and_each_algorithm_with_keys_has_its_section_and_nothing_else_does():
    assert sections_of(LossConfig) == {name: spec.section for name, spec in LOSSES.items() if spec.section}
    assert [f.name for f in dataclasses.fields(LossConfig)] == ["policy", *sections_of(LossConfig)]
    assert sections_of(AlgorithmConfig) == {name: cls.section for name, cls in ALGORITHMS.items() if cls.section}
    assert typing.get_type_hints(ActorConfig)["loss"] is LossConfig
    assert typing.get_type_hints(Config)["algorithm"] is AlgorithmConfig
    keys = {key.name for section in docs.walk() for key in section.keys}
    for name, spec in LOSSES.items():
        assert spec.name == name and set(spec.section_keys()) <= keys, name
    for name, cls in ALGORITHMS.items():
        own = {f"algorithm.{name}.{f.name}" for f in dataclasses.fields(cls.section)} if cls.section else set()
        assert own <= keys, name


def test_the_specs_say_what_the_old_tables_said():
    """The six tables a loss was written into before, read back from the one table."""
    assert set(policy_losses()) == {"ppo_clip", "dual_clip", "gspo", "sppo", "cispo", "sapo", "gmpo", "gpg",
                                    "clip_cov", "kl_cov", "dppo_tv", "dppo_kl"}
    assert set(extra_losses()) == {"positive_lm"}
    assert {name for name, spec in LOSSES.items() if spec.linear} == {
        "ppo_clip", "dual_clip", "gspo", "cispo", "sapo", "gpg", "dppo_tv", "dppo_kl"}
    assert {name for name, spec in LOSSES.items() if spec.sequence_agg} == {"sppo", "gmpo"}
    assert {name: spec.fields for name, spec in LOSSES.items() if spec.fields} == {
        "sppo": ("win_rates",), "positive_lm": ("correct",)}


@dataclass(kw_only=True)
class _ScaledConfig:
    """A made-up loss."""

    scale: float = num(2.0, gt=0)
    """What the gradient is multiplied by."""


def _scaled_gpg(logp, old_logp, advantages, mask, *, scale, **aggregation):
    return gpg_loss(logp, old_logp, scale * advantages, mask, **aggregation)


# What mmrl.config does with the table, on the table plus one more spec (a new module's SPEC and its line).
_SCALED = LossSpec("scaled", _scaled_gpg, section=_ScaledConfig,
                   settings=lambda actor, own: {"scale": own.scale, **agg_settings(actor)})
_LossPlus = gather_sections("_LossPlus", {name: spec.section for name, spec in {**LOSSES, "scaled": _SCALED}.items()},
                            LossKeys, __name__)


@dataclass(kw_only=True)
class _ActorPlus(ActorConfig):
    loss: _LossPlus = dataclasses.field(default_factory=_LossPlus)


@dataclass(kw_only=True)
class _ConfigPlus(Config):
    actor: _ActorPlus = dataclasses.field(default_factory=_ActorPlus)


def test_a_new_loss_is_its_spec_and_one_table_line():
    """A spec added to the table: its section appears under actor.loss, bounded and documented, and the spec calls
    its function with its settings."""
    text = docs.render(_ConfigPlus)
    row = next(line for line in text.splitlines() if line.startswith("| `actor.loss.scaled.scale` |"))
    assert "`2.0`" in row and "> 0" in row and "What the gradient is multiplied by." in row
    assert "A made-up loss." in text and _SCALED.section_keys() == ("actor.loss.scaled.scale",)
    actor = _ActorPlus(loss=_LossPlus(scaled=_ScaledConfig(scale=3.0)))
    logp, old = torch.tensor([[-0.5, -1.0]]), torch.tensor([[-0.6, -0.9]])
    adv, mask = torch.tensor([[1.0, 1.0]]), torch.ones(1, 2)
    loss, _ = _SCALED(logp, old, adv, mask, cfg=actor)
    assert float(loss) == pytest.approx(float(gpg_loss(logp, old, 3.0 * adv, mask)[0]))


OLD_KEYS = {old: new for old, new in RENAMED.items() if " " not in new}  # the renames to one key


def test_every_flat_key_of_a_loss_an_algorithm_or_a_task_is_renamed_to_a_real_key():
    assert len(OLD_KEYS) == 30  # 17 of the losses (actor.policy_loss among them), 5 of the algorithms, 8 of zoom
    config = Config()
    for new in OLD_KEYS.values():
        node = config
        for part in new.split("."):
            node = getattr(node, part)  # the new key exists


@pytest.mark.parametrize("old", sorted(OLD_KEYS))
def test_an_old_flat_key_fails_naming_its_new_key(old, tmp_path):
    message = f"^{re.escape(old)} was renamed: use {re.escape(OLD_KEYS[old])}$"
    with pytest.raises(ConfigError, match=message):
        load_config(None, [f"{old}=1"])  # on the command line
    section, key = old.split(".")
    (tmp_path / "old.yaml").write_text(f"{section}: {{{key}: 1}}\n")
    with pytest.raises(ConfigError, match=message):
        load_config(tmp_path / "old.yaml")  # in a YAML file


@pytest.mark.parametrize(("overrides", "message"), [
    (["actor.loss.kl_cov.ratio=0.1"],
     r"^actor.loss.kl_cov.ratio \(the kl_cov loss's\): actor.loss.policy=ppo_clip does not read it; remove it or "
     r"choose that loss$"),
    (["actor.loss.policy=sapo", "actor.loss.cispo.clip_low=0.5", "actor.loss.sapo.tau_pos=2"],
     r"^actor.loss.cispo.clip_low \(the cispo loss's\): actor.loss.policy=sapo does not read it"),
    (["actor.loss.dual_clip.clip_ratio_c=2"], r"^actor.loss.dual_clip.clip_ratio_c \(the dual_clip loss's\)"),
    (["algorithm.name=grpo", "actor.loss.sppo.eta=2"], r"^actor.loss.sppo.eta \(the sppo loss's\)"),
    (["actor.loss.positive_lm.coef=0.1"],
     r"^actor.loss.positive_lm.coef belongs to vapo: algorithm.name=grpo does not read it"),
    (["algorithm.vapo.lam_alpha=1"], r"^algorithm.vapo.lam_alpha belongs to vapo: algorithm.name=grpo"),
    (["algorithm.name=ppo", "algorithm.grpo_pass_k.k=2"], r"^algorithm.grpo_pass_k.k belongs to grpo_pass_k: "),
])
def test_a_section_of_another_loss_or_algorithm_fails_naming_its_owner(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_run_config(None, overrides)


def test_a_loss_or_an_algorithm_reads_its_own_section():
    cfg = load_run_config(None, ["actor.loss.policy=kl_cov", "actor.loss.kl_cov.ratio=0.1"])
    assert cfg.actor.loss.kl_cov.ratio == 0.1 and cfg.actor.loss.policy == "kl_cov"
    cfg = load_run_config(None, ["algorithm.name=vapo", "algorithm.vapo.lam_alpha=1",
                                 "actor.loss.positive_lm.coef=0.1"])
    assert (cfg.algorithm.vapo.lam_alpha, cfg.actor.loss.positive_lm.coef) == (1.0, 0.1)
    with pytest.raises(ConfigError, match="actor.loss.clip_cov.lb=2.0 must be below actor.loss.clip_cov.ub=1.0"):
        load_config(None, ["actor.loss.clip_cov.lb=2", "actor.loss.clip_cov.ub=1"])
    with pytest.raises(ConfigError, match=r"actor.loss.cispo.clip_low=2.0 must be <= 1"):
        load_config(None, ["actor.loss.cispo.clip_low=2"])
    with pytest.raises(ConfigError, match=r"unknown key actor.loss.kl_cov.rate \(did you mean actor.loss.kl_cov.ratio"):
        load_config(None, ["actor.loss.kl_cov.rate=0.1"])


def test_an_algorithm_declares_its_own_config_check():
    """grpo_pass_k's k against rollout.n is its class's check, not a branch on its name in the checks."""
    with pytest.raises(ConfigError, match=r"^algorithm.grpo_pass_k.k=9 exceeds rollout.n=8"):
        load_run_config(None, ["algorithm.name=grpo_pass_k", "algorithm.grpo_pass_k.k=9"])
    load_run_config(None, ["algorithm.name=grpo_pass_k", "algorithm.grpo_pass_k.k=8"])
    checks = open(docs.ROOT / "mmrl" / "algos" / "checks.py").read()
    assert not any(f'"{name}"' in checks for name in ALGORITHMS)

"""What the algorithms declare to the config checks and the actor: the config keys each owns, the loss terms
of a run and the batch fields they read."""

from __future__ import annotations

from pathlib import Path

import pytest

from mmrl.algos import (ALGORITHMS, ActorLoss, check_key_ownership, check_loss_fields, critic_algorithms,
                        key_owners, policy_loss)
from mmrl.algos.losses import LOSSES, extra_losses, policy_losses
from mmrl.config import Config, _read_yaml_chain, load_config

OWNERS = {
    "algorithm.norm_adv_by_std": ["grpo", "dapo", "gspo"],
    "algorithm.epsilon": ["grpo", "dapo", "gspo", "grpo_pass_k"],
    "algorithm.gamma": ["ppo", "reinforce_plus_plus", "vapo", "pf_ppo"],
    "algorithm.lam": ["ppo", "pf_ppo"],
    "algorithm.critic_warmup_steps": ["ppo", "vapo", "pf_ppo"],
    "algorithm.max_gen_rounds": ["dapo", "vapo"],
    "algorithm.vapo.lam_critic": ["vapo"],
    "algorithm.vapo.lam_alpha": ["vapo"],
    "actor.loss.positive_lm.coef": ["vapo"],
    "algorithm.pf_ppo.filter_mode": ["pf_ppo"],
    "algorithm.pf_ppo.filter_k": ["pf_ppo"],
    "algorithm.grpo_pass_k.k": ["grpo_pass_k"],
    "algorithm.otb.epsilon": ["otb"],
    "algorithm.otb.zero_tail": ["otb"],
}


def test_each_algorithm_owns_the_keys_it_reads_along_its_class_hierarchy():
    assert key_owners() == OWNERS
    config = Config()
    for key in OWNERS:  # every owned key is a real one
        *sections, name = key.split(".")
        node = config
        for section in sections:
            node = getattr(node, section)
        assert hasattr(node, name), key


@pytest.mark.parametrize(("name", "given", "message"), [
    ("grpo", {"algorithm.pf_ppo.filter_k"}, r"^algorithm.pf_ppo.filter_k belongs to pf_ppo: algorithm.name=grpo does "
                                            r"not read it; remove it, or set algorithm.name to an owner$"),
    ("grpo", {"algorithm.pf_ppo.filter_mode", "actor.lr"}, r"^algorithm.pf_ppo.filter_mode belongs to pf_ppo: "),
    ("ppo", {"algorithm.max_gen_rounds"}, r"^algorithm.max_gen_rounds belongs to dapo, vapo: algorithm.name=ppo"),
    ("grpo", {"algorithm.vapo.lam_alpha"}, r"^algorithm.vapo.lam_alpha belongs to vapo: "),
    ("grpo", {"algorithm.grpo_pass_k.k"}, r"^algorithm.grpo_pass_k.k belongs to grpo_pass_k: "),
    ("grpo", {"actor.loss.positive_lm.coef", "algorithm.critic_warmup_steps"},
     r"^actor.loss.positive_lm.coef belongs to vapo; algorithm.critic_warmup_steps belongs to ppo, vapo, pf_ppo: "
     r"algorithm.name=grpo does not read them; remove them"),
    ("vapo", {"algorithm.lam"}, r"^algorithm.lam belongs to ppo, pf_ppo: algorithm.name=vapo"),
    ("dr_grpo", {"algorithm.norm_adv_by_std"}, r"^algorithm.norm_adv_by_std belongs to grpo, dapo, gspo: "),
])
def test_a_key_of_another_algorithm_is_refused_with_its_owners(name, given, message):
    with pytest.raises(ValueError, match=message):
        check_key_ownership(name, given)


def test_the_owners_and_the_common_keys_pass():
    check_key_ownership("vapo", {"algorithm.max_gen_rounds", "algorithm.critic_warmup_steps",
                                 "algorithm.vapo.lam_alpha", "algorithm.gamma", "actor.loss.positive_lm.coef",
                                 "algorithm.name", "actor.lr"})
    check_key_ownership("pf_ppo", {"algorithm.pf_ppo.filter_k", "algorithm.pf_ppo.filter_mode", "algorithm.lam"})
    check_key_ownership("grpo", {"algorithm.name", "algorithm.use_kl_in_reward", "algorithm.kl_coef",
                                 "actor.loss.dual_clip.clip_ratio_c", "critic.lr", "rollout.n"})
    check_key_ownership("grpo", set())


def yaml_keys(tree: dict, prefix: str = "") -> set[str]:
    keys = set()
    for key, value in tree.items():
        keys |= yaml_keys(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}"}
    return keys


@pytest.mark.parametrize("path", sorted(Path("configs").rglob("*.yaml")), ids=str)
def test_every_config_sets_only_keys_its_algorithm_owns(path):
    raw = _read_yaml_chain(path)
    check_key_ownership(raw.get("algorithm", {}).get("name", "grpo"), yaml_keys(raw))


def test_a_runs_loss_terms_come_from_the_algorithm_and_the_actor_config():
    vapo = load_config(None, ["algorithm.name=vapo", "actor.loss.positive_lm.coef=0.1"])
    assert policy_loss(vapo) == ActorLoss("ppo_clip", (("positive_lm", 0.1),))
    assert policy_loss(vapo).fields == ("correct",)
    assert policy_loss(load_config(None, ["algorithm.name=vapo"])) == ActorLoss("ppo_clip")  # coefficient 0: off
    sppo = load_config(None, ["algorithm.name=sppo", "actor.loss_agg_mode=seq-mean-token-mean"])
    assert policy_loss(sppo) == ActorLoss("sppo") and policy_loss(sppo).fields == ("win_rates",)
    gspo = load_config(None, ["algorithm.name=grpo", "actor.loss.policy=gspo"])
    assert policy_loss(gspo) == ActorLoss("gspo") and policy_loss(gspo).fields == ()


def test_a_loss_that_reads_a_field_the_algorithm_does_not_compute_is_refused():
    with pytest.raises(ValueError, match=r"actor.loss.policy=sppo reads win_rates, which algorithm.name=grpo does "
                                         r"not compute; use algorithm.name=sppo, or another actor.loss.policy"):
        check_loss_fields("grpo", ActorLoss("sppo"))
    with pytest.raises(ValueError, match="unknown"):
        ActorLoss("clip")
    with pytest.raises(ValueError, match="unknown"):
        ActorLoss("ppo_clip", (("positive", 1.0),))


def test_each_algorithms_loss_fields_are_what_its_own_loss_terms_read():
    for name, cls in ALGORITHMS.items():
        own = ActorLoss(cls.policy_loss, tuple((extra, 1.0) for extra in cls.extra_losses))
        assert own.fields == cls.loss_fields, name
        assert set(cls.extra_losses) <= set(extra_losses()), name


def test_the_tables_name_the_critic_algorithms_and_the_sequence_level_losses():
    assert critic_algorithms() == ["ppo", "vapo", "pf_ppo"]
    sequence_level = {name for name, spec in LOSSES.items() if spec.sequence_agg}
    assert sequence_level == {"sppo", "gmpo"} and sequence_level <= set(policy_losses())

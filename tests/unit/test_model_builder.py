"""build_model: the one load -> wrap -> freeze -> lay out sequence, per role."""

import pytest
import torch

from mmrl.config import load_config
from mmrl.models.forward import PolicyForward, ValueModel
from mmrl.models.loading import load_model
from mmrl.workers.model_builder import build_model

CPU = torch.device("cpu")


def test_roles_wrap_freeze_and_lay_out(tiny_model_dir):
    cfg = load_config(None, ["actor.vision.freeze=true", "actor.llm.strategy=fsdp"])
    hf = load_model(tiny_model_dir)
    actor = build_model(cfg, "actor", str(tiny_model_dir), device=CPU, distributed=False)
    assert isinstance(actor.root, PolicyForward) and actor.root.training
    # distributed=False keeps every part replicated whatever the config says (no process group).
    assert not actor.is_sharded and not actor.sharded
    vision = {id(p) for p in actor.root.core.visual.parameters()}
    trainable = {id(p) for p in actor.trainable()}
    assert trainable and not (vision & trainable)
    assert len(trainable) == sum(1 for _ in hf.parameters()) - len(vision)
    assert torch.equal(actor.root.model.lm_head.weight, hf.lm_head.weight)  # the checkpoint's weights

    reference = build_model(cfg, "reference", str(tiny_model_dir), device=CPU, distributed=False)
    assert not reference.trainable() and not reference.root.training
    assert not any(p.requires_grad for p in reference.root.parameters())

    critic = build_model(cfg, "critic", str(tiny_model_dir), device=CPU, distributed=False)
    assert isinstance(critic.root, ValueModel) and not hasattr(critic.root.core, "lm_head")
    assert not critic.root.value_head.weight.detach().any()
    assert all(p.requires_grad for p in critic.root.core.visual.parameters())  # critic.vision is not frozen
    with pytest.raises(ValueError, match="unknown model role 'lora'; allowed: actor, reference, critic, reward_model"):
        build_model(cfg, "lora", str(tiny_model_dir), device=CPU)  # type: ignore[arg-type]

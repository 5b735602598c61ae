"""The trainer's worker groups: the actor-rollout-ref group, and the critic, reward-model and judge groups the run
needs, each colocated on the actor's pool or on its own (``<group>.placement``)."""

from __future__ import annotations

from dataclasses import dataclass

from mmrl.config import Config
from mmrl.controller import ResourcePool, WorkerGroup
from mmrl.controller.session import ensure_ray
from mmrl.controller.worker import resolve_device
from mmrl.models.loading import load_processor
from mmrl.trainer.sources import RolloutSource
from mmrl.workers.judge import JudgeWorker
from mmrl.workers.reward_model import RewardModelWorker


@dataclass
class TrainerGroups:
    actor: WorkerGroup
    """The actor-rollout-ref group (its ranks hold the rollout engine when the source says so)."""
    others: dict[str, WorkerGroup]
    """The groups beside it, by name: ``critic``, ``reward_model``, ``judge``, those the run has."""

    @classmethod
    def build(cls, cfg: Config, checkpoint: str, with_reference: bool, with_critic: bool, source: RolloutSource,
              actor: type, critic: type) -> TrainerGroups:
        """Start the groups: ``actor`` and ``critic`` are their worker classes; the source sizes the workers (its
        own pool, when it has one, runs beside them) and says whether the actor's ranks hold the engine."""
        res, timeout = cfg.resources, cfg.trainer.step_timeout_s
        ensure_ray(res)
        use_gpu = resolve_device(res.device).type == "cuda"
        # Each group beside the actor's: (name, worker class, placement, checkpoint).
        extra = [(name, worker, placement, path) for name, worker, placement, path, wanted in (
            ("critic", critic, cfg.critic.placement, cfg.critic.init or checkpoint, with_critic),
            ("reward_model", RewardModelWorker, cfg.reward.model.placement, cfg.reward.model.path,
             bool(cfg.reward.model.path)),
            ("judge", JudgeWorker, cfg.reward.judge.placement, cfg.reward.judge.path, bool(cfg.reward.judge.path)),
        ) if wanted]
        separate = [e for e in extra if e[2] == "separate"]
        cpus, threads = source.worker_shape(res, use_gpu, pools=1 + len(separate))
        pool = ResourcePool(res.num_workers, cpus, use_gpu, name="actor_rollout_ref", reuse=res.reuse_workers)
        colocated = 1 + len(extra) - len(separate)
        group = dict(threads=threads, device=res.device, timeout_s=timeout)
        workers = WorkerGroup(actor, pool, share=1.0 / colocated, **group)
        workers.init_model(cfg, checkpoint, with_reference, with_rollout=source.holds_engine)
        others: dict[str, WorkerGroup] = {}
        for name, worker, placement, path in extra:
            own = placement == "separate"
            own_pool = (ResourcePool(res.num_workers, cpus, use_gpu, name=name, reuse=res.reuse_workers)
                        if own else pool)
            others[name] = WorkerGroup(worker, own_pool, share=1.0 if own else 1.0 / colocated, **group)
            others[name].init_model(cfg, path)
        return cls(workers, others)


def check_same_tokenizer(policy: str, reward_model: str) -> None:
    """The reward model reads the policy's token ids, so both must share one vocabulary."""
    ours, theirs = (load_processor(path).tokenizer.get_vocab() for path in (policy, reward_model))
    if ours != theirs:
        raise ValueError(f"reward.model.path={reward_model} has a different tokenizer from the policy at {policy} "
                         f"({len(theirs)} vs {len(ours)} tokens, or the same sizes with other ids); train the "
                         "reward model from the policy's checkpoint (make rm, rm.init)")

"""The sections of a model's updates: the optimizer (SFT, reward-model training, RL), the actor with its loss
(``actor.loss``, built from the loss table) and the critic."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from mmrl.algos.losses import LOSSES
from mmrl.config.model import LoRAConfig, PartConfig, VisionPartConfig
from mmrl.config_fields import auto_size, gather_sections, num


@dataclass(kw_only=True)
class OptimConfig:
    """The optimizer of a single-process supervised stage (make sft, make rm)."""

    steps: int = num(60, ge=1)
    batch_size: int = num(16, ge=1)
    lr: float = num(2e-3, ge=0)
    weight_decay: float = num(0.0, ge=0)
    warmup_steps: int = num(5, ge=0)
    lr_schedule: Literal["constant", "cosine"] = "constant"
    """After the warm-up: constant, or a cosine decay to ``min_lr_ratio * lr`` over the ``steps``."""
    min_lr_ratio: float = num(0.0, ge=0, le=1)
    grad_clip: float = num(1.0, gt=0)
    """Gradient-norm clip (a very large value turns clipping off)."""


@dataclass(kw_only=True)
class SFTConfig(OptimConfig):
    init: str = ""
    """Checkpoint to start from; empty means ``model.path``."""
    split: str = "sft"
    """The labelled split to train on."""
    out_dir: str = "outputs/sft"
    """Where the checkpoint (``<out_dir>/checkpoint``) is written."""


@dataclass(kw_only=True)
class UpdateConfig:
    """What the actor and the critic share: the optimizer, the mini-batch loop and the layout."""

    lr: float = num(1e-4, ge=0)
    weight_decay: float = num(0.0, ge=0)
    warmup_steps: int = num(10, ge=0)
    lr_schedule: Literal["constant", "cosine"] = "constant"
    """After the warm-up: constant, or a cosine decay to ``min_lr_ratio * lr`` at the run's last update."""
    min_lr_ratio: float = num(0.0, ge=0, le=1)
    decay_steps: int = num(0, ge=0)
    """Optimizer steps the cosine spans; 0: the whole run (trainer.steps x num_mini_batches x ppo_epochs),
    filled in by :func:`resolve`."""
    grad_clip: float = num(1.0, gt=0)
    """Gradient-norm clip (a very large value turns clipping off)."""
    ppo_epochs: int = num(1, ge=1)
    """Passes over each step's batch."""
    num_mini_batches: int = num(2, ge=1)
    """Optimizer steps per epoch (the batch is split into this many mini-batches)."""
    micro_batch_size: int = auto_size()
    """Sequences per forward/backward (gradient accumulation inside a mini-batch), in the update and the
    no-grad passes (log-probs, values); 0/auto: by ``max_tokens_per_micro``."""
    max_tokens_per_micro: int = auto_size()
    """Micro-batches by this token budget (it wins over ``micro_batch_size``): a row costs its real response
    length, plus its prompt's length the first time the prompt appears in the micro-batch (with ``share_prompt``;
    every time without). A row over the budget forms its own micro-batch. All ranks take the largest
    micro-batch count any rank needs, so that sharded forwards stay in step. 0/auto (with ``micro_batch_size``
    0): a budget per pass sized from the model, its activation checkpointing and the memory left after the
    weights and the optimizer (:mod:`mmrl.memory.budget`); the no-grad passes get a larger one than the update."""
    loss_agg_mode: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                           "seq-mean-token-sum-norm"] = "token-mean"
    """How per-token losses become one: verl's names; seq-mean-token-sum-norm is Dr. GRPO's (token sums over
    sequences, divided by the number of sequences x a constant, ``loss_horizon``)."""
    loss_horizon: int = num(0, ge=0)
    """The constant of seq-mean-token-sum-norm; 0: rollout.max_new_tokens, filled in by :func:`resolve`."""
    vision: VisionPartConfig = field(default_factory=VisionPartConfig)
    """Layout of the vision encoder (for the actor: of the reference too, which follows the actor)."""
    llm: PartConfig = field(default_factory=PartConfig)
    """Layout of the language model (embeddings, decoder layers, head)."""


# The language model's linear layers in Qwen2/2.5/3-VL decoder layers (attention and MLP projections).
@dataclass(kw_only=True)
class LossKeys:
    """The policy loss by name, and each loss's own keys: the section ``actor.loss.<name>`` of each loss of the
    table (``mmrl.algos.losses.LOSSES``) that has some. A key of a loss the run does not read is refused
    (algorithms.md#policy-losses)."""

    policy: str = ""
    """Policy loss by name (a policy loss of ``mmrl.algos.losses.LOSSES``); empty: the algorithm's own."""


LossConfig = gather_sections("LossConfig", {name: spec.section for name, spec in LOSSES.items()}, LossKeys,
                             __name__)


@dataclass(kw_only=True)
class ActorConfig(UpdateConfig):
    loss: LossConfig = field(default_factory=LossConfig)
    """The actor's loss."""
    clip_ratio_low: float = num(0.2, gt=0, le=1)
    clip_ratio_high: float = num(0.2, gt=0, le=1)
    """PPO clip range [1 - low, 1 + high]; DAPO's clip-higher raises ``high``."""
    entropy_coeff: float = num(0.0, ge=0)
    """Weight of the entropy bonus in the policy loss."""
    use_kl_loss: bool = False
    """Add a KL(policy || reference) penalty to the loss (needs the reference policy)."""
    kl_loss_coef: float = num(0.001, ge=0)
    kl_estimator: Literal["k1", "k2", "k3", "low_var_kl", "abs"] = "k3"
    share_prompt: bool = True
    """Score the samples of a prompt in one flat packed sequence that holds the prompt once (its media and its
    tokens run once, not n times) and each response without padding, its attention only over the pairs it
    needs (:mod:`mmrl.models.packing`). Used with sdpa or eager attention: with flash_attention_2 every sample
    gets its own row."""
    old_log_probs: Literal["auto", "recompute", "rollout"] = "auto"
    """Where the PPO ratio's old log-probs come from. recompute: a separate forward pass before the update;
    rollout: the engine's own (they match the trainer's within 1e-4 on the hf and vLLM engines); auto: with
    one epoch and one mini-batch (an on-policy step) the update's own forward, detached, which equals them,
    so the pass is skipped; otherwise recompute."""
    rollout_correction: Literal["none", "token", "sequence"] = "none"
    """Off-policy correction for samples drawn by other weights than the trainer's (async mode's, or an engine
    whose log-probs drift): a truncated importance weight ``min(pi_old / pi_rollout, rollout_is_cap)`` per token
    or per sequence on each token's policy-gradient term (:mod:`mmrl.algos.rollout_correction`). Needs the old
    log-probs recomputed (they are, whatever ``old_log_probs`` says)."""
    rollout_is_cap: float = num(2.0, ge=1)
    """The truncation of the rollout-correction weight."""
    logprob_chunk_tokens: int = num(0, ge=0)
    """Tokens per chunk of the LM head when scoring tokens (log-probs, entropy; the actor, the reference and
    SFT): the head's logits exist for one chunk at a time, forward and backward. 0: automatic, as many tokens
    as keep a chunk's float32 logits within 128 MiB (220 tokens at a 151,936-token vocabulary)."""
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    """LoRA instead of full fine-tuning (``actor.lora.rank`` > 0) for the RL actor (``make sft`` trains all)."""


@dataclass(kw_only=True)
class CriticConfig(UpdateConfig):
    """The value model of PPO: the policy's VLM backbone with a scalar head per token."""

    lr: float = num(1e-3, ge=0)
    init: str = ""
    """Checkpoint the backbone starts from; empty = trainer.init (the SFT policy)."""
    cliprange_value: float = num(0.5, gt=0)
    """Clip range of the value update around the rollout-time values (PPO's clipped value loss)."""
    placement: Literal["colocate", "separate"] = "colocate"
    """colocate: the critic's ranks share the actor's resource pool (bundles); separate: its own pool."""


@dataclass(kw_only=True)
class RMConfig(OptimConfig):
    """``make rm``: a reward model trained on preference pairs with the Bradley-Terry loss."""

    init: str = "outputs/sft/checkpoint"
    """The backbone it starts from (a policy checkpoint); its scalar head starts at zero."""
    out_dir: str = "outputs/rm"
    """Where the checkpoint (``<out_dir>/checkpoint``) and the pairs are written."""
    train_pairs: str = ""
    """A JSON-lines file of training pairs (``prompt_id`` of a row of the train split, ``chosen``,
    ``rejected``); empty: the ``make rm`` stage writes synthetic pairs made from the train split's labels."""
    val_pairs: str = ""
    """The same for the held-out pairs, on the val split."""
    pairs_per_prompt: int = num(4, ge=1)
    """Synthetic pairs per prompt."""
    steps: int = num(1200, ge=1)
    batch_size: int = num(32, ge=1)
    """Pairs per step."""
    lr: float = num(3e-4, ge=0)
    warmup_steps: int = num(10, ge=0)
    eval_pairs: int = num(256, ge=1)
    """Held-out pairs scored for pairwise accuracy."""



"""The ``reward`` section: rules, a reward model, a judge, and the isolated pool that runs reward functions."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from mmrl.config.model import PartConfig, VisionPartConfig
from mmrl.config_fields import auto_size, num


@dataclass(kw_only=True)
class RewardModelConfig:
    """A reward-model worker group: a VLM with a scalar head (``make rm``) scoring (prompt, media, response)."""

    path: str = ""
    """The reward model's checkpoint (``<rm.out_dir>/checkpoint``); empty: no reward model."""
    weight: float = num(1.0)
    """Its weight in the total reward."""
    micro_batch_size: int = auto_size()
    """Sequences per scoring forward; 0/auto: by ``max_tokens_per_micro``."""
    max_tokens_per_micro: int = auto_size()
    """Tokens per scoring forward (prompt + response of each row; it wins over ``micro_batch_size``); 0/auto:
    sized from the model and the memory at hand (:mod:`mmrl.memory.budget`)."""
    placement: Literal["colocate", "separate"] = "colocate"
    """colocate: its ranks share the actor's resource pool; separate: its own pool."""
    vision: VisionPartConfig = field(default_factory=VisionPartConfig)
    llm: PartConfig = field(default_factory=PartConfig)


@dataclass(kw_only=True)
class JudgeConfig:
    """A generative judge: a VLM asked, through a rollout engine, whether a response is correct."""

    path: str = ""
    """The judge's checkpoint (a policy checkpoint); empty: no judge."""
    weight: float = num(1.0)
    engine: str = ""
    """Its rollout engine (see ``mmrl.rollout.ENGINES``); empty: ``rollout.engine``."""
    template: str = ("Question: {question}\nReference answer: {ground_truth}\nResponse: {response}\n"
                     "Is the response correct? Answer yes or no.")
    """The question put to the judge, after the prompt's media; fields: question, response, ground_truth."""
    max_new_tokens: int = num(8, ge=1)
    micro_batch_size: int = auto_size()
    """Questions per generate call of an hf engine; 0/auto: a token budget sized from the judge's model."""
    placement: Literal["colocate", "separate"] = "colocate"


@dataclass(kw_only=True)
class RewardConfig:
    function: str = "answer_match"
    """A reward function: a registered name (``rewards.available()``), an installed plugin (entry-point group
    ``mmrl.rewards``) or ``path/to/file.py:function``; ``none`` for no rule reward (a reward model alone)."""
    weights: dict[str, float] = field(default_factory=dict)
    """When set, the rule reward is the weighted sum of these reward functions (``function`` is then ignored)."""
    timeout_s: float = num(10.0, gt=0)
    """A reward call that takes longer scores 0 and is counted. With ``isolation=process`` its worker is killed
    (this holds even for code that never releases the GIL); inline, a late result is discarded but the call is
    not stopped."""
    isolation: Literal["process", "inline"] = "process"
    """process: reward functions run in one pool of worker processes per run (killed and restarted on a hang, a
    crash or memory past ``max_memory_mb``); inline: in the driver's thread, one sample after another (fastest,
    for trusted, well-behaved code)."""
    num_workers: int = num(2, ge=1)
    """Reward worker processes (``isolation=process``)."""
    max_memory_mb: float = num(4096, gt=0)
    """A reward worker whose resident memory passes this is killed; its sample scores 0."""
    max_abs_score: float = num(1e4, gt=0)
    """A score outside [-max_abs_score, max_abs_score] is a failure and scores 0."""
    max_failed_steps: int = num(3, ge=1)
    """Stop the run once every sample of this many steps in a row had a failed reward call."""
    verifier: str = "answer_match"
    """The verifier that decides whether a response is correct (val/test accuracy, ``train/acc``): a
    registered reward name or ``path/to/file.py:function`` returning 1 for correct."""
    verifiers: dict[str, str] = field(default_factory=dict)
    """Per ``data_source`` verifiers that replace ``verifier`` for that source."""
    model: RewardModelConfig = field(default_factory=RewardModelConfig)
    judge: JudgeConfig = field(default_factory=JudgeConfig)



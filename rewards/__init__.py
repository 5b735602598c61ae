"""Reward functions for RL post-training and the machinery that runs them.

A reward function takes some of the keywords ``response``, ``ground_truth``,
``data_source``, ``images``, ``extra`` and returns a float or a dict with a
``"score"``. :func:`resolve` turns a config spec into one;
:class:`RewardManager` scores a batch with it, isolating failures.
"""

from rewards.manager import RewardManager, RewardResult
from rewards.registry import ENTRY_POINT_GROUP, available, load_from_file, register, resolve
from rewards.types import REWARD_KEYWORDS, RewardFn, RewardInput, accepted_keywords, call_reward_fn
from rewards.compose import by_data_source, weighted
from rewards.verifiers import (
    ANSWER_TAG,
    answer_match,
    extract_answer,
    format_answer,
    format_reward,
    normalize,
)

__all__ = [
    "ANSWER_TAG",
    "ENTRY_POINT_GROUP",
    "REWARD_KEYWORDS",
    "RewardFn",
    "RewardInput",
    "RewardManager",
    "RewardResult",
    "accepted_keywords",
    "answer_match",
    "available",
    "by_data_source",
    "call_reward_fn",
    "extract_answer",
    "format_answer",
    "format_reward",
    "load_from_file",
    "normalize",
    "register",
    "resolve",
    "weighted",
]

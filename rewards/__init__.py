"""Reward functions for RL post-training and the machinery that runs them.

A reward function takes, by name, any :class:`RewardInput` field (``response``, ``ground_truth``,
``data_source``, ``images``, ``videos``, ``extra``, ``prompt``, ``model_image_sizes``,
``response_tokens``, ``max_response_tokens``) or column of the sample's data row, and returns a float
or a dict with a ``"score"``. It may be plain, batched (:func:`batched`) or ``async``.
:func:`resolve` turns a spec (a registered name, an installed plugin, ``path/to/file.py:function``)
into one; :class:`RewardManager` calls them in worker processes, so that a plugin that raises, hangs,
crashes or eats memory costs only its samples.
"""

from rewards.manager import FunctionResult, RewardManager
from rewards.registry import ENTRY_POINT_GROUP, available, load_from_file, register, resolve
from rewards.types import (REWARD_KEYWORDS, RewardFn, RewardInput, accepted_keywords, batched, call_reward_fn,
                           prompt_text)
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
    "FunctionResult",
    "RewardFn",
    "RewardInput",
    "RewardManager",
    "accepted_keywords",
    "answer_match",
    "available",
    "batched",
    "call_reward_fn",
    "extract_answer",
    "format_answer",
    "format_reward",
    "normalize",
    "prompt_text",
    "register",
    "resolve",
]

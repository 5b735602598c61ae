"""What a reward function receives and how mmrl calls it.

A reward function is any callable that takes some or all of the keyword
arguments ``response``, ``ground_truth``, ``data_source``, ``images``, ``videos``
and ``extra`` and returns either a float or a dict holding a ``"score"`` float
plus any other numeric components, e.g.::

    def my_reward(response, ground_truth):
        return {"score": 1.0, "length": len(response)}
"""

from __future__ import annotations

import inspect
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

RewardFn = Callable[..., float | Mapping[str, float]]


@dataclass(frozen=True)
class RewardInput:
    """One sample to score: the model's response and its prompt's data row."""

    response: str
    ground_truth: str
    data_source: str = ""
    images: list = field(default_factory=list)  # PIL images of the prompt; may be empty
    videos: list = field(default_factory=list)  # the prompt's videos: data_prep.schema.Video (frames, timestamps)
    extra: dict = field(default_factory=dict)  # the data row's other fields

    def __post_init__(self) -> None:
        for name, expected in _FIELD_TYPES.items():
            value = getattr(self, name)
            if not isinstance(value, expected):
                raise TypeError(
                    f"RewardInput.{name} must be a {expected.__name__}, got {type(value).__name__}; "
                    f"convert it when building the input, e.g. {name}={expected.__name__}(...)"
                )

    def as_kwargs(self) -> dict[str, Any]:
        """All fields as the keyword arguments a reward function may take."""
        return {name: getattr(self, name) for name in REWARD_KEYWORDS}


_FIELD_TYPES: dict[str, type] = {
    "response": str,
    "ground_truth": str,
    "data_source": str,
    "images": list,
    "videos": list,
    "extra": dict,
}
REWARD_KEYWORDS: tuple[str, ...] = tuple(f.name for f in fields(RewardInput))

_KEYWORD_KINDS = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
_VARIADIC_KINDS = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def describe_fn(fn: object) -> str:
    """A readable name for a reward function, for error messages."""
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    module = getattr(fn, "__module__", None)
    if isinstance(name, str):
        return f"{module}.{name}" if module else name
    return repr(fn)


def accepted_keywords(fn: RewardFn) -> frozenset[str]:
    """The reward keywords ``fn`` takes; all of them if it has ``**kwargs``.

    Raises TypeError if ``fn`` is not callable or has a required parameter
    that mmrl cannot supply.
    """
    if not callable(fn):
        raise TypeError(f"reward function {fn!r} is not callable; pass a function or a registered name")
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        # Some C-implemented callables have no introspectable signature.
        return frozenset(REWARD_KEYWORDS)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return frozenset(REWARD_KEYWORDS)
    accepted = frozenset(p.name for p in params if p.kind in _KEYWORD_KINDS and p.name in REWARD_KEYWORDS)
    for p in params:
        required = p.default is inspect.Parameter.empty and p.kind not in _VARIADIC_KINDS
        if required and p.name not in accepted:
            raise TypeError(
                f"reward function {describe_fn(fn)} has a required parameter {p.name!r} that mmrl cannot "
                f"supply; name it one of {', '.join(REWARD_KEYWORDS)} (keyword-passable) or give it a default"
            )
    return accepted


def call_reward_fn(fn: RewardFn, inp: RewardInput) -> dict[str, float]:
    """Call ``fn`` with the keywords it accepts and normalise its result.

    Returns a dict with ``"score"`` first, every value a float (NaN/inf are
    passed through; the caller decides what to do with them).
    """
    keywords = accepted_keywords(fn)
    result = fn(**{k: v for k, v in inp.as_kwargs().items() if k in keywords})
    return normalize_result(fn, result)


def normalize_result(fn: RewardFn, result: object) -> dict[str, float]:
    """Turn a reward function's float-or-dict result into ``{"score": ..., ...}``."""
    if _is_number(result):
        return {"score": float(result)}
    if not isinstance(result, Mapping):
        raise TypeError(
            f"reward function {describe_fn(fn)} returned a {type(result).__name__}; "
            'return a float or a dict like {"score": 1.0, "other": 0.5}'
        )
    if "score" not in result:
        raise TypeError(
            f"reward function {describe_fn(fn)} returned a dict without 'score' (keys: {sorted(result)}); "
            'add the total reward under "score"'
        )
    bad = [key for key, value in result.items() if not isinstance(key, str) or not _is_number(value)]
    if bad:
        raise TypeError(
            f"reward function {describe_fn(fn)} returned non-numeric values for keys {bad!r}; "
            "every value of the returned dict must be a float"
        )
    return {"score": float(result["score"]), **{k: float(v) for k, v in result.items() if k != "score"}}


def _is_number(value: object) -> bool:
    # numbers.Real covers int, float, bool and NumPy scalars.
    return isinstance(value, numbers.Real)

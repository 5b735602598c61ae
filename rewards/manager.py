"""Scoring a batch with a user's reward function, isolating each sample.

One sample's failure must not stop training: a reward function that raises,
hangs past the timeout or returns NaN/inf (or a value beyond float32's range)
scores 0.0 for that sample, is counted and logged, and the other samples are
scored as usual.
"""

from __future__ import annotations

import functools
import logging
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rewards.isolation import Outcome, run_isolated
from rewards.registry import resolve
from rewards.types import RewardFn, RewardInput, accepted_keywords, call_reward_fn, describe_fn

logger = logging.getLogger(__name__)

MAX_ERROR_MESSAGES = 5  # kept in RewardResult.errors, and logged, per score() call


@dataclass
class RewardResult:
    """Scores of one batch, with the reward components and failure counts."""

    scores: list[float]
    components: dict[str, list[float]] = field(default_factory=dict)
    num_errors: int = 0
    num_nan: int = 0
    num_timeouts: int = 0
    errors: list[str] = field(default_factory=list)

    def metrics(self, prefix: str = "reward") -> dict[str, float]:
        """Means of the score and of each component, plus the failure counts."""
        out = {f"{prefix}/score/mean": _mean(self.scores)}
        for name, values in self.components.items():
            out[f"{prefix}/{name}/mean"] = _mean(values)
        out[f"{prefix}/num_errors"] = float(self.num_errors)
        out[f"{prefix}/num_nan"] = float(self.num_nan)
        out[f"{prefix}/num_timeouts"] = float(self.num_timeouts)
        return out


class RewardManager:
    """Scores batches of :class:`RewardInput` with one reward function."""

    def __init__(
        self,
        fn: RewardFn | str | Mapping[str, Mapping[str, float]],
        timeout_s: float = 10.0,
        max_workers: int = 4,
    ) -> None:
        """``fn`` is a reward function or any spec :func:`rewards.resolve` accepts."""
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, numbers.Real) or not timeout_s > 0:
            raise ValueError(
                f"RewardManager timeout_s must be a positive number of seconds, got {timeout_s!r}"
            )
        if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1:
            raise ValueError(f"RewardManager max_workers must be an int >= 1, got {max_workers!r}")
        self.fn = resolve(fn)
        accepted_keywords(self.fn)  # fail now, not once per sample, on a signature mmrl cannot call
        self.timeout_s = float(timeout_s)
        self.max_workers = max_workers

    def score(self, inputs: Sequence[RewardInput]) -> RewardResult:
        """Score every input; the result's lists are in input order."""
        for index, inp in enumerate(inputs):
            if not isinstance(inp, RewardInput):
                raise TypeError(
                    f"RewardManager.score: inputs[{index}] is a {type(inp).__name__}; "
                    "wrap each sample in rewards.RewardInput"
                )
        call = functools.partial(call_reward_fn, self.fn)
        outcomes = run_isolated(call, inputs, self.timeout_s, self.max_workers)
        return _summarise(outcomes, self.fn, self.timeout_s)


def _summarise(outcomes: list[Outcome], fn: RewardFn, timeout_s: float) -> RewardResult:
    result = RewardResult(scores=[0.0] * len(outcomes))
    valid: dict[int, dict[str, float]] = {}
    for index, outcome in enumerate(outcomes):
        values: dict[str, float] = outcome.value  # type: ignore[assignment]
        if outcome.timed_out:
            result.num_timeouts += 1
            _report(result, index, f"TimeoutError: {describe_fn(fn)} did not return within {timeout_s:g} s")
        elif outcome.error is not None:
            result.num_errors += 1
            _report(result, index, f"{type(outcome.error).__name__}: {outcome.error}", outcome.error)
        elif not all(_representable(v) for v in values.values()):
            result.num_nan += 1
            _report(result, index, f"ValueError: non-finite reward {values} (or beyond float32's range)")
        else:
            valid[index] = values
            result.scores[index] = values["score"]
    names = dict.fromkeys(name for sample in valid.values() for name in sample if name != "score")
    result.components = {
        name: [valid.get(i, {}).get(name, 0.0) for i in range(len(outcomes))] for name in names
    }
    failures = result.num_errors + result.num_nan + result.num_timeouts
    if failures > MAX_ERROR_MESSAGES:
        logger.warning("%d more reward failures in this batch were not logged", failures - MAX_ERROR_MESSAGES)
    return result


def _report(result: RewardResult, index: int, message: str, exc: BaseException | None = None) -> None:
    """Keep and log the first few failure messages of a batch; they score 0.0."""
    if len(result.errors) >= MAX_ERROR_MESSAGES:
        return
    text = f"sample {index}: {message}"
    result.errors.append(text)
    logger.warning("reward failed for %s", text, exc_info=exc)


FLOAT32_MAX = 3.4028234663852886e38


def _representable(value: float) -> bool:
    """Finite, and still finite once training turns it into float32 (1e39 would become inf)."""
    return math.isfinite(value) and abs(value) <= FLOAT32_MAX


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0

"""Scoring samples with reward functions, so that no plugin can hurt the run.

A :class:`RewardManager` holds named reward functions and calls each on the samples asked of it,
every call isolated on its own: one that raises, hangs past ``timeout_s``, crashes its worker, runs out
of memory or returns something unusable scores 0 on that sample, is counted by kind and logged, and
the other functions and samples are scored as usual. What a function returns as text (the names of the parts of
its dict, the message of what it raised) is cleaned and cut before it is logged or becomes a metric name
(:func:`mmrl.plugins.safe_text.clean`). Combining the scores (weights, a verifier per data source) is the
caller's: see :mod:`mmrl.trainer.reward_stage`.
"""

from __future__ import annotations

import logging
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mmrl.plugins.outcome import Outcome
from mmrl.plugins.pool import PluginPool
from mmrl.plugins.safe_text import clean
from mmrl.plugins.spec import absolute_spec, is_file_spec
from rewards.registry import check_spec, resolve
from rewards.runner import run_inline
from rewards.types import FAILURE_KINDS, RewardFn, RewardInput, check_result, describe_fn

logger = logging.getLogger(__name__)

RUNNER = "rewards.runner"  # the module the pool's workers call reward functions with
MAX_ERROR_MESSAGES = 5  # logged and kept in FunctionResult.errors, per function and score() call
MESSAGE_CHARS = 2000  # of a failure's message, logged and kept (cleaned: it may quote the plugin)
PART_CHARS = 100  # of the name of a part a function returned (cleaned: it becomes a metric name)
ISOLATIONS = ("process", "inline")
_RESERVED_NAMES = frozenset({"score", "failed_samples"})  # would read as the reward stage's own metrics
_RESERVED_PARTS = frozenset({"score", "failures"})  # would clash with a function's own metrics

Spec = str | RewardFn  # a registered name, an installed plugin, "path/to/file.py:function"; inline also a function


@dataclass
class FunctionResult:
    """One function's scores on a batch (0 where it failed or was not asked), its parts and its failures."""

    label: str  # its spec as given
    scores: list[float]  # per sample of the batch
    failed: list[bool]
    asked: list[int]  # the samples it was asked to score
    parts: dict[str, list[float | None]] = field(default_factory=dict)  # None where not returned
    failures: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FAILURE_KINDS, 0))
    errors: list[str] = field(default_factory=list)  # its first few failure messages

    def metrics(self, name: str, prefix: str = "reward") -> dict[str, float]:
        """``<prefix>/<name>/score`` (the mean over the samples asked), ``<prefix>/<name>/<part>`` (the mean
        over the samples that returned it), ``<prefix>/<name>/failures`` and ``.../failures/<kind>`` (counts;
        every kind, zeros included)."""
        asked = [self.scores[i] for i in self.asked]
        out = {f"{prefix}/{name}/score": sum(asked) / len(asked) if asked else 0.0}
        for part, values in self.parts.items():
            returned = [v for v in values if v is not None]
            out[f"{prefix}/{name}/{part}"] = sum(returned) / len(returned) if returned else 0.0
        out[f"{prefix}/{name}/failures"] = float(sum(self.failures.values()))
        out |= {f"{prefix}/{name}/failures/{kind}": float(count) for kind, count in self.failures.items()}
        return out


class RewardManager:
    """Scores batches of :class:`RewardInput` with reward functions, isolating every call.

    ``functions``: specs (see :mod:`rewards.registry`); each is named in :attr:`names` by a short metric
    name: a registered name, a file function's name (``<file stem>.<function>`` if that is taken or reads
    as a metric of the reward stage).

    ``isolation="process"`` (the default) runs them in ``num_workers`` worker processes, started on the
    first :meth:`score` and reused: a call past ``timeout_s`` is killed, a crash or ``max_memory_mb`` of
    resident memory costs only the samples in flight (see :mod:`mmrl.plugins.pool`). ``isolation="inline"``
    runs them in this thread: cheaper, but it protects from exceptions and bad values only (a late result
    still counts as a timeout); it also accepts function objects.

    A result that is not a float or a dict with a numeric ``"score"`` fails as ``bad_type``; NaN, inf or
    a value beyond float32's range as ``non_finite``; ``|score| > max_abs_score`` as ``out_of_range``.
    """

    def __init__(self, functions: Sequence[Spec], *, timeout_s: float = 10.0, num_workers: int = 2,
                 max_memory_mb: float = 4096.0, max_abs_score: float = 1e4, isolation: str = "process") -> None:
        for key, value in (("timeout_s", timeout_s), ("max_memory_mb", max_memory_mb), ("max_abs_score", max_abs_score)):
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0:
                raise ValueError(f"RewardManager {key} must be a positive number, got {value!r}")
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"RewardManager num_workers must be an int >= 1, got {num_workers!r}")
        if isolation not in ISOLATIONS:
            raise ValueError(f"RewardManager isolation must be one of {ISOLATIONS}, got {isolation!r}")
        if isinstance(functions, (str, Mapping)) or callable(functions) or not functions:
            raise TypeError(f"RewardManager needs a non-empty list of reward specs, got {functions!r}; "
                            'e.g. ["answer_match", "format"]')
        self.timeout_s, self.max_abs_score, self.isolation = float(timeout_s), float(max_abs_score), isolation
        self.names: dict[Spec, str] = {}  # spec as given -> metric name
        self._calls: dict[Spec, Spec] = {}  # spec as given -> what a worker resolves, or inline the function
        for spec in dict.fromkeys(functions):
            self._calls[spec] = self._prepare(spec)
            self.names[spec] = _unique_name(spec, set(self.names.values()))
        self._pool = PluginPool(num_workers, float(max_memory_mb), runner=RUNNER) if isolation == "process" else None

    def _prepare(self, spec: Spec) -> Spec:
        if self.isolation == "inline":
            return resolve(spec)  # now, so that a bad spec fails here as it would in a worker
        if callable(spec) and not isinstance(spec, str):
            raise TypeError(
                f"RewardManager(isolation='process') needs reward specs, not the function {describe_fn(spec)}: "
                "worker processes load their functions themselves. Put it in a file and give "
                "'path/to/file.py:function', or use isolation='inline'"
            )
        check_spec(spec, for_workers=True)
        return absolute_spec(spec)

    def launch(self) -> None:
        """Start the worker processes (without waiting for them) so that they load while the caller goes on."""
        if self._pool is not None:
            self._pool.launch()

    def start(self) -> float:
        """Start the worker processes now rather than on the first score(); returns the seconds taken."""
        if self._pool is None:
            return 0.0
        seconds = self._pool.start()
        logger.info("%d reward worker processes ready in %.2f s", self._pool.num_workers, seconds)
        return seconds

    def score(self, inputs: Sequence[RewardInput],
              asked: Mapping[Spec, Sequence[int]] | None = None) -> dict[str, FunctionResult]:
        """Each function's result on ``inputs``, by name; ``asked`` maps a spec to the samples it scores
        (every sample for a spec it leaves out)."""
        for index, inp in enumerate(inputs):
            if not isinstance(inp, RewardInput):
                raise TypeError(f"RewardManager.score: inputs[{index}] is a {type(inp).__name__}; "
                                "wrap each sample in rewards.RewardInput")
        asked = asked or {}
        assert set(asked) <= set(self.names), f"asked for functions the manager does not hold: {set(asked)}"
        samples = {spec: list(asked.get(spec, range(len(inputs)))) for spec in self._calls}
        jobs = [(self._calls[spec], [(i, inputs[i]) for i in indices]) for spec, indices in samples.items() if indices]
        if self._pool is None:
            outcomes = [run_inline(call, items, self.timeout_s) for call, items in jobs]  # type: ignore[arg-type]
        else:
            outcomes = self._pool.run(jobs, self.timeout_s) if jobs else []  # type: ignore[arg-type]
        returned = iter(outcomes)
        return {self.names[spec]: self._summarise(spec, indices, next(returned) if indices else {}, len(inputs))
                for spec, indices in samples.items()}

    def close(self) -> None:
        """End the worker processes; a later score() starts new ones."""
        if self._pool is not None:
            self._pool.close()
            self._pool = PluginPool(self._pool.num_workers, self._pool.max_memory_mb, runner=RUNNER)

    def __enter__(self) -> RewardManager:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _summarise(self, spec: Spec, asked: list[int], outcomes: Mapping[int, Outcome], count: int) -> FunctionResult:
        """Check every outcome of one function into its :class:`FunctionResult`, logging its first failures."""
        name, label = self.names[spec], spec if isinstance(spec, str) else describe_fn(spec)
        plugin = name if label == name else f"{name} ({label})"
        result = FunctionResult(label=label, scores=[0.0] * count, failed=[False] * count, asked=asked)
        for index in asked:
            outcome = outcomes.get(index, Outcome(failure="error", message="no result came back"))
            values, failure = check_result(outcome, name, self.max_abs_score)
            if failure is None:
                result.scores[index] = values.pop("score")
                for key, value in values.items():
                    key = clean(key, PART_CHARS)
                    part = f"{key}_part" if key in _RESERVED_PARTS else key
                    result.parts.setdefault(part, [None] * count)[index] = value
                continue
            result.failed[index] = True
            result.failures[failure.failure] += 1  # type: ignore[index]
            if len(result.errors) < MAX_ERROR_MESSAGES:
                message = clean(failure.message, MESSAGE_CHARS)
                result.errors.append(f"{plugin}: sample {index}: {failure.failure}: {message}")
                logger.warning("reward %s failed on sample %d: %s: %s", plugin, index, failure.failure, message)
        unlogged = sum(result.failed) - len(result.errors)
        if unlogged:
            logger.warning("reward %s failed on %d more samples of this batch (not logged)", plugin, unlogged)
        return result


def _unique_name(spec: Spec, taken: set[str]) -> str:
    if isinstance(spec, str) and is_file_spec(spec):
        path, _, function = spec.rpartition(":")
        candidates = [function, f"{Path(path).stem}.{function}"]
    else:
        candidates = [spec if isinstance(spec, str) else getattr(spec, "__name__", type(spec).__name__)]
    for name in candidates:
        if name not in taken and name not in _RESERVED_NAMES:
            return name
    number = 2
    while f"{candidates[-1]}_{number}" in taken:
        number += 1
    return f"{candidates[-1]}_{number}"

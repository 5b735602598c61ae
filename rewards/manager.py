"""Scoring a batch with reward functions, so that no plugin can hurt the run.

A :class:`RewardManager` holds one or more components, each a reward spec with a weight. Each
component is called and isolated on its own: one that raises, hangs past ``timeout_s``, crashes its
worker, runs out of memory or returns something unusable scores 0 on that sample, is counted by kind
and logged, and the other components and samples are scored as usual. A sample's score is the sum of
weight * component score.
"""

from __future__ import annotations

import json
import logging
import math
import numbers
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rewards.isolation import FAILURE_KINDS, Outcome, run_inline
from rewards.pool import RewardPool
from rewards.registry import absolute_spec, check_spec, is_file_spec, registered_here_only, resolve
from rewards.types import RewardFn, RewardInput, describe_fn, normalize_result

logger = logging.getLogger(__name__)

MAX_ERROR_MESSAGES = 5  # logged and kept in RewardResult.errors, per component and score() call
FLOAT32_MAX = 3.4028234663852886e38
ISOLATIONS = ("process", "inline")
_RESERVED_NAMES = frozenset({"score", "failed_samples"})  # would read as the total's metrics
_RESERVED_PARTS = frozenset({"score", "failures"})  # would clash with a component's own metrics

ComponentsSpec = str | Mapping | RewardFn


@dataclass
class ComponentResult:
    """One component's scores on a batch (0 where it failed), the parts it returned and its failures."""

    label: str  # its spec as given
    weight: float
    scores: list[float]
    failed: list[bool]
    parts: dict[str, list[float | None]] = field(default_factory=dict)  # None where not returned
    failures: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FAILURE_KINDS, 0))


@dataclass
class RewardResult:
    """Scores of one batch: totals, per-sample failure flags, each component's result, first errors."""

    scores: list[float]  # per sample: sum of weight * component score
    failed: list[bool] = field(default_factory=list)  # per sample: some component failed on it
    components: dict[str, ComponentResult] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)  # the first few failure messages of each component

    @property
    def num_failures(self) -> int:
        return sum(sum(c.failures.values()) for c in self.components.values())

    def metrics(self, prefix: str = "reward") -> dict[str, float]:
        """``<prefix>/score/mean``, ``<prefix>/failed_samples`` and per component ``<name>/score``
        (mean), ``<name>/<part>`` (mean over the samples that returned it), ``<name>/failures`` and
        ``<name>/failures/<kind>`` (counts; every kind, zeros included)."""
        out = {f"{prefix}/score/mean": _mean(self.scores),
               f"{prefix}/failed_samples": float(sum(self.failed))}
        for name, component in self.components.items():
            out[f"{prefix}/{name}/score"] = _mean(component.scores)
            for part, values in component.parts.items():
                out[f"{prefix}/{name}/{part}"] = _mean([v for v in values if v is not None])
            out[f"{prefix}/{name}/failures"] = float(sum(component.failures.values()))
            for kind, count in component.failures.items():
                out[f"{prefix}/{name}/failures/{kind}"] = float(count)
        return out


@dataclass(frozen=True)
class Component:
    """One reward function of a manager: its metric name, what workers resolve, and its weight."""

    name: str
    spec: object  # plain data with absolute file paths; inline, possibly a function
    label: str
    weight: float


class RewardManager:
    """Scores batches of :class:`RewardInput` with reward components, isolating every call.

    ``components`` is one spec (a registered name, ``"path/to/file.py:function"``,
    ``{"weighted": {...}}`` or ``{"by_data_source": {...}, "default": ...}``; see
    :mod:`rewards.registry`), or a mapping ``{spec: weight}`` whose specs are run as separate
    components. Metrics name a component by a short name: a registered name, a file function's
    name (``<file stem>.<function>`` if that is taken or reads as a metric of the total), or
    ``weighted`` / ``by_data_source``.

    ``isolation="process"`` (the default) runs the functions in ``num_workers`` worker processes,
    started on the first :meth:`score` and reused: a call past ``timeout_s`` is killed, a crash or
    ``max_memory_mb`` of resident memory costs only the samples in flight. ``isolation="inline"``
    runs them in this process on ``num_workers`` threads: cheaper, but it protects from nothing
    beyond exceptions (see :mod:`rewards.isolation`); it also accepts function objects.

    A result that is not a float or a dict with a numeric ``"score"`` fails as ``bad_type``; NaN,
    inf or a value beyond float32's range as ``non_finite``; ``|score| > max_abs_score`` as
    ``out_of_range``.
    """

    def __init__(
        self,
        components: ComponentsSpec,
        *,
        timeout_s: float = 10.0,
        num_workers: int = 2,
        max_memory_mb: float = 4096.0,
        max_abs_score: float = 1e4,
        isolation: str = "process",
    ) -> None:
        for name, value in (("timeout_s", timeout_s), ("max_memory_mb", max_memory_mb),
                            ("max_abs_score", max_abs_score)):
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0:
                raise ValueError(f"RewardManager {name} must be a positive number, got {value!r}")
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"RewardManager num_workers must be an int >= 1, got {num_workers!r}")
        if isolation not in ISOLATIONS:
            raise ValueError(f"RewardManager isolation must be one of {ISOLATIONS}, got {isolation!r}")
        self.timeout_s = float(timeout_s)
        self.num_workers = num_workers
        self.max_memory_mb = float(max_memory_mb)
        self.max_abs_score = float(max_abs_score)
        self.isolation = isolation
        self.components = build_components(components, isolation)
        # Inline, specs are resolved now so that a bad one fails here, as it would in a worker.
        self._functions = {c.name: resolve(c.spec) for c in self.components} if isolation == "inline" else {}
        self._pool: RewardPool | None = None

    def start(self) -> float:
        """Start the worker processes now rather than on the first score(); returns the seconds taken."""
        if self.isolation == "inline":
            return 0.0
        seconds = self._workers().start()
        logger.info("%d reward worker processes ready in %.2f s", self.num_workers, seconds)
        return seconds

    def score(self, inputs: Sequence[RewardInput]) -> RewardResult:
        """Score every input; the result's lists are in input order."""
        for index, inp in enumerate(inputs):
            if not isinstance(inp, RewardInput):
                raise TypeError(
                    f"RewardManager.score: inputs[{index}] is a {type(inp).__name__}; "
                    "wrap each sample in rewards.RewardInput"
                )
        items = list(enumerate(inputs))
        if not items:
            outcomes: list[dict[int, Outcome]] = [{} for _ in self.components]
        elif self.isolation == "process":
            outcomes = self._workers().run([(c.spec, items) for c in self.components], self.timeout_s)
        else:
            outcomes = [run_inline(self._functions[c.name], items, self.timeout_s, self.num_workers)
                        for c in self.components]
        return summarise(self.components, outcomes, len(items), self.max_abs_score)

    def close(self) -> None:
        """End the worker processes; a later score() starts new ones."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def __enter__(self) -> RewardManager:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _workers(self) -> RewardPool:
        if self._pool is None:
            self._pool = RewardPool(self.num_workers, self.max_memory_mb)
        return self._pool


# --- components ---------------------------------------------------------------------------------------


def build_components(components: ComponentsSpec, isolation: str) -> list[Component]:
    """The manager's components, each spec checked (without running plugin code) and named."""
    built: list[Component] = []
    for spec, weight in _weighted_specs(components):
        _check_component(spec, isolation)
        name = _unique_name(spec, {c.name for c in built})
        worker_spec = spec if callable(spec) else absolute_spec(spec)
        built.append(Component(name=name, spec=worker_spec, label=_label(spec), weight=weight))
    return built


def _weighted_specs(components: ComponentsSpec) -> list[tuple[object, float]]:
    if not isinstance(components, Mapping) or "by_data_source" in components:
        return [(components, 1.0)]
    table = components["weighted"] if set(components) == {"weighted"} else components
    if not isinstance(table, Mapping) or not table:
        raise ValueError(
            f"RewardManager needs a reward spec or a non-empty dict of spec -> weight, got {components!r}; "
            'e.g. "answer_match" or {"answer_match": 0.9, "format": 0.1}'
        )
    for spec, weight in table.items():
        if isinstance(weight, bool) or not isinstance(weight, numbers.Real) or not math.isfinite(weight):
            raise TypeError(f"the weight of reward {spec!r} must be a finite number, got {weight!r}")
    return [(spec, float(weight)) for spec, weight in table.items()]


def _check_component(spec: object, isolation: str) -> None:
    if callable(spec) and not isinstance(spec, (str, Mapping)):
        if isolation == "process":
            raise TypeError(
                f"RewardManager(isolation='process') needs reward specs, not the function "
                f"{describe_fn(spec)}: worker processes load their functions themselves. Put it in a file "
                "and give 'path/to/file.py:function', or use isolation='inline'"
            )
        return
    check_spec(spec)
    if isolation == "process":
        for name in _names_in(spec):
            if registered_here_only(name):
                raise ValueError(
                    f"reward {name!r} was registered by this process's code (rewards.register), so worker "
                    "processes do not know it; give it as 'path/to/file.py:function', install it under the "
                    "'mmrl.rewards' entry-point group, or use isolation='inline'"
                )


def _names_in(spec: object) -> Iterator[str]:
    """Every registered name a (checked) spec refers to."""
    if isinstance(spec, str):
        if not is_file_spec(spec):
            yield spec
    elif isinstance(spec, Mapping):
        if "weighted" in spec:
            inner = list(spec["weighted"])
        else:
            inner = [*spec["by_data_source"].values(), spec["default"]]
        for part in inner:
            yield from _names_in(part)


def _unique_name(spec: object, taken: set[str]) -> str:
    candidates = _name_candidates(spec)
    for name in candidates:
        if name not in taken and name not in _RESERVED_NAMES:
            return name
    number = 2
    while f"{candidates[-1]}_{number}" in taken:
        number += 1
    return f"{candidates[-1]}_{number}"


def _name_candidates(spec: object) -> list[str]:
    if isinstance(spec, Mapping):
        return ["weighted" if "weighted" in spec else "by_data_source"]
    if isinstance(spec, str) and is_file_spec(spec):
        path, _, function = spec.rpartition(":")
        return [metric_safe(function), metric_safe(f"{Path(path).stem}.{function}")]
    if isinstance(spec, str):
        return [metric_safe(spec)]
    return [metric_safe(getattr(spec, "__name__", type(spec).__name__))]


def _label(spec: object) -> str:
    if isinstance(spec, str):
        return spec
    if isinstance(spec, Mapping):
        return json.dumps(spec, default=str)
    return describe_fn(spec)


def metric_safe(text: str) -> str:
    """``text`` as a metric-name segment: letters, digits, ``_ . -``."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "reward"


# --- results ------------------------------------------------------------------------------------------


def summarise(components: Sequence[Component], outcomes: Sequence[Mapping[int, Outcome]], count: int,
              max_abs_score: float) -> RewardResult:
    """Validate every outcome and total the components into a :class:`RewardResult`."""
    result = RewardResult(scores=[0.0] * count, failed=[False] * count)
    for component, by_index in zip(components, outcomes):
        part = ComponentResult(label=component.label, weight=component.weight,
                               scores=[0.0] * count, failed=[False] * count)
        log = _FailureLog(component)
        for index in range(count):
            outcome = by_index.get(index, Outcome(failure="error", message="no result came back"))
            values, failure = validate(outcome, component.name, max_abs_score)
            if failure is not None:
                part.failed[index] = result.failed[index] = True
                part.failures[failure.failure] += 1  # type: ignore[index]
                log.add(index, failure)
                continue
            part.scores[index] = values["score"]
            result.scores[index] += component.weight * values["score"]
            for key, value in values.items():
                if key != "score":
                    part.parts.setdefault(_part_name(key), [None] * count)[index] = value
        result.components[component.name] = part
        result.errors.extend(log.finish())
    return result


def validate(outcome: Outcome, owner: str, max_abs_score: float) -> tuple[dict[str, float], Outcome | None]:
    """The values of a call that returned, or the failure it is (its own, or what is wrong with its value)."""
    if outcome.failure is not None:
        return {}, outcome
    try:
        values = normalize_result(outcome.value, owner)
    except TypeError as exc:
        return {}, Outcome(failure="bad_type", message=str(exc))
    if not all(_representable(v) for v in values.values()):
        return {}, Outcome(failure="non_finite",
                           message=f"returned {values}: NaN, inf or beyond float32's range")
    if abs(values["score"]) > max_abs_score:
        return {}, Outcome(failure="out_of_range",
                           message=f"returned score {values['score']:g}, "
                                   f"beyond max_abs_score={max_abs_score:g}")
    return values, None


class _FailureLog:
    """Logs a component's first few failures of a call, then how many more there were."""

    def __init__(self, component: Component) -> None:
        same = component.label == component.name
        self.plugin = component.name if same else f"{component.name} ({component.label})"
        self.messages: list[str] = []
        self.unlogged = 0

    def add(self, index: int, failure: Outcome) -> None:
        if len(self.messages) >= MAX_ERROR_MESSAGES:
            self.unlogged += 1
            return
        self.messages.append(f"{self.plugin}: sample {index}: {failure.failure}: {failure.message}")
        logger.warning("reward %s failed on sample %d: %s: %s",
                       self.plugin, index, failure.failure, failure.message)

    def finish(self) -> list[str]:
        if self.unlogged:
            logger.warning("reward %s failed on %d more samples of this batch (not logged)",
                           self.plugin, self.unlogged)
        return self.messages


def _part_name(key: str) -> str:
    name = metric_safe(key)
    return f"{name}_part" if name in _RESERVED_PARTS else name


def _representable(value: float) -> bool:
    """Finite, and still finite once training turns it into float32 (1e39 would become inf)."""
    return math.isfinite(value) and abs(value) <= FLOAT32_MAX


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


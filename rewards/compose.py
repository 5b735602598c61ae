"""Composite reward functions: a weighted sum of named rewards, and a dispatcher by ``data_source``.

Both are one reward function (one call per sample, its parts run one after the other). As specs they
are ``{"weighted": {...}}`` and ``{"by_data_source": {...}, "default": ...}`` (see :mod:`rewards.registry`).
Given to :class:`rewards.RewardManager` as ``{spec: weight}`` instead, each part is run and isolated
on its own, and a batched or async part keeps its kind.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping

from rewards.types import RewardFn, RewardInput, call_reward_fn


def weighted(components: Mapping[str, float]) -> RewardFn:
    """A reward function summing named reward functions times their weights.

    ``components`` maps a reward spec (a registered name or
    ``"path/to/file.py:function"``) to its weight. The result is
    ``{"score": sum(weight * component score), "<name>": component score, ...}``.
    """
    parts = _resolve_components(components)

    def combined(**kwargs: object) -> dict[str, float]:
        inp = RewardInput(**kwargs)  # type: ignore[arg-type]
        result = {"score": 0.0}
        for name, weight, fn in parts:
            value = call_reward_fn(fn, inp)["score"]
            result[name] = value
            result["score"] += weight * value
        return result

    label = ", ".join(f"{name}={weight:g}" for name, weight, _ in parts)
    combined.__name__ = combined.__qualname__ = f"weighted({label})"
    return combined


def _resolve_components(components: Mapping[str, float]) -> list[tuple[str, float, RewardFn]]:
    # Imported here because the registry imports this module to register the built-ins.
    from rewards.registry import resolve

    if not isinstance(components, Mapping) or not components:
        raise ValueError(
            f"weighted() needs a non-empty dict of reward name -> weight, got {components!r}; "
            'e.g. {"answer_match": 0.9, "format": 0.1}'
        )
    parts = []
    for name, weight in components.items():
        if name == "score":
            raise ValueError('weighted(): "score" is reserved for the total; use a registered reward name')
        if isinstance(weight, bool) or not isinstance(weight, numbers.Real) or not math.isfinite(weight):
            raise TypeError(f"weighted(): the weight of {name!r} must be a finite number, got {weight!r}")
        parts.append((name, float(weight), resolve(name)))
    return parts


def by_data_source(verifiers: Mapping[str, str], default: str) -> RewardFn:
    """A reward function that scores each sample with the verifier named for its ``data_source``.

    ``verifiers`` maps a data_source to a reward spec (a registered name or ``"path/to/file.py:function"``);
    a sample from any other source is scored by ``default``. As a spec:
    ``{"by_data_source": verifiers, "default": default}``.
    """
    from rewards.registry import resolve

    if not isinstance(verifiers, Mapping):
        raise TypeError(f"by_data_source() needs a dict of data_source -> reward spec, got {verifiers!r}")

    table = {source: resolve(spec) for source, spec in verifiers.items()}
    fallback = resolve(default)

    def dispatch(**kwargs: object) -> dict[str, float]:
        inp = RewardInput(**kwargs)  # type: ignore[arg-type]
        return call_reward_fn(table.get(inp.data_source, fallback), inp)

    label = ", ".join(f"{source}={spec}" for source, spec in verifiers.items())
    label = f"{label}, default={default}" if label else f"default={default}"
    dispatch.__name__ = dispatch.__qualname__ = f"by_data_source({label})"
    return dispatch

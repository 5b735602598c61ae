"""What a reward function receives, how mmrl calls it, and which results it accepts.

A reward function takes, by name, any of the fields of :class:`RewardInput` (``response``,
``ground_truth``, ``data_source``, ``images``, ``videos``, ``extra``, ``prompt``,
``model_image_sizes``, ``response_tokens``, ``max_response_tokens``) and any column of the sample's
data row (a parameter that is not a field is filled from ``extra[name]``). It returns a float, or a
dict holding a ``"score"`` plus other numeric parts that are logged, e.g.::

    def my_reward(response, ground_truth, difficulty=1.0):  # "difficulty": a column of the data row
        return {"score": float(response == ground_truth) * difficulty, "length": len(response)}

Three kinds of function are called differently:

* plain: one sample per call;
* batched (marked with :func:`batched`): one call per chunk of samples, every keyword a list with one
  entry per sample, returning a list of results of the same length;
* async (``async def``): many samples awaited concurrently on one event loop.

A result is checked by :func:`check_result`: it must be a number or such a dict (else ``bad_type``),
finite in float32 (else ``non_finite``) and at most ``max_abs_score`` in size (else ``out_of_range``).
"""

from __future__ import annotations

import asyncio
import inspect
import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass, field, fields
from typing import Any, TypeVar

from mmrl.plugins.outcome import POOL_FAILURE_KINDS, Outcome

RewardFn = Callable[..., Any]
F = TypeVar("F", bound=Callable[..., Any])

BATCHED_ATTR = "__mmrl_batched__"
FAILURE_KINDS: tuple[str, ...] = (*POOL_FAILURE_KINDS, "bad_type", "non_finite", "out_of_range")
"""How a reward call can fail: the pool's kinds (a timeout, an error, a crash, memory), then the checks of its
result (:func:`check_result`)."""
FLOAT32_MAX = 3.4028234663852886e38


@dataclass(frozen=True)
class RewardInput:
    """One sample to score: the model's response, its prompt and the prompt's data row."""

    response: str
    ground_truth: str
    data_source: str = ""
    images: list = field(default_factory=list)  # PIL images of the prompt; may be empty
    videos: list = field(default_factory=list)  # the prompt's mmrl.schema.Video (frames, timestamps)
    extra: dict = field(default_factory=dict)  # the data row's other columns
    _: KW_ONLY
    prompt: str = ""  # the text of the prompt's user turns (see prompt_text)
    model_image_sizes: list = field(default_factory=list)  # per image, (width, height) resized for the model
    response_tokens: int = 0  # length of the response in tokens
    max_response_tokens: int = 0  # the generation limit (0: unknown)
    # An agent episode (rollout.agent): its turns, its tool calls and their results (texts, PIL images), its
    # cut; ``response`` is then its final answer. Empty for a single-turn response. See mmrl.agent.rollout.
    episode: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        for f in fields(self):
            value, expected = getattr(self, f.name), _FIELD_TYPES[f.name]
            if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
                raise TypeError(
                    f"RewardInput.{f.name} must be a {expected.__name__}, got {type(value).__name__}; "
                    f"convert it when building the input, e.g. {f.name}={expected.__name__}(...)"
                )
        for name in ("response_tokens", "max_response_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"RewardInput.{name} must be >= 0, got {getattr(self, name)}")


_FIELD_TYPES: dict[str, type] = {
    "response": str, "ground_truth": str, "data_source": str, "images": list, "videos": list, "extra": dict,
    "prompt": str, "model_image_sizes": list, "response_tokens": int, "max_response_tokens": int, "episode": dict,
}
REWARD_KEYWORDS: tuple[str, ...] = tuple(f.name for f in fields(RewardInput))
PEER_KEYWORDS: dict[str, str] = {"solution_str": "response"}
"""Parameter names the peers' reward functions use for a :class:`RewardInput` field: verl's
``compute_score(data_source, solution_str, ground_truth, extra_info)`` runs as it is (``extra_info`` is a column
of verl's rows, so it comes from ``extra``)."""
_REQUIRED = inspect.Parameter.empty


def prompt_text(messages: list[dict]) -> str:
    """The text of a prompt's user turns, one per line (media placeholders included)."""
    return "\n".join(m["content"] for m in messages if m.get("role") == "user" and isinstance(m.get("content"), str))


def batched(fn: F) -> F:
    """Mark ``fn`` as batched: it is called with lists (one entry per sample) and returns a list."""
    if not callable(fn):
        raise TypeError(f"rewards.batched was applied to {fn!r}, which is not callable")
    setattr(fn, BATCHED_ATTR, True)
    return fn


def describe_fn(fn: object) -> str:
    """A readable name for a reward function, for error messages."""
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    module = getattr(fn, "__module__", None)
    if isinstance(name, str):
        return f"{module}.{name}" if module else name
    return repr(fn)


@dataclass(frozen=True)
class CallPlan:
    """How to call one reward function: which fields and row columns it takes, and its kind."""

    fields: tuple[str, ...]
    columns: tuple[tuple[str, Any], ...]  # (column name, default or inspect.Parameter.empty)
    batched: bool = False
    is_async: bool = False


def plan_call(fn: RewardFn) -> CallPlan:
    """The :class:`CallPlan` of ``fn``.

    Raises TypeError if ``fn`` is not callable or has a required positional-only parameter (it could
    not be passed by name).
    """
    if not callable(fn):
        raise TypeError(f"reward function {fn!r} is not callable; pass a function or a registered name")
    is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))
    kind = {"batched": getattr(fn, BATCHED_ATTR, False) is True, "is_async": is_async}
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # some C-implemented callables have no introspectable signature
        return CallPlan(fields=REWARD_KEYWORDS, columns=(), **kind)
    for p in params:
        if p.kind is inspect.Parameter.POSITIONAL_ONLY and p.default is _REQUIRED:
            raise TypeError(
                f"reward function {describe_fn(fn)} has a required positional-only parameter {p.name!r}; "
                "mmrl passes everything by name: drop the '/' or give it a default"
            )
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return CallPlan(fields=REWARD_KEYWORDS, columns=(), **kind)
    named = [p for p in params if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    return CallPlan(
        fields=tuple(p.name for p in named if p.name in REWARD_KEYWORDS or p.name in PEER_KEYWORDS),
        columns=tuple((p.name, p.default) for p in named if p.name not in REWARD_KEYWORDS
                      and p.name not in PEER_KEYWORDS),
        **kind,
    )


def accepted_keywords(fn: RewardFn) -> frozenset[str]:
    """The :class:`RewardInput` fields ``fn`` takes; all of them if it has ``**kwargs``.

    Its other parameters are data-row columns (see :func:`bind`).
    """
    return frozenset(plan_call(fn).fields)


def bind(plan: CallPlan, inp: RewardInput, owner: str) -> dict[str, Any]:
    """The keyword arguments of one call: the fields ``plan`` takes and its row columns from ``inp.extra``.

    A column missing from the row takes its parameter's default; a required one raises TypeError
    naming it and listing the columns the row has.
    """
    kwargs = {name: getattr(inp, PEER_KEYWORDS.get(name, name)) for name in plan.fields}
    for name, default in plan.columns:
        if name in inp.extra:
            kwargs[name] = inp.extra[name]
        elif default is not _REQUIRED:
            kwargs[name] = default
        else:
            raise TypeError(
                f"reward function {owner} takes {name!r}, which is neither a RewardInput field nor a column "
                f"of this sample's data row; the row's columns: {sorted(map(str, inp.extra))}; the fields: "
                f"{', '.join(REWARD_KEYWORDS)}"
            )
    return kwargs


def call_reward_fn(fn: RewardFn, inp: RewardInput) -> dict[str, float]:
    """Call ``fn`` (of any kind) on one sample, in this thread, and normalise its result.

    Returns a dict with ``"score"`` first, every value a float (NaN/inf are passed through; the caller
    decides what to do with them).
    """
    plan, owner = plan_call(fn), describe_fn(fn)
    kwargs = bind(plan, inp, owner)
    if plan.batched:
        kwargs = {name: [value] for name, value in kwargs.items()}
    result = fn(**kwargs)
    if inspect.isawaitable(result):
        result = asyncio.run(_awaited(result))
    if plan.batched:
        if not is_result_list(result) or len(result) != 1:
            got = f"{len(result)} results" if is_result_list(result) else f"a {type(result).__name__}"
            raise TypeError(f"batched reward function {owner} returned {got} for 1 sample; "
                            "return a list with one float or dict per sample")
        result = list(result)[0]
    return normalize_result(result, owner)


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def is_result_list(value: object) -> bool:
    """Whether a batched function's return value is a sequence of per-sample results."""
    if isinstance(value, (str, bytes, Mapping)):
        return False
    return hasattr(value, "__len__") and hasattr(value, "__iter__")


# --- results ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Unsendable:
    """Stands for a returned value that is not a number: only its type crosses the process boundary."""

    type_name: str


def to_plain(result: object) -> object:
    """A function's result reduced to plain data for the parent to check.

    Numbers become floats, a mapping with string keys a dict of floats, and anything else (or a
    non-numeric value inside a mapping) an :class:`Unsendable` naming its type. Nothing of the
    plugin's own classes is left, so reading the result back cannot run the plugin's code.
    """
    if _is_number(result):
        return _to_float(result)
    if isinstance(result, Mapping):
        if not all(isinstance(key, str) for key in result):
            return Unsendable("dict with non-string keys")
        return {key: _to_float(value) if _is_number(value) else Unsendable(type(value).__name__)
                for key, value in result.items()}
    return Unsendable(type(result).__name__)


def normalize_result(result: object, owner: str) -> dict[str, float]:
    """Turn a float-or-dict result into ``{"score": ..., ...}``; raise TypeError for any other shape.

    ``owner`` names the function in the messages.
    """
    if _is_number(result):
        return {"score": _to_float(result)}
    if not isinstance(result, Mapping):
        raise TypeError(f"reward function {owner} returned a {_type_name(result)}; "
                        'return a float or a dict like {"score": 1.0, "other": 0.5}')
    if "score" not in result:
        raise TypeError(f"reward function {owner} returned a dict without 'score' (keys: {sorted(map(str, result))}); "
                        'add the total reward under "score"')
    bad = [key for key, value in result.items() if not isinstance(key, str) or not _is_number(value)]
    if bad:
        raise TypeError(f"reward function {owner} returned non-numeric values for keys {bad!r}; "
                        "every value of the returned dict must be a float")
    parts = {key: _to_float(value) for key, value in result.items() if key != "score"}
    return {"score": _to_float(result["score"]), **parts}


def check_result(outcome: Outcome, owner: str, max_abs_score: float) -> tuple[dict[str, float], Outcome | None]:
    """The values of a call that returned, or the failure it is (its own, or what is wrong with its value)."""
    if outcome.failure is not None:
        return {}, outcome
    try:
        values = normalize_result(outcome.value, owner)
    except TypeError as exc:
        return {}, Outcome(failure="bad_type", message=str(exc))
    # Finite, and still finite once training turns it into float32 (1e39 would become inf).
    if not all(math.isfinite(v) and abs(v) <= FLOAT32_MAX for v in values.values()):
        return {}, Outcome(failure="non_finite", message=f"returned {values}: NaN, inf or beyond float32's range")
    if abs(values["score"]) > max_abs_score:
        return {}, Outcome(failure="out_of_range", message=f"returned score {values['score']:g}, "
                                                           f"beyond max_abs_score={max_abs_score:g}")
    return values, None


def _type_name(value: object) -> str:
    return value.type_name if isinstance(value, Unsendable) else type(value).__name__


def _to_float(value: Any) -> float:
    try:
        return float(value)
    except OverflowError:  # an int beyond float's range
        return math.copysign(math.inf, value)


def _is_number(value: object) -> bool:
    return isinstance(value, numbers.Real)  # int, float, bool and NumPy scalars

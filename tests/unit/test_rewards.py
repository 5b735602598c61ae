"""Unit tests of the rewards package: verifiers, calling convention, registry, manager."""

from __future__ import annotations

import logging
import math
import sys
import threading
import time
from importlib import metadata
from pathlib import Path

import pytest

import rewards
from rewards import (
    RewardInput,
    RewardManager,
    RewardResult,
    answer_match,
    available,
    call_reward_fn,
    extract_answer,
    format_reward,
    normalize,
    register,
    resolve,
    weighted,
)
from rewards import registry

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_PLUGIN = REPO_ROOT / "rewards" / "examples" / "length_penalty.py"


@pytest.fixture
def clean_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let a test register names without leaking them into other tests."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))


def inp(response: str, ground_truth: str = "red", **kwargs: object) -> RewardInput:
    return RewardInput(response=response, ground_truth=ground_truth, **kwargs)


# --- extract_answer / normalize / answer_match / format_reward ---------------------------------

EXTRACT_CASES = [
    ("<answer>red</answer>", "red"),
    ("<answer> 3 </answer><|im_end|>", "3"),
    ("<answer><answer>red</answer>", "red"),
    ("<answer>red", None),  # missing close tag
    ("I think <answer>blue", None),
    ("red</answer>", None),  # stray close tag only
    ("<answer>blue</answer> then <answer>red</answer>", "red"),  # two answers: the last
    ("Let me look. <answer>red</answer> Done.", "red"),  # extra text around
    ("<answer></answer>", None),  # empty answer
    ("<answer>  \n </answer>", None),
    ("", None),
    ("   \n ", None),
    ("<|im_end|>", None),
    ("Red ", "Red"),  # bare answer
    ("  red\n<|endoftext|>", "red"),
    ("<answer>\n  Dark Red\n</answer>\n<|im_end|><|endoftext|>", "Dark Red"),
    ("<ANSWER>red</Answer>", "red"),
    ("<answer>re<|im_end|>d</answer>", "re d"),
    ("<answer>a <answer>b</answer> c</answer>", "b"),
    ("<answer>1</answer> <answer>2", "1"),  # the last complete pair
]


@pytest.mark.parametrize(("text", "expected"), EXTRACT_CASES)
def test_extract_answer(text: str, expected: str | None) -> None:
    assert extract_answer(text) == expected


def test_extract_answer_rejects_non_string() -> None:
    with pytest.raises(TypeError, match="str"):
        extract_answer(None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("  Red  ", "red"),
        ("Dark   \n Red", "dark red"),
        ("red.", "red"),
        ("red!!", "red"),
        ("red,", "red"),
        ('"Red"', "red"),
        ("'red'", "red"),
        ('"red".', "red"),
        ('"red."', "red"),
        ("3.5", "3.5"),
        ("", ""),
    ],
)
def test_normalize(text: str, expected: str) -> None:
    assert normalize(text) == expected


ANSWER_MATCH_CASES = [
    ("<answer>red</answer>", "red", 1.0),
    ("<answer> RED </answer><|im_end|>", "red", 1.0),
    ("<answer>Dark  Red.</answer>", "dark red", 1.0),
    ('<answer>"red"</answer>', "Red", 1.0),
    ("Red ", "red", 1.0),
    ("<answer> 3 </answer><|im_end|>", "3", 1.0),
    ("<answer><answer>red</answer>", "red", 1.0),
    ("<answer>red</answer> <answer>blue</answer>", "red", 0.0),
    ("<answer>blue</answer> <answer>red</answer>", "red", 1.0),
    ("<answer>red", "red", 0.0),
    ("<answer></answer>", "red", 0.0),
    ("", "red", 0.0),
    ("the answer is red", "red", 0.0),
    ("<answer>reddish</answer>", "red", 0.0),
    ("<answer>3</answer>", "30", 0.0),
]


@pytest.mark.parametrize(("response", "truth", "expected"), ANSWER_MATCH_CASES)
def test_answer_match(response: str, truth: str, expected: float) -> None:
    assert answer_match(response, truth) == expected


FORMAT_CASES = [
    ("<answer>red</answer>", 1.0),
    ("<answer> 3 </answer><|im_end|>", 1.0),
    ("  <answer>red</answer>\n<|im_end|>\n<|endoftext|>", 1.0),
    ("<answer>a\nb</answer>", 1.0),
    ("<answer></answer>", 0.0),  # empty
    ("<answer>  </answer>", 0.0),
    ("<answer>red", 0.0),  # missing close
    ("red", 0.0),  # bare answer
    ("", 0.0),
    ("I think <answer>red</answer>", 0.0),  # text before
    ("<answer>red</answer> because", 0.0),  # text after
    ("<answer>red</answer><answer>blue</answer>", 0.0),  # two answers
    ("<answer><answer>red</answer>", 0.0),  # nested
    ("<answer>red</answer></answer>", 0.0),
    ("<|im_start|><answer>red</answer>", 0.0),  # special token before is not trailing
]


@pytest.mark.parametrize(("response", "expected"), FORMAT_CASES)
def test_format_reward(response: str, expected: float) -> None:
    assert format_reward(response) == expected


# --- RewardInput / call_reward_fn --------------------------------------------------------------


def test_reward_input_rejects_wrong_field_type() -> None:
    with pytest.raises(TypeError, match="ground_truth"):
        RewardInput(response="x", ground_truth=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="images"):
        RewardInput(response="x", ground_truth="y", images=None)  # type: ignore[arg-type]


def test_call_reward_fn_passes_only_accepted_keywords() -> None:
    seen: dict[str, object] = {}

    def fn(response: str, extra: dict) -> float:
        seen.update(response=response, extra=extra)
        return 0.5

    sample = inp("resp", data_source="src", extra={"k": 1})
    assert call_reward_fn(fn, sample) == {"score": 0.5}
    assert seen == {"response": "resp", "extra": {"k": 1}}


def test_call_reward_fn_passes_all_keywords_to_var_kwargs() -> None:
    seen: dict[str, object] = {}

    def fn(**kwargs: object) -> float:
        seen.update(kwargs)
        return 1.0

    call_reward_fn(fn, inp("resp", "truth", data_source="src"))
    expected = {"response": "resp", "ground_truth": "truth", "data_source": "src", "images": [], "videos": [],
                "extra": {}}
    assert seen == expected


def test_call_reward_fn_keyword_only_and_defaults() -> None:
    def fn(*, ground_truth: str, unused: int = 7) -> float:
        return float(len(ground_truth) + unused)

    assert call_reward_fn(fn, inp("x", "abc")) == {"score": 10.0}


def test_call_reward_fn_rejects_unsuppliable_parameter() -> None:
    def needs_tokens(response: str, tokens: list) -> float:
        return 0.0

    with pytest.raises(TypeError, match="tokens"):
        call_reward_fn(needs_tokens, inp("x"))


@pytest.mark.parametrize(
    ("returned", "expected"),
    [
        (1, {"score": 1.0}),
        (0.25, {"score": 0.25}),
        (True, {"score": 1.0}),
        ({"score": 0.5, "acc": 1}, {"score": 0.5, "acc": 1.0}),
        ({"acc": 1.0, "score": 2}, {"score": 2.0, "acc": 1.0}),
    ],
)
def test_call_reward_fn_normalises_result(returned: object, expected: dict[str, float]) -> None:
    result = call_reward_fn(lambda response: returned, inp("x"))
    assert result == expected
    assert all(type(v) is float for v in result.values())
    assert next(iter(result)) == "score"


@pytest.mark.parametrize(
    ("returned", "message"),
    [
        ("1.0", "returned a str"),
        (None, "returned a NoneType"),
        ({"acc": 1.0}, "without 'score'"),
        ({"score": 1.0, "note": "good"}, "non-numeric values for keys \\['note'\\]"),
        ({"score": None}, "non-numeric"),
    ],
)
def test_call_reward_fn_rejects_bad_results(returned: object, message: str) -> None:
    def my_bad_reward(response: str) -> object:
        return returned

    with pytest.raises(TypeError, match=message) as info:
        call_reward_fn(my_bad_reward, inp("x"))
    assert "my_bad_reward" in str(info.value)


# --- registry ----------------------------------------------------------------------------------


def test_builtin_names_resolve() -> None:
    assert resolve("answer_match") is answer_match
    assert resolve("format") is format_reward
    assert {"answer_match", "format"} <= set(available())


def test_register_decorator(clean_registry: None) -> None:
    @register("always_one")
    def always_one(response: str) -> float:
        return 1.0

    assert resolve("always_one") is always_one
    assert "always_one" in available()
    with pytest.raises(ValueError, match="always_one"):
        register("always_one")(lambda response: 0.0)


def test_unknown_name_lists_valid_names() -> None:
    with pytest.raises(ValueError, match="no_such_reward") as info:
        resolve("no_such_reward")
    assert "answer_match" in str(info.value) and "format" in str(info.value)


def test_resolve_file_spec(tmp_path: Path) -> None:
    plugin = tmp_path / "my_plugin.py"
    plugin.write_text("def exact(response, ground_truth):\n    return float(response == ground_truth)\n")
    fn = resolve(f"{plugin}:exact")
    assert call_reward_fn(fn, inp("red", "red")) == {"score": 1.0}
    assert call_reward_fn(fn, inp("blue", "red")) == {"score": 0.0}


def test_resolve_relative_file_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "rel.py").write_text("def score(response):\n    return 0.25\n")
    monkeypatch.chdir(tmp_path)
    assert resolve("rel.py:score")(response="x") == 0.25


def test_file_spec_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.py"
    with pytest.raises(ValueError, match="not found") as info:
        resolve(f"{missing}:score")
    assert "nowhere.py" in str(info.value)


def test_file_spec_missing_function(tmp_path: Path) -> None:
    plugin = tmp_path / "plugin.py"
    plugin.write_text("def other(response):\n    return 0.0\n")
    with pytest.raises(ValueError, match="no function 'score'") as info:
        resolve(f"{plugin}:score")
    assert "plugin.py" in str(info.value) and "other" in str(info.value)


def test_file_spec_not_callable(tmp_path: Path) -> None:
    plugin = tmp_path / "plugin.py"
    plugin.write_text("score = 3\n")
    with pytest.raises(ValueError, match="'score'.*not a function"):
        resolve(f"{plugin}:score")


def test_file_spec_without_function(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no function"):
        resolve(str(tmp_path / "plugin.py"))


def test_bad_spec_types() -> None:
    with pytest.raises(TypeError, match="reward spec"):
        resolve(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="weighted"):
        resolve({"sum": {"format": 1.0}})


def test_example_plugin_loads_by_path() -> None:
    fn = resolve(f"{EXAMPLE_PLUGIN}:score")
    short = call_reward_fn(fn, inp("<answer>red</answer>"))
    assert short == {"score": 1.0, "correct": 1.0, "length_penalty": 0.0}
    long_response = "<answer>red</answer>" + "x" * 280  # 300 chars: 100 over the free 200
    result = call_reward_fn(fn, inp(long_response))
    assert result == pytest.approx({"score": 0.9, "correct": 1.0, "length_penalty": 0.1})
    capped = call_reward_fn(fn, inp("<answer>blue</answer>" + "x" * 5000))
    assert capped == pytest.approx({"score": -0.5, "correct": 0.0, "length_penalty": 0.5})


def test_entry_point_plugin_is_loaded_lazily(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clean_registry: None
) -> None:
    (tmp_path / "mmrl_test_ep_plugin.py").write_text("def score(response):\n    return 0.75\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    entry_point = metadata.EntryPoint(
        name="ep_reward", value="mmrl_test_ep_plugin:score", group=registry.ENTRY_POINT_GROUP
    )

    def fake_entry_points(**params: str) -> list[metadata.EntryPoint]:
        return [entry_point] if params.get("group") == registry.ENTRY_POINT_GROUP else []

    monkeypatch.setattr(metadata, "entry_points", fake_entry_points)
    assert "ep_reward" in available()
    assert "mmrl_test_ep_plugin" not in sys.modules  # listed but not imported yet
    assert resolve("ep_reward")(response="x") == 0.75
    assert "mmrl_test_ep_plugin" in sys.modules
    sys.modules.pop("mmrl_test_ep_plugin")


def test_broken_entry_point_names_the_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    entry_point = metadata.EntryPoint(
        name="broken", value="mmrl_no_such_module_xyz:score", group=registry.ENTRY_POINT_GROUP
    )
    monkeypatch.setattr(metadata, "entry_points", lambda **params: [entry_point])
    with pytest.raises(ValueError, match="'broken'"):
        resolve("broken")


# --- weighted ----------------------------------------------------------------------------------


def test_weighted_combination() -> None:
    fn = resolve({"weighted": {"answer_match": 0.9, "format": 0.1}})
    # Right answer, wrong format: 0.9 * 1 + 0.1 * 0.
    assert call_reward_fn(fn, inp("I say <answer>Red</answer>")) == pytest.approx(
        {"score": 0.9, "answer_match": 1.0, "format": 0.0}
    )
    # Wrong answer, right format: 0.9 * 0 + 0.1 * 1.
    assert call_reward_fn(fn, inp("<answer>blue</answer>")) == pytest.approx(
        {"score": 0.1, "answer_match": 0.0, "format": 1.0}
    )
    assert call_reward_fn(fn, inp("<answer>red</answer>")) == pytest.approx(
        {"score": 1.0, "answer_match": 1.0, "format": 1.0}
    )


def test_weighted_uses_component_score_of_dict_results() -> None:
    fn = weighted({f"{EXAMPLE_PLUGIN}:score": 2.0, "format": -0.5})
    long_response = "<answer>red</answer>" + "x" * 280  # example plugin: 1.0 - 0.1
    # 2.0 * 0.9 + (-0.5) * 0.0 (text after the answer breaks the format)
    assert call_reward_fn(fn, inp(long_response))["score"] == pytest.approx(1.8)


def test_weighted_errors() -> None:
    with pytest.raises(ValueError, match="nope"):
        weighted({"nope": 1.0})
    with pytest.raises(TypeError, match="'format'"):
        weighted({"format": "high"})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="non-empty"):
        weighted({})


# --- RewardManager -----------------------------------------------------------------------------


def test_manager_scores_in_order_with_components() -> None:
    def fn(response: str, ground_truth: str) -> dict[str, float]:
        time.sleep(0.01 * (5 - int(response)))  # finish out of order
        return {"score": float(response), "twice": 2.0 * float(response)}

    result = RewardManager(fn, timeout_s=2.0, max_workers=4).score([inp(str(i)) for i in range(5)])
    assert result.scores == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert result.components == {"twice": [0.0, 2.0, 4.0, 6.0, 8.0]}
    assert (result.num_errors, result.num_nan, result.num_timeouts, result.errors) == (0, 0, 0, [])


def test_manager_isolates_errors_nan_and_timeouts(caplog: pytest.LogCaptureFixture) -> None:
    release = threading.Event()

    def flaky(response: str, ground_truth: str) -> dict[str, float]:
        if response == "raise":
            raise RuntimeError("boom in user code")
        if response == "nan":
            return {"score": math.nan, "bonus": 1.0}
        if response == "inf":
            return {"score": 1.0, "bonus": math.inf}
        if response == "hang":
            release.wait(5.0)
        return {"score": answer_match(response, ground_truth), "bonus": 0.5}

    responses = ["<answer>red</answer>", "raise", "nan", "hang", "<answer>blue</answer>", "inf", "red"]
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="rewards.manager"):
        result = RewardManager(flaky, timeout_s=0.2, max_workers=3).score([inp(r) for r in responses])
    elapsed = time.monotonic() - start
    release.set()

    assert result.scores == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert result.components == {"bonus": [0.5, 0.0, 0.0, 0.0, 0.5, 0.0, 0.5]}
    assert (result.num_errors, result.num_nan, result.num_timeouts) == (1, 2, 1)
    assert elapsed < 1.5
    assert any(e.startswith("sample 1: RuntimeError: boom in user code") for e in result.errors)
    assert any(e.startswith("sample 3: TimeoutError") for e in result.errors)
    assert any(e.startswith("sample 2:") for e in result.errors)
    assert "boom in user code" in caplog.text

    metrics = result.metrics()
    assert metrics == pytest.approx(
        {
            "reward/score/mean": 2.0 / 7,
            "reward/bonus/mean": 1.5 / 7,
            "reward/num_errors": 1.0,
            "reward/num_nan": 2.0,
            "reward/num_timeouts": 1.0,
        }
    )


def test_hung_call_does_not_starve_later_samples() -> None:
    release = threading.Event()

    def fn(response: str) -> float:
        if response == "hang":
            release.wait(5.0)
        time.sleep(0.05)
        return 1.0

    # One worker: the samples after the hung one must still run once it is abandoned,
    # each with its own full timeout counted from its start.
    result = RewardManager(fn, timeout_s=0.2, max_workers=1).score([inp("hang"), inp("a"), inp("b")])
    release.set()
    assert result.scores == [0.0, 1.0, 1.0]
    assert result.num_timeouts == 1


def test_manager_respects_max_workers() -> None:
    lock = threading.Lock()
    active = [0]
    peak = [0]

    def fn(response: str) -> float:
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.02)
        with lock:
            active[0] -= 1
        return 1.0

    result = RewardManager(fn, timeout_s=2.0, max_workers=2).score([inp(str(i)) for i in range(8)])
    assert result.scores == [1.0] * 8
    assert peak[0] == 2


def test_manager_caps_error_messages(caplog: pytest.LogCaptureFixture) -> None:
    def always_fails(response: str) -> float:
        raise ValueError(f"bad {response}")

    with caplog.at_level(logging.WARNING, logger="rewards.manager"):
        result = RewardManager(always_fails, timeout_s=1.0).score([inp(str(i)) for i in range(20)])
    assert result.num_errors == 20
    assert result.scores == [0.0] * 20
    assert len(result.errors) == rewards.manager.MAX_ERROR_MESSAGES
    assert len(caplog.records) == rewards.manager.MAX_ERROR_MESSAGES + 1  # plus one summary line
    assert "15 more" in caplog.records[-1].getMessage()


def test_manager_counts_bad_return_type_as_error() -> None:
    result = RewardManager(lambda response: "1.0", timeout_s=1.0).score([inp("x")])
    assert result.num_errors == 1 and result.scores == [0.0]
    assert "TypeError" in result.errors[0]


def test_manager_resolves_specs_and_checks_arguments() -> None:
    manager = RewardManager({"weighted": {"answer_match": 0.9, "format": 0.1}})
    result = manager.score([inp("<answer>red</answer>"), inp("red")])
    assert result.scores == pytest.approx([1.0, 0.9])
    with pytest.raises(TypeError, match="tokens"):
        RewardManager(lambda response, tokens: 0.0)
    with pytest.raises(ValueError, match="timeout_s"):
        RewardManager("format", timeout_s=0)
    with pytest.raises(ValueError, match="max_workers"):
        RewardManager("format", max_workers=0)
    with pytest.raises(TypeError, match=r"inputs\[1\]"):
        manager.score([inp("x"), {"response": "x"}])  # type: ignore[list-item]


def test_empty_batch() -> None:
    result = RewardManager("format").score([])
    assert result == RewardResult(scores=[])
    assert result.metrics(prefix="r")["r/score/mean"] == 0.0


def test_a_finite_reward_beyond_float32_scores_zero_like_a_nan():
    """1e39 is a finite Python float but inf in float32, where training would meet it."""
    import torch

    manager = RewardManager(lambda response: float(response), timeout_s=5)
    result = manager.score([RewardInput(response=r, ground_truth="") for r in ("1e39", "-1e39", "3e38", "2")])
    assert result.scores == [0.0, 0.0, 3e38, 2.0] and result.num_nan == 2
    assert torch.isfinite(torch.tensor(result.scores, dtype=torch.float32)).all()

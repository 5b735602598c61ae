"""Unit tests of the rewards package: verifiers, calling convention, registry, manager (inline)."""

from __future__ import annotations

import asyncio
import logging
import math
import sys
import time
from importlib import metadata
from pathlib import Path

import pytest

import rewards
from mmrl.plugins.spec import absolute_spec
from rewards import (
    RewardInput,
    RewardManager,
    answer_match,
    available,
    batched,
    call_reward_fn,
    extract_answer,
    format_reward,
    normalize,
    prompt_text,
    register,
    resolve,
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
    with pytest.raises(TypeError, match="prompt"):
        RewardInput(response="x", ground_truth="y", prompt=None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="response_tokens"):
        RewardInput(response="x", ground_truth="y", response_tokens=1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="max_response_tokens"):
        RewardInput(response="x", ground_truth="y", max_response_tokens=True)
    with pytest.raises(ValueError, match="response_tokens"):
        RewardInput(response="x", ground_truth="y", response_tokens=-1)
    with pytest.raises(TypeError, match="model_image_sizes"):
        RewardInput(response="x", ground_truth="y", model_image_sizes=(1, 2))  # type: ignore[arg-type]


def test_reward_input_newer_fields_are_keyword_only_with_defaults() -> None:
    plain = RewardInput("x", "y", "src", [], [], {})
    assert (plain.prompt, plain.model_image_sizes, plain.response_tokens, plain.max_response_tokens) == ("", [], 0, 0)
    with pytest.raises(TypeError):
        RewardInput("x", "y", "src", [], [], {}, "prompt")  # type: ignore[misc]


def test_call_reward_fn_passes_only_accepted_keywords() -> None:
    seen: dict[str, object] = {}

    def fn(response: str, extra: dict) -> float:
        seen.update(response=response, extra=extra)
        return 0.5

    sample = inp("resp", data_source="src", extra={"k": 1})
    assert call_reward_fn(fn, sample) == {"score": 0.5}
    assert seen == {"response": "resp", "extra": {"k": 1}}


def test_a_verl_compute_score_runs_as_verl_calls_it() -> None:
    """verl's signature: ``solution_str`` is the response, ``extra_info`` the verl row's column (in ``extra``); the
    runner ships the response for it."""
    from rewards.runner import fields_read

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        return float(solution_str.strip() == ground_truth) + extra_info["index"] / 100

    sample = inp(" 7", "7", data_source="digits", extra={"extra_info": {"split": "train", "index": 3}})
    assert call_reward_fn(compute_score, sample) == {"score": pytest.approx(1.03)}
    assert set(fields_read(compute_score)) == {"data_source", "response", "ground_truth", "extra"}


def test_call_reward_fn_passes_all_keywords_to_var_kwargs() -> None:
    seen: dict[str, object] = {}

    def fn(**kwargs: object) -> float:
        seen.update(kwargs)
        return 1.0

    call_reward_fn(fn, inp("resp", "truth", data_source="src"))
    expected = {"response": "resp", "ground_truth": "truth", "data_source": "src", "images": [], "videos": [],
                "extra": {}, "prompt": "", "model_image_sizes": [], "response_tokens": 0, "max_response_tokens": 0,
                "episode": {}}
    assert seen == expected


def test_call_reward_fn_keyword_only_and_defaults() -> None:
    def fn(*, ground_truth: str, unused: int = 7) -> float:
        return float(len(ground_truth) + unused)

    assert call_reward_fn(fn, inp("x", "abc")) == {"score": 10.0}


def test_call_reward_fn_rejects_unsuppliable_parameter() -> None:
    def needs_tokens(response: str, tokens: list) -> float:
        return 0.0

    with pytest.raises(TypeError, match="tokens") as info:
        call_reward_fn(needs_tokens, inp("x", extra={"level": 1}))
    assert "['level']" in str(info.value)  # the row's columns are listed


def test_call_reward_fn_fills_row_columns() -> None:
    def fn(response: str, tokens: list, level: int = 7) -> float:
        return float(len(tokens) + level)

    assert call_reward_fn(fn, inp("x", extra={"tokens": [1, 2]})) == {"score": 9.0}
    assert call_reward_fn(fn, inp("x", extra={"tokens": [1], "level": 1})) == {"score": 2.0}


def test_call_reward_fn_rejects_required_positional_only_parameter() -> None:
    def fn(response: str, /) -> float:
        return 1.0

    with pytest.raises(TypeError, match="positional-only"):
        call_reward_fn(fn, inp("x"))


def test_call_reward_fn_calls_batched_and_async_functions() -> None:
    @batched
    def lengths(response: list[str], ground_truth: list[str]) -> list[float]:
        assert isinstance(response, list) and isinstance(ground_truth, list)
        return [float(len(r)) for r in response]

    async def later(response: str) -> dict[str, float]:
        return {"score": 0.5, "n": float(len(response))}

    assert call_reward_fn(lengths, inp("abc")) == {"score": 3.0}
    assert call_reward_fn(later, inp("ab")) == {"score": 0.5, "n": 2.0}
    with pytest.raises(TypeError, match="returned 2 results for 1 sample"):
        call_reward_fn(batched(lambda response: [1.0, 2.0]), inp("x"))


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
    with pytest.raises(TypeError, match="reward spec"):  # weights and per-source verifiers are the stage's
        resolve({"weighted": {"format": 1.0}})  # type: ignore[arg-type]


def test_check_spec_runs_no_plugin_code(tmp_path: Path) -> None:
    plugin = tmp_path / "explodes.py"
    plugin.write_text("raise SystemExit('imported!')\n")
    registry.check_spec(f"{plugin}:score")  # the file exists: fine
    with pytest.raises(ValueError, match="unknown reward 'nope'"):
        registry.check_spec("nope")
    with pytest.raises(ValueError, match="not found"):
        registry.check_spec(f"{tmp_path}/nowhere.py:score")


def test_absolute_spec_makes_file_paths_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert absolute_spec("rel.py:score") == f"{tmp_path}/rel.py:score"
    assert absolute_spec("format") == "format"


def test_example_plugin_loads_by_path() -> None:
    fn = resolve(f"{EXAMPLE_PLUGIN}:score")
    short = call_reward_fn(fn, inp("<answer>red</answer>"))
    assert short == {"score": 1.0, "correct": 1.0, "length_penalty": 0.0}
    long_response = "<answer>red</answer>" + "x" * 280  # 300 chars: 100 over the free 200
    result = call_reward_fn(fn, inp(long_response))
    assert result == pytest.approx({"score": 0.9, "correct": 1.0, "length_penalty": 0.1})
    capped = call_reward_fn(fn, inp("<answer>blue</answer>" + "x" * 5000))
    assert capped == pytest.approx({"score": -0.5, "correct": 0.0, "length_penalty": 0.5})


def test_batched_example_plugin_with_a_row_column() -> None:
    manager = RewardManager([f"{EXAMPLE_PLUGIN.parent / 'relative_length.py'}:score"], isolation="inline")
    tokens, extras = [10, 10, 20, 40, 40], [{}, {}, {}, {}, {"max_penalty": 0.5}]
    batch = [inp("<answer>red</answer>", response_tokens=t, extra=e) for t, e in zip(tokens, extras)]
    result = manager.score(batch)["relative_length.score"]  # median 20 tokens: 20 past it is 100% longer, capped
    assert result.scores == pytest.approx([1.0, 1.0, 1.0, 0.8, 0.5])
    assert result.parts["length_penalty"] == pytest.approx([0, 0, 0, 0.2, 0.5])


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


# --- the prompt's text ---------------------------------------------------------------------------


def test_prompt_text_joins_the_user_turns() -> None:
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "<image>What colour?"},
                {"role": "assistant", "content": "red"}, {"role": "user", "content": "Sure?"},
                {"role": "user", "content": [{"type": "text"}]}]  # not a string: left out
    assert prompt_text(messages) == "<image>What colour?\nSure?"
    assert prompt_text([]) == ""


# --- RewardManager (inline: in this process; the worker processes are tested in test_reward_plugins.py) ---


def test_manager_scores_in_order_with_parts() -> None:
    def fn(response: str, ground_truth: str) -> dict[str, float]:
        return {"score": float(response), "twice": 2.0 * float(response)}

    manager = RewardManager([fn], timeout_s=2.0, isolation="inline")
    result = manager.score([inp(str(i)) for i in range(5)])
    assert list(result) == ["fn"] and manager.names == {fn: "fn"}
    assert result["fn"].scores == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert result["fn"].parts == {"twice": [0.0, 2.0, 4.0, 6.0, 8.0]}
    assert (result["fn"].failed, sum(result["fn"].failures.values()), result["fn"].errors) == ([False] * 5, 0, [])


def test_manager_isolates_errors_nan_and_late_results(caplog: pytest.LogCaptureFixture) -> None:
    def flaky(response: str, ground_truth: str) -> dict[str, float]:
        if response == "raise":
            raise RuntimeError("boom in user code")
        if response == "nan":
            return {"score": math.nan, "bonus": 1.0}
        if response == "inf":
            return {"score": 1.0, "bonus": math.inf}
        if response == "slow":
            time.sleep(0.3)  # past the timeout: inline cannot stop it, but its late result is a timeout
        return {"score": answer_match(response, ground_truth), "bonus": 0.5}

    responses = ["<answer>red</answer>", "raise", "nan", "slow", "<answer>blue</answer>", "inf", "red"]
    with caplog.at_level(logging.WARNING, logger="rewards.manager"):
        manager = RewardManager([flaky], timeout_s=0.2, isolation="inline")
        result = manager.score([inp(r) for r in responses])["flaky"]

    assert result.scores == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert result.failed == [False, True, True, True, False, True, False]
    assert result.parts == {"bonus": [0.5, None, None, None, 0.5, None, 0.5]}
    assert (result.failures["error"], result.failures["non_finite"], result.failures["timeout"]) == (1, 2, 1)
    label = "flaky (test_rewards.test_manager_isolates_errors_nan_and_late_results.<locals>.flaky)"
    assert any(e.startswith(f"{label}: sample 1: error: RuntimeError: boom in user code") for e in result.errors)
    assert any(e.startswith(f"{label}: sample 3: timeout") for e in result.errors)
    assert any(e.startswith(f"{label}: sample 2: non_finite") for e in result.errors)
    assert "boom in user code" in caplog.text and "flaky" in caplog.text

    assert result.metrics("flaky") == pytest.approx(
        {
            "reward/flaky/score": 2.0 / 7,
            "reward/flaky/bonus": 0.5,  # the mean over the samples that returned it
            "reward/flaky/failures": 4.0,
            "reward/flaky/failures/timeout": 1.0,
            "reward/flaky/failures/error": 1.0,
            "reward/flaky/failures/crashed": 0.0,
            "reward/flaky/failures/memory": 0.0,
            "reward/flaky/failures/bad_type": 0.0,
            "reward/flaky/failures/non_finite": 2.0,
            "reward/flaky/failures/out_of_range": 0.0,
        }
    )


def test_manager_caps_error_messages(caplog: pytest.LogCaptureFixture) -> None:
    def always_fails(response: str) -> float:
        raise ValueError(f"bad {response}")

    with caplog.at_level(logging.WARNING, logger="rewards.manager"):
        result = RewardManager([always_fails], timeout_s=1.0, isolation="inline").score([inp(str(i)) for i in range(20)])
    assert result["always_fails"].failures["error"] == 20
    assert result["always_fails"].scores == [0.0] * 20
    assert len(result["always_fails"].errors) == rewards.manager.MAX_ERROR_MESSAGES
    assert len(caplog.records) == rewards.manager.MAX_ERROR_MESSAGES + 1  # plus one summary line
    assert "15 more" in caplog.records[-1].getMessage()


def test_manager_counts_bad_return_type() -> None:
    result = RewardManager([lambda response: "1.0"], timeout_s=1.0, isolation="inline").score([inp("x")])["<lambda>"]
    assert result.failures["bad_type"] == 1 and result.scores == [0.0]
    assert "returned a str" in result.errors[0]


def test_manager_fails_scores_past_max_abs_score() -> None:
    manager = RewardManager([lambda response: float(response)], max_abs_score=10, isolation="inline")
    result = manager.score([inp("10"), inp("-10.5"), inp("3")])["<lambda>"]
    assert result.scores == [10.0, 0.0, 3.0]
    assert result.failures["out_of_range"] == 1
    assert "beyond max_abs_score=10" in result.errors[0]


def test_manager_isolates_functions_separately() -> None:
    def broken(response: str) -> float:
        raise RuntimeError("broken")

    result = RewardManager(["format", broken], isolation="inline").score([inp("<answer>red</answer>"), inp("red")])
    assert result["format"].scores == [1.0, 0.0] and not any(result["format"].failed)
    assert result["broken"].failures["error"] == 2


def test_inline_manager_runs_batched_and_async_functions() -> None:
    @batched
    def lengths(response: list[str]) -> list[float]:
        return [float(len(r)) for r in response]

    async def slow(response: str) -> float:
        await asyncio.sleep(5.0 if response == "slow" else 0.1)
        return 1.0

    manager = RewardManager([lengths, slow], timeout_s=0.5, isolation="inline")
    start = time.monotonic()
    result = manager.score([inp("ab"), inp("slow"), inp("abc"), inp("a")])
    assert time.monotonic() - start < 1.5  # concurrent, and the slow one cancelled at its timeout
    assert result["lengths"].scores == [2.0, 4.0, 3.0, 1.0]
    assert result["slow"].scores == [1.0, 0.0, 1.0, 1.0]
    assert result["slow"].failures["timeout"] == 1


def test_manager_runs_each_function_on_the_samples_asked() -> None:
    calls: list[str] = []

    def seen(response: str) -> float:
        calls.append(response)
        return 1.0

    manager = RewardManager([seen, "format"], isolation="inline")
    result = manager.score([inp("a"), inp("b"), inp("c")], {seen: [2, 0]})
    assert calls == ["c", "a"] and result["seen"].asked == [2, 0] and result["seen"].scores == [1.0, 0.0, 1.0]
    assert result["format"].asked == [0, 1, 2]  # not named in asked: every sample
    assert manager.score([inp("a")], {seen: []})["seen"].metrics("seen")["reward/seen/score"] == 0.0
    assert calls == ["c", "a"]


def test_manager_resolves_specs_and_checks_arguments() -> None:
    # A parameter that is not a field is a data-row column: a sample without it fails, naming it.
    needs_tokens = RewardManager([lambda response, tokens: float(len(tokens))], isolation="inline")
    result = needs_tokens.score([inp("x", extra={"other": 1}), inp("x", extra={"tokens": [1, 2]})])["<lambda>"]
    assert result.scores == [0.0, 2.0]
    assert "'tokens'" in result.errors[0] and "['other']" in result.errors[0]
    with pytest.raises(ValueError, match="timeout_s"):
        RewardManager(["format"], timeout_s=0)
    with pytest.raises(ValueError, match="num_workers"):
        RewardManager(["format"], num_workers=0)
    with pytest.raises(ValueError, match="max_abs_score"):
        RewardManager(["format"], max_abs_score=-1)
    with pytest.raises(ValueError, match="isolation"):
        RewardManager(["format"], isolation="threads")
    with pytest.raises(ValueError, match="no_such_reward"):
        RewardManager(["format", "no_such_reward"])
    with pytest.raises(TypeError, match="list of reward specs"):
        RewardManager("format")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"inputs\[1\]"):
        needs_tokens.score([inp("x"), {"response": "x"}])  # type: ignore[list-item]


def test_function_names_are_short_and_unique(tmp_path: Path) -> None:
    manager = RewardManager([f"{EXAMPLE_PLUGIN}:score", "format", "format"])
    assert list(manager.names.values()) == ["length_penalty.score", "format"]  # "score" reads as the total
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "m.py").write_text("def f(response):\n    return 1.0\n")
    with pytest.raises(ValueError, match="weird name"):
        RewardManager([f"{tmp_path}/a/m.py:f", "weird name!"])
    specs = [f"{tmp_path}/a/m.py:f", f"{tmp_path}/b/m.py:f", f"{tmp_path}/a/../a/m.py:f"]
    assert list(RewardManager(specs).names.values()) == ["f", "m.f", "m.f_2"]


def test_empty_batch() -> None:
    manager = RewardManager(["format"])
    result = manager.score([])["format"]
    assert (result.scores, result.failed, result.asked, result.errors) == ([], [], [], [])
    assert result.metrics("format", prefix="r")["r/format/score"] == 0.0
    assert result.metrics("format", prefix="r")["r/format/failures"] == 0.0
    assert manager._pool.pids == []  # no worker process was started for nothing


def test_a_finite_reward_beyond_float32_scores_zero_like_a_nan():
    """1e39 is a finite Python float but inf in float32, where training would meet it."""
    import torch

    manager = RewardManager([lambda response: float(response)], timeout_s=5, max_abs_score=1e39, isolation="inline")
    result = manager.score([RewardInput(response=r, ground_truth="") for r in ("1e39", "-1e39", "3e38", "2")])["<lambda>"]
    assert result.scores == [0.0, 0.0, 3e38, 2.0] and result.failures["non_finite"] == 2
    assert torch.isfinite(torch.tensor(result.scores, dtype=torch.float32)).all()

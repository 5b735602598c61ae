"""Reward plugins that cannot hurt the run: real RewardManagers with real worker processes.

Each misbehaving plugin (raises, hangs, holds the GIL, exits, segfaults, eats memory, returns
garbage) must cost only its own sample: the other samples and functions score as usual, the failure
is counted by kind and logged, and the pool keeps working. Managers are shared per module to keep the
number of worker processes (and the file's run time) small.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from PIL import Image

from rewards import FunctionResult, RewardInput, RewardManager, register
from rewards import registry
from rewards.types import FAILURE_KINDS

PLUGINS = Path(__file__).resolve().parents[1] / "fixtures" / "reward_plugins"
FAULTY = PLUGINS / "faulty.py"
KINDS = PLUGINS / "kinds.py"

TIMEOUT_S = 2.0  # a loaded machine (CI runs the unit tests beside the Ray tests) must not miss a deadline
HANG_MARGIN_S = 30.0  # a bound on what a hang may cost beyond timeout_s (a loaded machine: seconds), not a speed target


def sample(response: str, ground_truth: str = "red", **kwargs: object) -> RewardInput:
    return RewardInput(response=response, ground_truth=ground_truth, **kwargs)


def total(results: dict[str, FunctionResult]) -> list[float]:
    """Per sample, the sum of every function's score (0 where it failed)."""
    return [sum(values) for values in zip(*(r.scores for r in results.values()))]


@pytest.fixture(scope="module")
def faulty() -> Iterator[RewardManager]:
    """exact + misbehave, isolated separately, on 2 workers with a TIMEOUT_S timeout and 300 MB of memory."""
    manager = RewardManager([f"{FAULTY}:exact", f"{FAULTY}:misbehave"], timeout_s=TIMEOUT_S,
                            num_workers=2, max_memory_mb=300, max_abs_score=1e4)
    seconds = manager.start()
    print(f"\npool of 2 reward workers started in {seconds:.2f} s")
    yield manager
    manager.close()


@pytest.fixture
def warnings(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.WARNING, logger="rewards.manager")
    return caplog


# Response -> the failure kind it provokes, and a fragment of its message.
FAILURES = {
    "raise": ("error", "RuntimeError: boom in plugin (at faulty.py"),
    "hang": ("timeout", f"did not return within {TIMEOUT_S:g} s"),
    "regex": ("timeout", f"did not return within {TIMEOUT_S:g} s"),
    "exit": ("crashed", "exit code 1"),
    "segfault": ("crashed", "killed by SIGSEGV"),
    "sigkill": ("crashed", "killed by SIGKILL"),
    "nan": ("non_finite", "nan"),
    "inf_part": ("non_finite", "inf"),
    "1e39": ("non_finite", "beyond float32's range"),
    "string": ("bad_type", "returned a str"),
    "none": ("bad_type", "returned a NoneType"),
    "list": ("bad_type", "returned a list"),
    "no_score": ("bad_type", "without 'score'"),
    "text_part": ("bad_type", "non-numeric values for keys ['note']"),
    "object": ("bad_type", "returned a object"),
    "too_big": ("out_of_range", "beyond max_abs_score=10000"),
}


@pytest.mark.parametrize("action", list(FAILURES))
def test_a_failing_plugin_costs_only_its_own_sample(faulty: RewardManager, warnings, action: str) -> None:
    kind, fragment = FAILURES[action]
    # Sample 2 provokes the failure; its ground truth matches, so `exact` still scores it 1.
    batch = [sample("red"), sample("blue"), sample(action, action), sample("red")]
    start = time.monotonic()
    result = faulty.score(batch)
    elapsed = time.monotonic() - start
    print(f"\n{action}: call returned in {elapsed:.2f} s")

    misbehave, exact = result["misbehave"], result["exact"]
    assert misbehave.scores == [1.0, 0.0, 0.0, 1.0]
    assert misbehave.failed == [False, False, True, False]
    assert misbehave.failures == {k: int(k == kind) for k in FAILURE_KINDS}
    assert exact.scores == [1.0, 0.0, 1.0, 1.0] and not any(exact.failed)  # isolated separately

    metrics = misbehave.metrics("misbehave") | exact.metrics("exact")
    assert metrics["reward/misbehave/failures"] == 1.0
    assert metrics[f"reward/misbehave/failures/{kind}"] == 1.0
    assert metrics["reward/exact/failures"] == 0.0
    assert metrics["reward/misbehave/score"] == pytest.approx(2.0 / 4)
    assert metrics["reward/exact/chars"] == pytest.approx((3 + 4 + len(action) + 3) / 4)

    assert exact.errors == [] and len(misbehave.errors) == 1
    assert misbehave.errors[0].startswith(f"misbehave ({FAULTY}:misbehave): sample 2: {kind}")
    assert fragment in misbehave.errors[0]
    [record] = [r for r in warnings.records if "misbehave" in r.getMessage()]
    assert "sample 2" in record.getMessage() and fragment in record.getMessage()
    if kind in ("timeout", "crashed", "memory"):
        assert elapsed < TIMEOUT_S + HANG_MARGIN_S

    # The pool keeps working: the next call scores normally.
    assert total(faulty.score([sample("red"), sample("red", "blue")])) == [2.0, 0.0]


def test_several_failures_in_one_call_each_cost_one_sample(faulty: RewardManager) -> None:
    actions = ["hang", "exit", "raise", "nan"]
    batch = [sample(a, a) for a in actions] + [sample("red")] * 4
    start = time.monotonic()
    result = faulty.score(batch)
    print(f"\nhang + exit + raise + nan in one call: {time.monotonic() - start:.2f} s")
    assert result["misbehave"].scores == [0.0] * 4 + [1.0] * 4
    assert result["exact"].scores == [1.0] * 8
    assert result["misbehave"].failed == [True] * 4 + [False] * 4
    counts = result["misbehave"].failures
    assert (counts["timeout"], counts["crashed"], counts["error"], counts["non_finite"]) == (1, 1, 1, 1)


def test_a_worker_killed_from_outside_while_idle_is_replaced(faulty: RewardManager) -> None:
    pool = faulty._pool
    faulty.start()
    victim = pool.pids[0]
    os.kill(victim, signal.SIGKILL)
    psutil.Process(victim).wait(timeout=5) if psutil.pid_exists(victim) else None
    result = faulty.score([sample("red")] * 6)
    assert total(result) == [2.0] * 6 and not any(result["misbehave"].failed + result["exact"].failed)
    assert victim not in pool.pids and len(pool.pids) == 2


def test_a_sample_that_cannot_be_sent_fails_alone(faulty: RewardManager) -> None:
    batch = [sample("red"), sample("red", model_image_sizes=[lambda: 0]), sample("red")]
    result = faulty.score(batch)
    assert total(result) == [2.0, 0.0, 2.0]
    assert result["misbehave"].failures["error"] == 1
    assert "could not be sent to a reward worker" in result["misbehave"].errors[0]
    # Bulky fields a function does not read (images, videos, extra) are not sent to it at all.
    assert total(faulty.score([sample("red", extra={"callback": lambda: 0})])) == [2.0]


def test_worker_start_is_light_and_timed() -> None:
    with RewardManager([f"{KINDS}:heavy_imports"], num_workers=1) as manager:
        seconds = manager.start()
        print(f"\none reward worker started in {seconds:.2f} s")
        assert seconds < 30
        parts = manager.score([sample("x")])["heavy_imports"].parts
    assert parts == {"torch": [0.0], "transformers": [0.0], "ray": [0.0]}


# --- kinds of function ------------------------------------------------------------------------------


def test_batched_function_gets_lists_and_a_wrong_length_fails_the_whole_call(warnings) -> None:
    specs = [f"{KINDS}:batch_match", f"{KINDS}:batch_short"]
    with RewardManager(specs, num_workers=1, timeout_s=5) as manager:
        result = manager.score([sample("red"), sample("blue"), sample("red")])
    match, short = result["batch_match"], result["batch_short"]
    assert match.scores == [1.0, 0.0, 1.0] and match.parts == {"batch": [3.0, 3.0, 3.0]}
    assert short.scores == [0.0] * 3 and short.failures["bad_type"] == 3 and short.failed == [True] * 3
    assert "returned 2 results for 3 samples" in short.errors[0]
    # Asked for two of the samples, a batched function gets a list of two.
    assert manager.score([sample("red")] * 3, {specs[0]: [0, 2]})["batch_match"].parts == {"batch": [2.0, None, 2.0]}


def test_async_function_runs_samples_concurrently() -> None:
    with RewardManager([f"{KINDS}:slow_match"], num_workers=1, timeout_s=2.0) as manager:
        manager.start()
        batch = [sample("red"), sample("blue")] * 4  # 8 samples of 0.5 s each: 4 s one after another
        start = time.monotonic()
        result = manager.score(batch)
        elapsed = time.monotonic() - start
        print(f"\n8 async samples of 0.5 s: {elapsed:.2f} s")
        assert result["slow_match"].scores == [1.0, 0.0] * 4
        assert elapsed < 2.0

        # A sample past the timeout is cancelled in the worker, which survives.
        pids = manager._pool.pids
        result = manager.score([sample("slow"), sample("red")])
        assert result["slow_match"].scores == [0.0, 1.0]
        assert result["slow_match"].failures["timeout"] == 1
        assert manager._pool.pids == pids


def test_row_columns_are_keywords(warnings) -> None:
    with RewardManager([f"{KINDS}:by_difficulty"], num_workers=1, timeout_s=5) as manager:
        result = manager.score([
            sample("red", extra={"difficulty": 2.0}),
            sample("red", extra={"difficulty": 0.5, "bonus": 1.0}),
            sample("red", extra={"level": 3}),
        ])["by_difficulty"]
    assert result.scores == [2.0, 1.5, 0.0]
    assert result.failures["error"] == 1
    message = result.errors[0]
    assert "TypeError" in message and "'difficulty'" in message and "['level']" in message
    assert "sample 2" in warnings.text


def test_newer_input_fields_reach_the_function() -> None:
    image = Image.new("RGB", (40, 30))
    inp = sample("red", prompt="What colour?", images=[image], model_image_sizes=[(56, 28)], response_tokens=12,
                 max_response_tokens=48)
    with RewardManager([f"{KINDS}:input_fields"], num_workers=1, timeout_s=5) as manager:
        result = manager.score([inp])
    component = result["input_fields"]
    assert component.scores == [0.25]
    assert component.parts == {"prompt_chars": [12.0], "first_width": [56.0], "image_width": [40.0]}


def test_each_function_runs_on_the_samples_asked_of_it() -> None:
    specs = [f"{KINDS}:numeric_match", "answer_match"]
    with RewardManager(specs, num_workers=1, timeout_s=5) as manager:
        batch = [sample("3.0", "3"), sample("<answer>red</answer>"), sample("3.0", "3")]
        result = manager.score(batch, {specs[0]: [0, 2], "answer_match": [1]})
    assert result["numeric_match"].scores == [1.0, 0.0, 1.0] and result["numeric_match"].asked == [0, 2]
    assert result["answer_match"].scores == [0.0, 1.0, 0.0] and result["answer_match"].asked == [1]
    assert result["answer_match"].metrics("answer_match")["reward/answer_match/score"] == 1.0  # over its one sample


def test_a_plugin_that_fails_to_load_fails_its_samples(tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("raise ImportError('missing dependency xyz')\ndef score(response):\n    return 1.0\n")
    with RewardManager([f"{broken}:score", "format"], num_workers=1, timeout_s=5) as manager:
        result = manager.score([sample("<answer>red</answer>"), sample("red")])
    assert total(result) == [1.0, 0.0]
    assert result["broken.score"].failures["error"] == 2  # "score" alone would read as the stage's total
    assert "missing dependency xyz" in result["broken.score"].errors[0]


def test_a_plugin_that_exhausts_memory_costs_its_sample_a_memory_failure() -> None:
    """Its own pool with a long timeout: on a loaded machine the deadline must not come first."""
    with RewardManager([f"{FAULTY}:misbehave"], timeout_s=60.0, num_workers=1, max_memory_mb=300) as manager:
        result = manager.score([sample("memory", "memory"), sample("red")])["misbehave"]
    assert result.failed == [True, False] and result.scores == [0.0, 1.0]
    assert result.failures == {k: int(k == "memory") for k in FAILURE_KINDS}
    assert "past max_memory_mb=300" in result.errors[0]


def test_a_plugin_whose_import_hangs_is_killed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mmrl.plugins import pool

    monkeypatch.setattr(pool, "LOAD_TIMEOUT_S", TIMEOUT_S)  # the parent enforces it: patching here suffices
    stuck = tmp_path / "stuck.py"
    stuck.write_text("import time\ntime.sleep(10**6)\ndef never(response):\n    return 1.0\n")
    with RewardManager([f"{stuck}:never", "format"], num_workers=2, timeout_s=TIMEOUT_S) as manager:
        manager.start()
        start = time.monotonic()
        result = manager.score([sample("<answer>red</answer>"), sample("red")] * 2)
        elapsed = time.monotonic() - start
    print(f"\nhanging import: call returned in {elapsed:.2f} s")
    assert total(result) == [1.0, 0.0] * 2
    assert result["never"].failures["timeout"] == 4
    assert f"loading the reward function took over {TIMEOUT_S:g} s" in result["never"].errors[0]
    assert elapsed < TIMEOUT_S + HANG_MARGIN_S


# --- lifecycle ----------------------------------------------------------------------------------------


def test_close_and_garbage_collection_leave_no_process() -> None:
    manager = RewardManager(["format"], num_workers=2)
    manager.start()
    pids = manager._pool.pids
    assert len(pids) == 2 and all(psutil.pid_exists(pid) for pid in pids)
    manager.close()
    assert not any(psutil.pid_exists(pid) for pid in pids)
    assert manager.score([sample("<answer>red</answer>")])["format"].scores == [1.0]  # a closed manager restarts
    pids = manager._pool.pids
    del manager
    gc.collect()
    assert not any(psutil.pid_exists(pid) for pid in pids)


def test_process_isolation_needs_specs_workers_can_resolve(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(TypeError, match="isolation='inline'"):
        RewardManager([lambda response: 1.0])
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    register("only_in_driver")(lambda response: 1.0)
    with pytest.raises(ValueError, match="only_in_driver"):
        RewardManager(["only_in_driver", "format"])
    RewardManager(["only_in_driver"], isolation="inline")  # fine in the driver
    with pytest.raises(ValueError, match="not found"):
        RewardManager([f"{PLUGINS}/nowhere.py:score"])
    with pytest.raises(ValueError, match="unknown reward 'no_such'"):
        RewardManager(["format", "no_such"])
    with pytest.raises(TypeError, match="list of reward specs"):
        RewardManager({"format": 1.0})  # type: ignore[arg-type]  # weights are the reward stage's


def test_a_plugin_that_hangs_on_every_sample_costs_one_timeout_per_batch(
    faulty: RewardManager, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once its first calls (one per worker) all time out, the rest of the batch is not tried: the step
    waits about one timeout, not one per sample; the next batch tries it again (and the pool still works).
    The plugin logs each call, so the test counts the samples tried instead of timing the batch."""
    calls = tmp_path / "calls.txt"
    monkeypatch.setenv("MMRL_TEST_CALLS_FILE", str(calls))  # the workers inherit it
    workers = 2
    with RewardManager([f"{FAULTY}:always_hang", "format"], timeout_s=TIMEOUT_S, num_workers=workers) as manager:
        manager.start()
        batch = [sample(f"<answer>{i}</answer>") for i in range(16)]
        for round_ in range(1, 3):
            began = time.monotonic()
            result = manager.score(batch)
            elapsed = time.monotonic() - began
            print(f"16 samples, a plugin hung on every one, timeout {TIMEOUT_S:g} s: {elapsed:.2f} s")
            tried = calls.read_text().splitlines() if calls.exists() else []
            assert 1 <= len(tried) <= workers * round_, f"{len(tried)} samples tried after {round_} batches"
            assert result["always_hang"].failures["timeout"] == 16
            assert result["format"].scores == [1.0] * 16 and not any(result["format"].failed)
    assert not any(r.failed[0] for r in faulty.score([sample("red")]).values())  # the other pool is unharmed


def test_a_hung_plugin_whose_first_calls_start_apart_is_tried_once_per_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Worker 1 starts the hung plugin at once (samples 0-1), worker 2 after 1.5 s of another function (samples
    2-3). When worker 1's call times out, its replacement must not start sample 1 while worker 2's first call
    of the plugin is still running: that call decides (it times out too, so the rest fails at once)."""
    calls = tmp_path / "calls.txt"
    monkeypatch.setenv("MMRL_TEST_CALLS_FILE", str(calls))
    with RewardManager([f"{FAULTY}:slow_ok", f"{FAULTY}:always_hang"], timeout_s=2.0, num_workers=2) as manager:
        manager.start()
        result = manager.score([sample(f"<answer>{i}</answer>") for i in range(4)])
    assert sorted(calls.read_text().splitlines()) == ["<answer>0</answer>", "<answer>2</answer>"]
    assert result["always_hang"].failures["timeout"] == 4 and result["slow_ok"].scores == [1.0] * 4


def test_an_installed_plugin_is_found_by_its_entry_point_in_the_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real distribution on sys.path declaring ``[mmrl.rewards] shout = ...``: the driver lists it and the
    worker processes (which get the driver's sys.path) load it by name."""
    (tmp_path / "mmrl_test_plugin.py").write_text("def shout(response):\n    return float(response.isupper())\n")
    dist = tmp_path / "mmrl_test_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: mmrl-test-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[mmrl.rewards]\nshout = mmrl_test_plugin:shout\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "shout" in registry.available()
    with RewardManager(["shout", "format"], num_workers=1, timeout_s=5) as manager:
        result = manager.score([sample("LOUD"), sample("quiet")])
    assert result["shout"].scores == [1.0, 0.0] and result["format"].scores == [0.0, 0.0]

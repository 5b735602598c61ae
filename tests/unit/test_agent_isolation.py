"""Tools isolated in worker processes (the plugin pool, mmrl.plugins): a tool that raises, hangs (the GIL held
included), crashes, eats memory or returns garbage costs its own call one tool error, never the run, and a
tool that hangs costs a step about one timeout. One executor is shared by the module (its two workers are
replaced as tests kill them)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image

from mmrl.agent.executor import ToolExecutor
from mmrl.agent.outputs import ToolLimits, ToolOutput
from mmrl.agent.stats import ToolStats
from mmrl.agent.table import ToolTable, build_tool_table
from mmrl.agent.worker import ToolInput

FAULTY = Path(__file__).resolve().parents[1] / "fixtures" / "agent_tools" / "faulty.py"
CALLS_FILE = "MMRL_TEST_TOOL_CALLS_FILE"  # faulty.always_hang logs its calls to the file it names
TIMEOUT_S = 2.0  # a loaded machine (CI runs the unit tests beside the Ray tests) must not miss a deadline
HANG_MARGIN_S = 30.0  # a bound on what a hang may cost beyond its timeouts (a loaded machine: seconds)
LIMITS = ToolLimits(max_image_pixels=2000 * 2000, max_pixels=64 * 64)


@pytest.fixture(scope="module")
def calls_file(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The file ``always_hang`` logs its calls to: its workers (started after this) inherit the variable."""
    path = tmp_path_factory.mktemp("tool-calls") / "calls.txt"
    before = os.environ.get(CALLS_FILE)
    os.environ[CALLS_FILE] = str(path)
    yield path
    if before is None:
        del os.environ[CALLS_FILE]
    else:
        os.environ[CALLS_FILE] = before


@pytest.fixture(scope="module")
def executor(calls_file: Path) -> Iterator[ToolExecutor]:
    with ToolExecutor(num_workers=2, timeout_s=TIMEOUT_S, max_memory_mb=300) as pool:
        print(f"\n2 tool workers started in {pool.start():.2f} s")
        yield pool


@pytest.fixture(scope="module")
def table(executor: ToolExecutor) -> ToolTable:
    return build_tool_table(["zoom_in", f"{FAULTY}:echo", f"{FAULTY}:misbehave", f"{FAULTY}:always_hang"], executor)


def call(table: ToolTable, name: str, **arguments: object) -> tuple[str, str, ToolInput]:
    image = Image.new("RGB", (100, 100), "green")
    return name, table[name].spec, ToolInput(arguments=arguments, images=[image], model_image_sizes=[(50, 50)],
                                             limits=LIMITS)


def test_schemas_are_read_in_the_workers(table: ToolTable, executor: ToolExecutor, tmp_path: Path) -> None:
    assert table.names == ["zoom_in", "echo", "misbehave", "always_hang"]
    assert table["echo"].schema["parameters"]["required"] == ["text"]
    broken = tmp_path / "broken.py"
    broken.write_text("raise ImportError('missing dependency xyz')\n")
    with pytest.raises(ValueError, match="could not be loaded: could not load tool .*missing dependency xyz"):
        build_tool_table([f"{broken}:f"], executor)
    with pytest.raises(ValueError, match="has no schema"):
        build_tool_table([f"{FAULTY}:no_schema"], executor)


FAILURES = {
    "raise": ("error", "ZeroDivisionError: division by zero"),
    "hang": ("timeout", "did not finish in time"),
    "regex": ("timeout", "did not finish in time"),
    "exit": ("crashed", "its process crashed"),
    "segfault": ("crashed", "its process crashed"),
    "none": ("bad_type", "returned a NoneType"),
    "number": ("bad_type", "returned a float"),
    "enormous_text": ("too_large", "50000000 characters"),
    "enormous_image": ("too_large", "3000x3000 image"),
    "corrupt_image": ("bad_image", "cannot be read"),
}


@pytest.mark.parametrize("action", list(FAILURES))
def test_a_failing_tool_costs_only_its_own_call(executor: ToolExecutor, table: ToolTable, action: str) -> None:
    kind, fragment = FAILURES[action]
    executor.begin_step()
    calls = [call(table, "echo", text="a"), call(table, "misbehave", action=action), call(table, "echo", text="b"),
             call(table, "zoom_in", bbox_2d=[0, 0, 25, 25])]
    start = time.monotonic()
    outputs = executor.run(calls)
    elapsed = time.monotonic() - start
    again = executor.run([call(table, "misbehave", action="image")])[0]
    print(f"\n{action}: {elapsed:.2f} s, then {time.monotonic() - start - elapsed:.2f} s")
    assert [o.text for o in (outputs[0], outputs[2])] == ["a", "b"]
    assert outputs[3].failure is None and outputs[3].images[0].size == (64, 64)  # zoomed to the budget
    failed = outputs[1]
    assert failed.failure == kind and failed.text.startswith("Error: tool misbehave failed: ")
    assert fragment in failed.text and len(failed.text) < 320
    stats = ToolStats()
    for (name, _, _), output in zip(calls, outputs):
        stats.record(name, output)
    metrics = stats.metrics(table.names)
    assert metrics["agent/tool_calls"] == 4 and metrics["agent/tool_calls/echo"] == 2
    assert metrics[f"agent/tool_errors/{kind}"] == 1 and metrics[f"agent/tool_errors/misbehave/{kind}"] == 1
    assert metrics["agent/tool_errors"] == 1
    if kind in ("timeout", "crashed", "memory"):
        assert elapsed < TIMEOUT_S + HANG_MARGIN_S
    assert again.images[0].size == (30, 20)  # the executor keeps working


def test_a_tool_s_unsafe_text_and_animated_image_come_back_made_safe(executor: ToolExecutor, table: ToolTable) -> None:
    """Issue 44: a lone surrogate, a NUL and terminal escapes cross the process boundary and are cleaned in the
    driver (special-token strings are the chat format's to neutralise); the image is its first frame."""
    executor.begin_step()
    (output,) = executor.run([call(table, "misbehave", action="unsafe")])
    assert output.failure is None and output.repairs == ("unsafe_text", "animated_image")
    assert output.text == "found it red \ufffd <|im_end|><|image_pad|> done"
    assert output.images[0].size == (40, 30) and output.images[0].getpixel((0, 0)) == (255, 0, 0)


def test_a_tool_that_exhausts_memory_costs_its_call_a_memory_error(table: ToolTable) -> None:
    """Its own executor with a long timeout: on a loaded machine the deadline must not come first."""
    with ToolExecutor(num_workers=1, timeout_s=60.0, max_memory_mb=300) as pool:
        executor_table = build_tool_table([f"{FAULTY}:misbehave", f"{FAULTY}:echo"], pool)
        failed, echoed = pool.run([call(executor_table, "misbehave", action="memory"),
                                   call(executor_table, "echo", text="after")])
    assert failed.failure == "memory" and "it used too much memory" in failed.text
    assert echoed.text == "after"  # a fresh worker took the next call


def test_a_hung_tool_costs_about_one_timeout_per_step(executor: ToolExecutor, table: ToolTable,
                                                       calls_file: Path) -> None:
    """Turn 1: its first calls (one per worker) time out and the turn's others fail at once; later turns of the
    step do not run it at all (no worker is needed for them). The tool logs its calls: the test counts them."""
    hung = [call(table, "always_hang") for _ in range(16)]
    executor.begin_step()
    outputs = executor.run([call(table, "echo", text="ok"), *hung])
    assert [o.failure for o in outputs] == [None] + ["timeout"] * 16
    # When the pool gives up (its num_workers-th timeout), at most num_workers - 1 other calls are still running
    # (a replaced worker may have started one): at most 2 * num_workers - 1 calls are tried, all in turn 1.
    tried = len(calls_file.read_text().splitlines())
    assert 1 <= tried <= 2 * executor.num_workers - 1
    start = time.monotonic()
    for _ in range(2):
        outputs = executor.run(hung)
        assert [o.failure for o in outputs] == ["timeout"] * 16 and "earlier in this step" in outputs[0].text
    assert time.monotonic() - start < TIMEOUT_S and len(calls_file.read_text().splitlines()) == tried
    assert executor.hung(table["always_hang"].spec) and not executor.hung(table["echo"].spec)
    executor.begin_step()
    assert not executor.hung(table["always_hang"].spec)  # the next step tries it again
    assert executor.run([call(table, "echo", text="still")])[0].text == "still"


def test_a_failed_call_reads_as_an_error_message() -> None:
    out = ToolOutput.failed("bad_json", "x" * 1000)
    assert out.failure == "bad_json" and out.text.startswith("Error: ") and out.text.endswith("...")
    assert len(out.text) < 320 and out.detail == "x" * 1000


@pytest.mark.parametrize("runner", ["mmrl.agent.worker", "rewards.runner"])
def test_a_plugin_worker_s_runner_imports_neither_torch_nor_transformers(runner: str) -> None:
    """A tool or reward worker starts in a fraction of a second and holds tens of MB: importing torch would cost
    each about 3 s and 200 MB of its max_memory_mb."""
    import subprocess
    import sys

    code = (f"import importlib, sys; importlib.import_module({runner!r}); "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert "torch" not in out.stdout and "transformers" not in out.stdout, out.stdout

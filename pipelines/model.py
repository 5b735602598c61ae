"""Stage ``make model``: build a tiny VLM of the family ``model.family`` (default Qwen2.5-VL; also qwen2_vl,
qwen3_vl, smolvlm): random init, BPE tokenizer trained on the task corpus.

Writes a Hugging Face checkpoint folder at ``model.path`` (config, weights, tokenizer, processors).
A real checkpoint needs no such stage: point ``model.path`` at it (its family is read from its config).

    python -m pipelines.model --config configs/demo.yaml tiny_model.hidden_size=256
    python -m pipelines.model model.family=qwen3_vl model.path=outputs/model/tiny-qwen3-vl
"""

from __future__ import annotations

from collections.abc import Iterator

from data_prep.digits_task import TASK as DIGITS
from data_prep.digits_task import digits_corpus
from data_prep.palette import COLOURS
from data_prep.synthetic import IMAGE_TASKS, SHAPES, corpus_texts, generate_rows
from data_prep.synthetic_video import VIDEO_ANSWERS, VIDEO_QUESTIONS, VIDEO_TASKS
from data_prep.zoom_task import TASK as ZOOM
from data_prep.zoom_task import ZOOM_TOOL
from mmrl.answer_format import format_answer
from mmrl.config import Config
from mmrl.models.families import family_named
from mmrl.models.loading import load_model
from mmrl.models.tiny import build_tiny_vlm, count_parameters
from pipelines.cli import parse
from pipelines.data import zoom_board


BASE_TASKS = ("colour", "count", "shape")


def task_corpus(cfg: Config, rows_per_task: int = 200) -> Iterator[str]:
    """Questions and answers of the base image tasks (colour, count, shape) and of every other task in
    ``data.tasks``, answers also in the trained answer format.

    The tokenizer covers exactly the tasks it will see; the base tasks are always in, so an image-only
    config gets the same tokenizer whatever other tasks exist.
    """
    extra = [task for task in cfg.data.tasks if task not in BASE_TASKS]
    for task in [*BASE_TASKS, *(t for t in extra if t in IMAGE_TASKS)]:
        rows = generate_rows(task, rows_per_task, seed=cfg.seed, image_size=56, max_count=max(2, cfg.data.max_count))
        for text in corpus_texts(rows):
            yield text
        for row in rows:
            yield format_answer(row["answer"])
    for task in (t for t in extra if t in VIDEO_TASKS):  # their texts only: no clip is needed for a tokenizer
        answers = VIDEO_ANSWERS[task]
        for i in range(rows_per_task):
            answer = answers[i % len(answers)]
            yield from [VIDEO_QUESTIONS[task], answer, format_answer(answer)]
    if ZOOM in extra:
        yield from zoom_corpus(cfg)
    if DIGITS in extra:
        yield from digits_corpus()
    if cfg.rollout.agent.enabled:
        yield from agent_corpus(cfg)
    yield from ["user", "assistant", "system"]


def zoom_corpus(cfg: Config, copies: int = 20) -> Iterator[str]:
    """The zoom task's texts: every question, a call on every cell (at the tiny model's view, in the tool-call
    format of ``model.family``) and the answers."""
    calls = family_named(cfg.model.family).tool_calls
    spec = zoom_board(cfg)
    for _ in range(copies):
        for row in range(spec.grid):
            for col in range(spec.grid):
                for kind in SHAPES:
                    yield spec.question(kind, row, col)
                yield calls.format_call(ZOOM_TOOL, {"bbox_2d": spec.view_box(row, col)})
        for colour in COLOURS:
            yield format_answer(colour)


def agent_corpus(cfg: Config, copies: int = 50) -> Iterator[str]:
    """An agent run's own texts, in the tool-call format of ``model.family``: its tools' block in the system
    message, a call of each tool and an empty tool response, so that a tokenizer trained for the run spends few
    tokens on them."""
    from mmrl.agent.executor import ToolExecutor
    from mmrl.agent.table import build_tool_table

    calls = family_named(cfg.model.family).tool_calls
    with ToolExecutor(isolation="inline") as describer:
        tools = build_tool_table(cfg.rollout.agent.tools, describer, fmt=calls).definitions()
    for _ in range(copies):
        yield calls.tools_block(tools)
        for tool in tools:
            yield calls.format_call(tool["function"]["name"], {})
        yield calls.tool_responses([""])


def main(argv: list[str] | None = None) -> None:
    cfg = parse(__doc__, argv)
    path = build_tiny_vlm(task_corpus(cfg), cfg.tiny_model, cfg.model.path, cfg.seed, cfg.model.family)
    model = load_model(path)
    print(f"model: tiny {cfg.model.family} ({type(model).__name__}) with {count_parameters(model) / 1e6:.2f} M "
          f"parameters -> {path}")


if __name__ == "__main__":
    main()

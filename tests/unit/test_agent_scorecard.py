"""How an evaluation's episodes used their tools: calls per episode, episodes that called, and the share of zoom
calls that held the question's shape (the zoom task's ground truth), counted by hand here."""

from __future__ import annotations

import json

import pytest

from data_prep.zoom_task import ZoomTaskSpec, generate_zoom_rows
from mmrl.agent.scorecard import ToolUse

SPEC = ZoomTaskSpec()


def episode(*calls: dict) -> dict:
    """An episode record as :func:`mmrl.agent.rollout.episode_record` writes it (what the scorecard reads)."""
    return {"calls": list(calls), "model_image_sizes": [[SPEC.view_side, SPEC.view_side]]}


def zoom(box: list[float], **extra) -> dict:
    return {"turn": 0, "name": "zoom_in", "arguments": {"bbox_2d": box, **extra}, "text": "", "failure": None,
            "images": []}


def test_calls_episodes_and_region_hits_are_counted_on_zoom_rows() -> None:
    rows, _, _ = generate_zoom_rows(3, seed=5, spec=SPEC, id_prefix="s")
    cell = [json.loads(r["extra"])["view_box"] for r in rows]
    use = ToolUse()
    use.add(rows[0], episode(zoom(cell[0])))  # the question's cell: a hit
    use.add(rows[1], episode(zoom([0, 0, SPEC.view_side, SPEC.view_side]), zoom(cell[1], image=1)))  # whole board; other image
    use.add(rows[2], episode())  # answered without a call
    malformed = {"turn": 0, "name": None, "error": "bad_json", "text": "", "failure": None, "images": []}
    use.add(rows[2], episode(malformed, {**zoom(cell[2]), "name": "calculator"}))  # no region call among them
    assert use.metrics("eval/agent") == {
        "eval/agent/tool_calls_per_episode": pytest.approx(5 / 4),
        "eval/agent/episodes_with_calls": pytest.approx(3 / 4),
        "eval/agent/region_hits": pytest.approx(1 / 3),  # 3 zoom calls on rows with a ground truth, 1 hit
    }


def test_rows_without_a_ground_truth_count_calls_but_no_hits() -> None:
    row = {"images": [], "extra": json.dumps({"task": "colour"})}
    use = ToolUse()
    use.add(row, episode(zoom([0, 0, 10, 10])))
    assert use.metrics("x") == {"x/tool_calls_per_episode": 1.0, "x/episodes_with_calls": 1.0}


@pytest.mark.parametrize("box", [[40, 40, 30, 50], [1, 2, 3], "everything", [0, 0, "x", 4]])
def test_a_box_the_tool_would_refuse_is_a_miss_not_an_error(box) -> None:
    rows, _, _ = generate_zoom_rows(1, seed=6, spec=SPEC, id_prefix="b")
    use = ToolUse()
    use.add(rows[0], episode(zoom(box)))
    assert use.metrics("x")["x/region_hits"] == 0.0

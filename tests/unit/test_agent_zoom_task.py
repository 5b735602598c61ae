"""The zoom task: boards whose answer is the named shape's colour, legibility checks with a quarantine that
counts every drawn row, demonstrations whose call (in the model family's tool-call format) and zoomed image are
the built-in tool's, and the ground-truth box that measures whether a call hit the right region."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator
from PIL import Image

from data_prep.palette import COLOURS
from data_prep.zoom_task import (
    DATA_SOURCE, QUESTION, ZoomTaskSpec, build_zoom_splits, generate_zoom_rows, write_zoom_splits,
)
from mmrl.agent.builtin import BUILTINS, zoom_in
from mmrl.agent.calls import ToolCall, parse_calls
from mmrl.agent.chat import ChatFormat
from mmrl.agent.regions import call_region, region_hit
from mmrl.agent.schemas import schema_of
from mmrl.models.encoding import encode_prompt
from mmrl.models.loading import load_processor
from mmrl.models.tool_calls import QWEN_TOOL_CALLS, QwenToolCalls
from mmrl.schema import decode_image, read_parquet, validate_row

SPEC = ZoomTaskSpec()


def test_rows_ask_for_the_colour_of_the_named_shape_in_the_named_cell() -> None:
    rows, quarantine, report = generate_zoom_rows(6, seed=3, spec=SPEC, id_prefix="t")
    assert report.summary() == "zoom: drawn=6 written=6 quarantined=0" and quarantine == []
    assert rows == generate_zoom_rows(6, seed=3, spec=SPEC, id_prefix="t")[0]  # deterministic in the seed
    for row in rows:
        validate_row(row)
        extra = json.loads(row["extra"])
        assert row["data_source"] == DATA_SOURCE
        assert row["messages"] == [{"role": "user", "content": "<image>" + QUESTION.format(kind=extra["kind"],
                                                                                          cell=extra["cell"])}]
        in_cell = [s for s in extra["shapes"] if s["cell"] == extra["cell"]]
        assert sorted(s["kind"] for s in in_cell) == ["circle", "square", "triangle"]
        assert len({s["colour"] for s in in_cell}) == 3 and len(extra["shapes"]) == 3 * SPEC.grid**2
        [target] = [s for s in in_cell if s["kind"] == extra["kind"]]
        assert row["answer"] == target["colour"]
        image = decode_image(row["images"][0])
        assert image.size == (SPEC.image_size, SPEC.image_size)
        left, top, right, bottom = extra["shape_box"]
        assert image.getpixel(((left + right) // 2, (top + bottom) // 2)) == COLOURS[row["answer"]]
        cl, ct, cr, cb = extra["cell_box"]
        assert cl <= left and ct <= top and right <= cr and bottom <= cb  # the shape lies in its cell
        assert (cr - cl) == SPEC.image_size // SPEC.grid
        side = right - left
        assert side * SPEC.view_side / SPEC.image_size <= SPEC.illegible_px  # too small unzoomed
        assert side * SPEC.zoom_view_side / SPEC.cell_side >= SPEC.legible_px  # legible zoomed


def test_cells_named_in_letters_carry_no_digit_and_name_the_same_cell() -> None:
    letters = ZoomTaskSpec(cell_names="letters", grid=9, image_size=9 * 60)
    grid = ZoomTaskSpec(grid=9, image_size=9 * 60)
    questions = {(r, c): letters.question("circle", r, c) for r in range(9) for c in range(9)}
    assert questions[(1, 1)] == "What colour is the circle in cell Bb?"
    assert questions[(8, 0)] == "What colour is the circle in cell Ia?"
    assert len(set(questions.values())) == 81 and not any(ch.isdigit() for q in questions.values() for ch in q)
    assert grid.question("square", 2, 3) == "What colour is the square in cell C4?"
    rows, _, _ = generate_zoom_rows(4, seed=3, spec=ZoomTaskSpec(cell_names="letters"), id_prefix="t")
    same_boards, _, _ = generate_zoom_rows(4, seed=3, spec=SPEC, id_prefix="t")
    for row, twin in zip(rows, same_boards):  # the naming changes the question only
        extra = json.loads(row["extra"])
        assert extra == json.loads(twin["extra"]) and row["images"] == twin["images"]
        row_letter, column = extra["cell"][0], int(extra["cell"][1:])
        assert row["messages"][0]["content"].endswith(f"in cell {row_letter}{'abcd'[column - 1]}?")
    with pytest.raises(ValueError, match="cell_names='roman' must be one of"):
        ZoomTaskSpec(cell_names="roman")


@pytest.mark.parametrize("per_cell", [1, 2])
def test_fewer_shapes_per_cell_draw_that_many_kinds_and_colours_and_ask_for_one_of_them(per_cell: int) -> None:
    spec = ZoomTaskSpec(shapes_per_cell=per_cell)
    rows, _, report = generate_zoom_rows(8, seed=5, spec=spec, id_prefix="f")
    assert report.written == 8
    kinds_seen = set()
    for row in rows:
        extra = json.loads(row["extra"])
        assert len(extra["shapes"]) == per_cell * spec.grid**2
        by_cell: dict[str, list[dict]] = {}
        for shape in extra["shapes"]:
            by_cell.setdefault(shape["cell"], []).append(shape)
        for shapes in by_cell.values():
            assert len(shapes) == per_cell
            assert len({s["kind"] for s in shapes}) == per_cell and len({s["colour"] for s in shapes}) == per_cell
            kinds_seen |= {s["kind"] for s in shapes}
        [target] = [s for s in by_cell[extra["cell"]] if s["kind"] == extra["kind"]]
        assert row["answer"] == target["colour"]
        left, top, right, bottom = extra["shape_box"]
        image = decode_image(row["images"][0])
        assert image.getpixel(((left + right) // 2, (top + bottom) // 2)) == COLOURS[row["answer"]]
    assert kinds_seen == {"circle", "square", "triangle"}  # the kinds are drawn per cell, not fixed
    with pytest.raises(ValueError, match="shapes_per_cell=0"):
        ZoomTaskSpec(shapes_per_cell=0)


def test_rows_that_fail_the_legibility_checks_are_quarantined_and_counted() -> None:
    straddling = ZoomTaskSpec(shape_sides=(8, 16))  # sides over 12 are legible unzoomed (over 3 px of 112)
    rows, quarantine, report = generate_zoom_rows(8, seed=0, spec=straddling, id_prefix="q")
    assert report.written == len(rows) == 8 and report.quarantined == len(quarantine) > 0
    assert report.drawn == report.written + report.quarantined
    assert report.reasons == {"legible_without_zoom": report.quarantined}
    assert {q["kind"] for q in quarantine} == {"legible_without_zoom"} and "raise image_size" in quarantine[0]["reason"]
    assert not {q["id"] for q in quarantine} & {r["id"] for r in rows}
    assert all(q["extra"]["shape_box"][2] - q["extra"]["shape_box"][0] > 12 for q in quarantine)
    with pytest.raises(ValueError, match="too few rows pass"):
        generate_zoom_rows(2, seed=0, spec=ZoomTaskSpec(image_size=224, grid=2, view_side=112), id_prefix="x")
    with pytest.raises(ValueError, match="cannot hold 3 shape"):
        ZoomTaskSpec(grid=8, shape_sides=(20, 24))
    with pytest.raises(ValueError, match="multiple of grid"):
        ZoomTaskSpec(image_size=450)


VALIDATORS = {name: Draft202012Validator(schema_of(fn)["parameters"]) for name, fn in BUILTINS.items()}


def test_a_demonstration_is_the_episode_the_tool_would_give(tiny_model_dir: Path) -> None:
    [row], _, _ = generate_zoom_rows(1, seed=5, spec=SPEC, id_prefix="d", demonstrations=True)
    validate_row(row)
    extra = json.loads(row["extra"])
    assert [m["role"] for m in row["messages"]] == ["user", "assistant", "tool", "assistant"]
    [call] = parse_calls(row["messages"][1]["content"], VALIDATORS, SPEC.tool_calls)
    assert call == ToolCall("zoom_in", {"bbox_2d": extra["view_box"]})
    board, zoomed = (decode_image(b) for b in row["images"])
    expected = zoom_in(extra["view_box"], images=[board], model_image_sizes=[(112, 112)],
                       max_pixels=SPEC.zoom_max_pixels)
    assert list(zoomed.getdata()) == list(expected.getdata())
    assert row["messages"][3]["content"] == f"<answer>{row['answer']}</answer>" and extra["demonstration"]
    # The call hits the ground truth; a box on the wrong cell or over the whole board does not.
    region = call_region(extra["view_box"], (SPEC.view_side, SPEC.view_side), board.size)
    assert region == tuple(extra["cell_box"])
    assert region_hit(region, tuple(extra["shape_box"]), tuple(extra["cell_box"]))
    assert not region_hit(call_region([0, 0, 112, 112], (112, 112), board.size), tuple(extra["shape_box"]),
                          tuple(extra["cell_box"]))
    # It encodes through the chat format, the tool turn's image included.
    processor = load_processor(str(tiny_model_dir))
    chat = ChatFormat(processor)
    encoded = encode_prompt(processor, chat.in_format(row["messages"]), [board, zoomed])
    assert encoded.image_grid_thw.shape[0] == 2


class Angled(QwenToolCalls):
    """Qwen's JSON calls between other delimiters."""

    name = "angled"
    open, close = "<<call>>", "<</call>>"


def test_the_calls_are_written_in_the_spec_s_tool_call_format() -> None:
    assert SPEC.tool_calls is QWEN_TOOL_CALLS  # every family's today
    angled = Angled()
    spec = ZoomTaskSpec(tool_calls=angled)
    rows, _, _ = generate_zoom_rows(4, seed=5, spec=spec, id_prefix="d", demonstrations=True)
    qwen_rows, _, _ = generate_zoom_rows(4, seed=5, spec=SPEC, id_prefix="d", demonstrations=True)
    for row, qwen_row in zip(rows, qwen_rows):
        extra, qwen_extra = json.loads(row["extra"]), json.loads(qwen_row["extra"])
        arguments = {"bbox_2d": extra["view_box"]}
        # The demonstration's call and the guide's, in the spec's format: read there, no call in Qwen's.
        call = row["messages"][1]["content"]
        assert call == extra["guide"][0] == angled.format_call("zoom_in", arguments)
        assert parse_calls(call, VALIDATORS, angled) == [ToolCall("zoom_in", arguments)]
        assert parse_calls(call, VALIDATORS, QWEN_TOOL_CALLS) == []
        assert qwen_row["messages"][1]["content"] == qwen_extra["guide"][0] == QWEN_TOOL_CALLS.format_call(
            "zoom_in", arguments)
        # Only the calls' text differs: the same boards, questions, zooms and answers.
        assert {**extra, "guide": None} == {**qwen_extra, "guide": None} and row["images"] == qwen_row["images"]
        assert [m for i, m in enumerate(row["messages"]) if i != 1] == [
            m for i, m in enumerate(qwen_row["messages"]) if i != 1]


def test_a_spot_holds_the_shapes_at_the_cell_centre_and_the_demonstration_zooms_on_it() -> None:
    spec = ZoomTaskSpec(shapes_per_cell=1, spot_side=32)
    rows, _, report = generate_zoom_rows(12, seed=2, spec=spec, id_prefix="s", demonstrations=True)
    assert report.written == 12
    scale = spec.view_side / spec.image_size
    for row in rows:
        extra = json.loads(row["extra"])
        col, r = int(extra["cell"][1:]) - 1, "ABCD".index(extra["cell"][0])
        spot = (col * 112 + 40, r * 112 + 40, col * 112 + 72, r * 112 + 72)  # the central 32 px of a 112 px cell
        left, top, right, bottom = extra["shape_box"]
        assert spot[0] <= left and spot[1] <= top and right <= spot[2] and bottom <= spot[3]
        assert extra["view_box"] == [v * scale for v in spot]
        assert extra["view_box"] == [col * 28 + 10, r * 28 + 10, col * 28 + 18, r * 28 + 18]
        board, zoomed = (decode_image(b) for b in row["images"])
        region = call_region(extra["view_box"], (spec.view_side, spec.view_side), board.size)
        assert region == spot and region_hit(region, tuple(extra["shape_box"]), tuple(extra["cell_box"]))
        # Zoomed on the spot, a shape of 8-12 px fills 3.5 times as many of the view's pixels: 28 to 42.
        assert (right - left) * spec.zoom_view_side / 32 >= 28
    with pytest.raises(ValueError, match="spot_side=110"):
        ZoomTaskSpec(spot_side=110)
    with pytest.raises(ValueError, match="a spot of 20 px cannot hold 3 shape"):
        ZoomTaskSpec(spot_side=20)


@pytest.mark.parametrize("share, trained", [(1.0, 8), (0.25, 2), (0.3, 2), (0.0, 0)])
def test_call_share_trains_the_call_of_that_share_of_demonstrations_spread_evenly(share: float, trained: int) -> None:
    rows, _, _ = generate_zoom_rows(8, seed=1, spec=SPEC, id_prefix="c", demonstrations=True, call_share=share)
    context = [json.loads(r["extra"]).get("context_messages") for r in rows]
    assert sum(c is None for c in context) == trained and all(c in (None, [1]) for c in context)
    if share == 0.25:
        assert [c is None for c in context] == [False, False, False, True] * 2
    assert [r["messages"] for r in rows] == [r["messages"] for r in generate_zoom_rows(
        8, seed=1, spec=SPEC, id_prefix="c", demonstrations=True)[0]]  # the same episodes, only their weights differ
    with pytest.raises(ValueError, match=r"call_share=1.5 must be in \[0, 1\]"):
        generate_zoom_rows(1, seed=1, spec=SPEC, id_prefix="c", demonstrations=True, call_share=1.5)


@pytest.mark.parametrize("share, direct", [(0.5, 4), (0.25, 2), (0.0, 0), (1.0, 8)])
def test_direct_share_keeps_that_share_of_demonstrations_plain_answered_from_the_full_view(share: float,
                                                                                          direct: int) -> None:
    rows, _, _ = generate_zoom_rows(8, seed=1, spec=SPEC, id_prefix="d", demonstrations=True, direct_share=share)
    episodes = generate_zoom_rows(8, seed=1, spec=SPEC, id_prefix="d", demonstrations=True)[0]
    plain = generate_zoom_rows(8, seed=1, spec=SPEC, id_prefix="d")[0]
    is_plain = [row == p for row, p in zip(rows, plain)]
    assert sum(is_plain) == direct
    assert all(row == (p if flag else e) for row, p, e, flag in zip(rows, plain, episodes, is_plain))
    if share == 0.25:
        assert is_plain == [False, False, False, True] * 2
    for row, flag in zip(rows, is_plain):  # a plain row: the question alone, its one image, no call to train
        assert (len(row["messages"]), len(row["images"])) == ((1, 1) if flag else (4, 2))
    mixed = generate_zoom_rows(8, seed=1, spec=SPEC, id_prefix="d", demonstrations=True, direct_share=0.5,
                               call_share=0.5)[0]
    trained = [len(r["messages"]) == 4 and "context_messages" not in json.loads(r["extra"]) for r in mixed]
    assert sum(len(r["messages"]) == 4 for r in mixed) == 4 and sum(trained) == 2  # half of the episodes
    with pytest.raises(ValueError, match=r"direct_share=-0.1 must be in \[0, 1\]"):
        generate_zoom_rows(1, seed=1, spec=SPEC, id_prefix="d", demonstrations=True, direct_share=-0.1)


def test_direct_by_kind_sets_the_plain_share_per_kind_of_shape_spread_evenly_within_each() -> None:
    spec = ZoomTaskSpec(shapes_per_cell=1)  # one shape per cell: the kind asked about is drawn per question
    shares = {"triangle": 0.25}
    rows = generate_zoom_rows(40, seed=4, spec=spec, id_prefix="k", demonstrations=True, direct_share=0.5,
                              direct_by_kind=shares)[0]
    plain = generate_zoom_rows(40, seed=4, spec=spec, id_prefix="k")[0]
    by_bucket: dict[str, list[bool]] = {}
    for row, p in zip(rows, plain):
        kind = json.loads(row["extra"])["kind"]
        by_bucket.setdefault(kind if kind in shares else "other", []).append(row == p)
    assert set(by_bucket) == {"triangle", "other"}  # both buckets drawn, else the test proves nothing
    for bucket, flags in by_bucket.items():  # the k-th row of a bucket is plain where k * share steps up
        share = shares.get(bucket, 0.5)
        assert flags == [int((k + 1) * share) > int(k * share) for k in range(len(flags))], bucket
    assert [r["messages"] for r in rows if len(r["messages"]) == 4] == [  # the boards do not depend on the shares
        r["messages"] for r, p in zip(generate_zoom_rows(40, seed=4, spec=spec, id_prefix="k", demonstrations=True)[0],
                                      rows) if len(p["messages"]) == 4]
    with pytest.raises(ValueError, match=r"direct_by_kind names \['star'\], not kinds of shape"):
        generate_zoom_rows(1, seed=1, spec=spec, id_prefix="k", demonstrations=True, direct_by_kind={"star": 0.5})
    with pytest.raises(ValueError, match=r"direct_by_kind\['circle'\]=2 must be in \[0, 1\]"):
        generate_zoom_rows(1, seed=1, spec=spec, id_prefix="k", demonstrations=True, direct_by_kind={"circle": 2})

def test_random_call_cells_teach_the_format_on_other_cells_with_the_answer_as_context() -> None:
    rows, _, _ = generate_zoom_rows(16, seed=3, spec=SPEC, id_prefix="r", demonstrations=True, call_share=0.5,
                                    call_cells="random")
    boxes = {json.dumps(SPEC.view_box(r, c)): (r, c) for r in range(SPEC.grid) for c in range(SPEC.grid)}
    elsewhere = 0
    for row in rows:
        extra = json.loads(row["extra"])
        call = parse_calls(row["messages"][1]["content"], VALIDATORS, SPEC.tool_calls)[0]
        box = call.arguments["bbox_2d"]
        assert json.dumps(box) in boxes  # a cell's box, in the model's coordinates
        if extra["context_messages"] == [3]:  # a trained call: the answer after it is context
            elsewhere += box != extra["view_box"]
        else:
            assert extra["context_messages"] == [1] and box == extra["view_box"]  # reading: the call is context
        image = decode_image(row["images"][0])
        zoomed = zoom_in(box, images=[image], model_image_sizes=[(SPEC.view_side, SPEC.view_side)],
                         max_pixels=SPEC.zoom_max_pixels)
        assert decode_image(row["images"][1]).tobytes() == zoomed.tobytes()
    assert sum(json.loads(r["extra"])["context_messages"] == [3] for r in rows) == 8 and elsewhere >= 6
    with pytest.raises(ValueError, match=r"call_cells='nearby' must be one of \('question', 'random'\)"):
        generate_zoom_rows(1, seed=1, spec=SPEC, id_prefix="c", demonstrations=True, call_cells="nearby")


def test_region_hit_needs_the_whole_target_and_not_too_large_a_region() -> None:
    cell, target = (100, 100, 200, 200), (120, 130, 130, 140)
    assert region_hit((110, 120, 140, 150), target, cell)
    assert region_hit((0, 0, 200, 200), target, cell)  # four cells' area: still a zoom
    assert not region_hit((0, 0, 201, 200), target, cell)
    assert not region_hit((121, 130, 130, 140), target, cell)  # misses a column of it
    assert not region_hit(None, target, cell)
    assert call_region([5, 5, 1, 1], (10, 10), (100, 100)) is None


def test_splits_share_no_image_and_are_written_with_their_quarantine(tmp_path: Path) -> None:
    sizes = {"sft": 2, "train": 3, "test": 2}
    splits = build_zoom_splits(sizes, seed=1, spec=ZoomTaskSpec(shape_sides=(8, 14)))
    fingerprints = [r["images"][0] for rows, _, _ in splits.values() for r in rows]
    assert len(set(fingerprints)) == len(fingerprints) == 7
    assert all(len(r["messages"]) == 4 for r in splits["sft"][0])
    assert all(len(r["messages"]) == 1 for r in splits["train"][0])
    reports = write_zoom_splits(tmp_path, sizes, seed=1, spec=ZoomTaskSpec(shape_sides=(8, 14)))
    for split, size in sizes.items():
        assert len(read_parquet(tmp_path / f"{split}.parquet")) == size
        lines = (tmp_path / f"{split}.quarantine.jsonl").read_text().splitlines()
        assert len(lines) == reports[split].quarantined == splits[split][2].quarantined
    stored = read_parquet(tmp_path / "sft.parquet")[0]
    assert Image.open(io.BytesIO(stored["images"][1])).size == (448, 448)  # the zoom, at the tool's budget


def test_make_data_writes_the_zoom_task_at_the_model_s_view_and_refuses_a_mix(tiny_config, tmp_path) -> None:
    from pipelines import data

    tiny_config.data.tasks, tiny_config.data.image_size = {"zoom": 1.0}, 448
    tiny_config.data.sizes, tiny_config.data.dir = {"sft": 2, "test": 3}, str(tmp_path)
    spec = data.zoom_spec(tiny_config)
    assert (spec.view_side, spec.zoom_max_pixels) == (112, tiny_config.rollout.agent.max_pixels)  # the processor's resize
    data.synthetic(tiny_config)
    sft, test = read_parquet(tmp_path / "sft.parquet"), read_parquet(tmp_path / "test.parquet")
    assert len(sft) == 2 and len(test) == 3
    assert all(json.loads(r["extra"]).get("demonstration") for r in sft)  # the sft split holds episodes
    assert not any(json.loads(r["extra"]).get("demonstration") for r in test)
    tiny_config.data.zoom.direct_by_kind = {kind: 1.0 for kind in ("circle", "square", "triangle")}
    data.synthetic(tiny_config)  # every kind's sft rows plain: the config reaches the task
    assert not any(json.loads(r["extra"]).get("demonstration") for r in read_parquet(tmp_path / "sft.parquet"))
    tiny_config.data.tasks = {"zoom": 1.0, "colour": 0.5}
    with pytest.raises(ValueError, match=r"zoom task is generated alone.*'colour': 0.5"):
        data.synthetic(tiny_config)


@pytest.mark.parametrize(("names", "whole"), [("letters", True), ("grid", False)])
def test_the_tiny_tokenizer_makes_a_cell_named_by_letters_one_token(names: str, whole: bool) -> None:
    from mmrl.config import load_config
    from mmrl.models.tiny import train_tokenizer
    from pipelines.model import zoom_corpus

    cfg = load_config("configs/agent_demo.yaml", [f"data.zoom.cell_names={names}"])
    tokenizer = train_tokenizer(zoom_corpus(cfg), 1024, ["<pad>"], eos="<pad>", pad="<pad>", chat_template="")
    spec = ZoomTaskSpec(cell_names=names)
    for row in range(4):
        for col in range(4):
            cell = spec.question("circle", row, col).rsplit(" ", 1)[1].rstrip("?")
            pieces = tokenizer.tokenize(" " + cell)
            assert (len(pieces) == 1) == whole, (cell, pieces)  # a digit is never merged with its row's letter

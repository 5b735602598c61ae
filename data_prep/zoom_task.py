"""The zoom task: a large image whose answer is not legible at the resolution the model is given, but is after
zooming with the ``zoom_in`` tool.

The image (``image_size`` px, default 448) is a board of ``grid`` x ``grid`` cells (default 4 x 4) separated by
thin lines, named by row letter and column number (``A1`` top left, ``B3`` second row, third column). Every cell
holds one circle, one square and one triangle in three different colours, ``shape_sides`` px each (or, with
``shapes_per_cell`` 1 or 2, that many of them, of kinds and colours drawn per cell), anywhere in the cell or, with
``spot_side``, inside the square of that side at the cell's centre. The question names a cell and a kind: "What
colour is the triangle in cell C2?"

The model sees the image at ``view_side`` px (its processor's resize: 112 for the tiny model), where a shape is
about ``side * view_side / image_size`` px (2 to 3 by default): its colour may show, its kind does not, so
without the tool the model can at best pick among the cell's three colours. Zoomed on its cell (the built-in
``zoom_in``: the cell enlarged to the tool's pixel budget, then the processor's resize) a shape is about
``side * zoom view / cell side`` px (8 to 12), legible; zoomed on a 32 px spot (``spot_side=32``), 28 to 42.
(The tiny model's tower merges 28 x 28 view pixels into one token: unzoomed, a whole cell is one token; zoomed,
sixteen.)

Each drawn row is checked: one whose target shape would be legible without zooming (over ``illegible_px`` in
the full view: ``legible_without_zoom``) or illegible after zooming on its cell (under ``legible_px``:
``illegible_after_zoom``) is quarantined with that reason; rows are drawn until a split is full, and drawn =
written + quarantined (:class:`ZoomReport`). A spec under which every row is quarantined raises ValueError.

Each row's ``extra`` records the board (``shapes``: every shape's cell, kind, colour and box), the question's
``cell`` and ``kind``, the ground truth of where to look, in stored pixels (left, top, right, bottom; right
and bottom exclusive): ``cell_box`` and ``shape_box``, for :func:`mmrl.agent.regions.region_hit`, and ``guide``:
the known-good episode's policy turns (the call on the question's view box, the answer) that off-policy
guidance (``trainer.guide_unsolved``) runs for a group whose every episode is wrong.

Demonstration rows (the ``sft`` split by default) hold a whole episode: the question, the policy's ``zoom_in``
call on the cell (in the coordinates the model sees), the tool turn with the zoomed image (made by the built-in
tool itself) and the answer; the call, as the guide's, is written in the model family's tool-call format (the
spec's ``tool_calls``). :mod:`mmrl.agent.chat` encodes them (``ChatFormat.in_format``). With ``call_share``
below 1, only that share of them (spread evenly over the split) trains the call; the others show it as context
(``extra["context_messages"]``), so SFT teaches reading the zoomed image on every demonstration and where to zoom
on few. With ``call_cells="random"`` the trained calls zoom on a random cell and their answers are context: SFT
then teaches the call's format and reading, and RL alone where to zoom. With ``direct_share``, that share of the
split (spread evenly) stays plain rows, the question answered from the full view without a call: SFT teaches
both ways of answering, and RL which one pays (when to zoom). ``direct_by_kind`` sets that share per kind of
shape asked about (spread evenly within each kind), so that the greedy SFT policy's choice to call is set by the
question rather than by the draw of its weights: with calls on most triangle questions and few others, it calls on
the triangles, answers the others from the full view, and RL must teach it to call on those.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from PIL import Image, ImageDraw

from data_prep.palette import BACKGROUND_RANGE, COLOURS
from data_prep.parquet import write_parquet
from data_prep.pixels import encode_png
from data_prep.synthetic import SHAPES, _apart, _draw_shape, derive_seed  # the shapes as the other tasks draw them
from mmrl.agent.builtin import zoom_in
from mmrl.answer_format import format_answer
from mmrl.models.tool_calls import QWEN_TOOL_CALLS, ToolCallFormat
from mmrl.schema import IMAGE_PLACEHOLDER, make_row

TASK = "zoom"
DATA_SOURCE = f"synthetic/{TASK}"
QUESTION = "What colour is the {kind} in cell {cell}?"
ROWS = "ABCDEFGHI"
COLUMNS = "abcdefghi"  # the column letters of ``cell_names="letters"``
CELL_NAMES = ("grid", "letters")  # how a question names its cell: "cell B2", or "cell Bb"
ZOOM_TOOL = "zoom_in"
CALL_CELLS = ("question", "random")  # where a demonstration's trained call zooms
LINE_GREY = 120  # the grid lines: darker than every background, far from every colour
_MARGIN = 3  # pixels kept free inside a cell's lines


@dataclass(frozen=True)
class ZoomTaskSpec:
    image_size: int = 448
    """Side of the stored (full resolution) image, in pixels."""
    grid: int = 4
    """Cells per side (1 to 9)."""
    shapes_per_cell: int = 3
    """Shapes in a cell (1 to 3, of different kinds and colours): with 1, the question's kind is redundant and only
    the cell's colour is to be read."""
    shape_sides: tuple[int, int] = (8, 12)
    """Smallest and largest side of a shape, stored pixels."""
    spot_side: int = 0
    """Side, in stored pixels, of the square at each cell's centre that holds the cell's shapes; 0: the whole cell
    (less a margin). The demonstrated call zooms on it, and a shape's size after zooming is measured on it: a
    spot smaller than the cell makes the zoomed shape larger (the tool's gain is ``image_size / spot_side``
    rather than ``grid``)."""
    view_side: int = 112
    """Side of the image as the model sees it: its processor's resize (the tiny model's budget: 112)."""
    zoom_max_pixels: int = 448 * 448
    """The zoom tool's pixel budget (the run's ``ToolLimits.max_pixels``): demonstrations are zoomed to it."""
    illegible_px: float = 3.0
    """A target shape larger than this in the full view is legible without zooming (the row is quarantined)."""
    legible_px: float = 8.0
    """A target shape smaller than this when zoomed on its cell stays illegible (the row is quarantined)."""
    cell_names: str = "grid"
    """How a question names its cell: ``grid``, "in cell B2"; ``letters``, "in cell Bb" (the row's capital, the
    column's small letter: no digit). The tool's schema and its calls are full of digits, and the tiny model's
    calls do not learn which of them is the column's (README, agent section); ``Bb`` is one word, which the
    tiny model's tokenizer makes one token: the cell's own. The naming changes the question's text only: a row's
    ``extra["cell"]`` is always the grid name ("B2")."""
    tool_calls: ToolCallFormat = field(default=QWEN_TOOL_CALLS, repr=False)
    """How the model writes a tool call: its family's format (:attr:`mmrl.agent.chat.ChatFormat.calls`), in which
    the guides' and demonstrations' calls are written (Qwen's, every family's today, by default)."""

    def __post_init__(self) -> None:
        lo, hi = self.shape_sides
        if self.cell_names not in CELL_NAMES:
            raise ValueError(f"zoom task: cell_names={self.cell_names!r} must be one of {CELL_NAMES}")
        if not 1 <= self.grid <= len(ROWS):
            raise ValueError(f"zoom task: grid={self.grid} must be 1 to {len(ROWS)} (cells are named A1 to I9)")
        if self.image_size % self.grid:
            raise ValueError(f"zoom task: image_size={self.image_size} must be a multiple of grid={self.grid}")
        if not 1 <= self.shapes_per_cell <= len(SHAPES):
            raise ValueError(f"zoom task: shapes_per_cell={self.shapes_per_cell} must be 1 to {len(SHAPES)}")
        if not 6 <= lo <= hi:
            raise ValueError(f"zoom task: shape_sides={self.shape_sides} must be (lo, hi) with 6 <= lo <= hi")
        if not 0 <= self.spot_side <= self.cell_side - 2 * _MARGIN:
            raise ValueError(f"zoom task: spot_side={self.spot_side} must be 0 (the whole cell) to "
                             f"{self.cell_side - 2 * _MARGIN} (the cell of {self.cell_side} px less its margins)")
        n = self.shapes_per_cell
        if n * hi + (n - 1) * _MARGIN > self.room:
            raise ValueError(f"zoom task: a spot of {self.room} px cannot hold {n} shape(s) of {hi} px; raise "
                             "image_size or spot_side, or lower grid or shape_sides")
        if self.view_side < 1 or self.zoom_max_pixels < 1:
            raise ValueError("zoom task: view_side and zoom_max_pixels must be positive")

    @property
    def cell_side(self) -> int:
        return self.image_size // self.grid

    @property
    def room(self) -> int:
        """Side of the square, in stored pixels, that holds a cell's shapes (the spot, or the cell less margins)."""
        return self.spot_side or self.cell_side - 2 * _MARGIN

    @property
    def zoom_side(self) -> int:
        """Side, in stored pixels, of the square a demonstrated call zooms on: the spot, or the whole cell."""
        return self.spot_side or self.cell_side

    @property
    def zoom_view_side(self) -> float:
        """Side, in the model's view, of a zoomed region (a cell, or its spot) enlarged to the tool's budget (the
        processor shrinks it to the view)."""
        return min(math.isqrt(self.zoom_max_pixels), self.view_side)

    def legibility(self, side: int) -> str | None:
        """Why a target shape of ``side`` stored pixels makes a bad row, or None for a good one."""
        if side * self.view_side / self.image_size > self.illegible_px:
            return "legible_without_zoom"
        if side * self.zoom_view_side / self.zoom_side < self.legible_px:
            return "illegible_after_zoom"
        return None

    def question(self, kind: str, row: int, col: int) -> str:
        """The question about the ``kind`` of shape in cell (row, col), its cell named as ``cell_names`` says."""
        cell = ROWS[row] + COLUMNS[col] if self.cell_names == "letters" else cell_name(row, col)
        return QUESTION.format(kind=kind, cell=cell)

    def view_box(self, row: int, col: int) -> list[float]:
        """Where to zoom for cell (row, col): the cell, or its spot, as [x1, y1, x2, y2] in the coordinates the
        model sees."""
        scale, side = self.view_side / self.image_size, self.zoom_side
        inset = (self.cell_side - side) // 2  # as _place centres the spot
        x0, y0 = col * self.cell_side + inset, row * self.cell_side + inset
        return [_number(v * scale) for v in (x0, y0, x0 + side, y0 + side)]


@dataclass
class ZoomReport:
    """Counts of one split: every drawn row is written or quarantined (``reasons`` by kind)."""

    drawn: int = 0
    written: int = 0
    quarantined: int = 0
    reasons: Counter[str] = field(default_factory=Counter)

    def summary(self) -> str:
        line = f"zoom: drawn={self.drawn} written={self.written} quarantined={self.quarantined}"
        if self.reasons:
            line += " (" + ", ".join(f"{kind}={n}" for kind, n in self.reasons.most_common()) + ")"
        return line


def cell_name(row: int, col: int) -> str:
    return f"{ROWS[row]}{col + 1}"


def cell_index(name: str) -> tuple[int, int]:
    """A cell's name ("B2") -> its (row, col), from 0."""
    return ROWS.index(name[0]), int(name[1:]) - 1


def _number(value: float) -> float | int:
    rounded = round(value, 1)
    return int(rounded) if rounded == int(rounded) else rounded


def draw_board(rng: random.Random, spec: ZoomTaskSpec) -> list[dict[str, Any]]:
    """Every cell's ``shapes_per_cell`` shapes: cell, kind, colour (different kinds and colours within a cell) and
    box (x0, y0, side)."""
    shapes = []
    for row in range(spec.grid):
        for col in range(spec.grid):
            kinds = SHAPES if spec.shapes_per_cell == len(SHAPES) else rng.sample(SHAPES, spec.shapes_per_cell)
            colours = rng.sample(list(COLOURS), len(kinds))
            for kind, colour, box in zip(kinds, colours, _place(rng, spec, row, col)):
                shapes.append({"cell": cell_name(row, col), "kind": kind, "colour": colour, "box": list(box)})
    return shapes


def _place(rng: random.Random, spec: ZoomTaskSpec, row: int, col: int) -> list[tuple[int, int, int]]:
    """``shapes_per_cell`` non-touching boxes inside cell (row, col), by rejection sampling."""
    lo, hi = spec.shape_sides
    room = spec.room
    inset = (spec.cell_side - room) // 2
    x_start, y_start = col * spec.cell_side + inset, row * spec.cell_side + inset
    for _ in range(1000):
        boxes: list[tuple[int, int, int]] = []
        for _ in range(spec.shapes_per_cell):
            side = rng.randint(lo, hi)
            box = (x_start + rng.randint(0, room - side), y_start + rng.randint(0, room - side), side)
            if not all(_apart(box, other) for other in boxes):
                break
            boxes.append(box)
        if len(boxes) == spec.shapes_per_cell:
            return boxes
    raise ValueError(f"could not place {spec.shapes_per_cell} shapes in a {spec.cell_side} px cell; lower shape_sides")


def render_board(shapes: list[dict[str, Any]], spec: ZoomTaskSpec, grey: int) -> Image.Image:
    """The board: background, grid lines (on the cells' borders), the shapes drawn without anti-aliasing."""
    img = Image.new("RGB", (spec.image_size, spec.image_size), (grey, grey, grey))
    draw = ImageDraw.Draw(img)
    line = (LINE_GREY,) * 3
    for k in range(1, spec.grid):
        at = k * spec.cell_side
        draw.line([(at, 0), (at, spec.image_size - 1)], fill=line)
        draw.line([(0, at), (spec.image_size - 1, at)], fill=line)
    for shape in shapes:
        _draw_shape(draw, shape["kind"], tuple(shape["box"]), COLOURS[shape["colour"]])
    return img


def _candidate(rng: random.Random, spec: ZoomTaskSpec) -> tuple[Image.Image, dict[str, Any], str]:
    """A drawn board, its row's extra and the answer."""
    grey = rng.randint(*BACKGROUND_RANGE)
    shapes = draw_board(rng, spec)
    target = rng.choice(shapes)
    index = cell_index(target["cell"])
    side, x0, y0 = spec.cell_side, index[1] * spec.cell_side, index[0] * spec.cell_side
    x, y, s = target["box"]
    extra = {"task": TASK, "grid": spec.grid, "cell": target["cell"], "kind": target["kind"], "background": [grey] * 3,
             "cell_box": [x0, y0, x0 + side, y0 + side], "shape_box": [x, y, x + s, y + s],
             "view_box": spec.view_box(*index), "shapes": shapes}
    extra["guide"] = guide_turns(extra["view_box"], target["colour"], spec.tool_calls)
    return render_board(shapes, spec, grey), extra, target["colour"]


def guide_turns(box: list[float], answer: str, calls: ToolCallFormat) -> list[str]:
    """The known-good episode's policy turns (``extra["guide"]``, for ``trainer.guide_unsolved``): the
    ``zoom_in`` call on ``box`` (the question's view box) in the format ``calls``, then the answer."""
    return [calls.format_call(ZOOM_TOOL, {"bbox_2d": box}), format_answer(answer)]


def demonstration(row: dict[str, Any], image: Image.Image, spec: ZoomTaskSpec, train_call: bool = True,
                  call_cell: tuple[int, int] | None = None) -> dict[str, Any]:
    """The row as a demonstrated episode: the call on its cell, the tool's zoomed image, the answer; with
    ``train_call`` False the call is context only (``extra["context_messages"]``: the answer alone is trained).
    ``call_cell`` (row, col) zooms on that cell instead: a demonstration of the call's format whose answer, not
    legible in what it zoomed on, is context only."""
    extra = json.loads(row["extra"])
    box = extra["view_box"] if call_cell is None else spec.view_box(*call_cell)
    zoomed = zoom_in(box, images=[image], model_image_sizes=[(spec.view_side, spec.view_side)],
                     max_pixels=spec.zoom_max_pixels)
    call_text, answer_text = guide_turns(box, row["answer"], spec.tool_calls)
    messages = [*row["messages"], {"role": "assistant", "content": call_text},
                {"role": "tool", "content": IMAGE_PLACEHOLDER}, {"role": "assistant", "content": answer_text}]
    call, answer = len(row["messages"]), len(row["messages"]) + 2
    context = [answer] if call_cell is not None else [] if train_call else [call]
    extra = {**extra, "demonstration": True} | ({"context_messages": context} if context else {})
    return {**row, "messages": messages, "images": [*row["images"], encode_png(zoomed)],
            "extra": json.dumps(extra, sort_keys=True)}


def generate_zoom_rows(num: int, seed: int, spec: ZoomTaskSpec, id_prefix: str, seen: set[str] | None = None,
                       demonstrations: bool = False, call_share: float = 1.0, call_cells: str = "question",
                       direct_share: float = 0.0, direct_by_kind: Mapping[str, float] | None = None,
                       ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], ZoomReport]:
    """``num`` rows (whose images are not in ``seen``, which is updated), the quarantined ones (id, kind, reason,
    extra) and the counts; with ``demonstrations``, ``direct_share`` of them (spread evenly; for a kind of shape in
    ``direct_by_kind``, its share of that kind's rows, spread evenly among them) stay plain rows, answered from the
    full view, and the others are demonstrated episodes whose call is trained on
    ``call_share`` of them, spread evenly, and zooms there on the question's cell (``call_cells="question"``)
    or on a cell drawn at random (``"random"``: the format taught, not where to zoom). Raises ValueError when
    too few rows pass the checks."""
    direct_by_kind = dict(direct_by_kind or {})
    shares = [("call_share", call_share), ("direct_share", direct_share)]
    for name, share in shares + [(f"direct_by_kind[{k!r}]", v) for k, v in direct_by_kind.items()]:
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"zoom task: {name}={share} must be in [0, 1]")
    if unknown := sorted(set(direct_by_kind) - set(SHAPES)):
        raise ValueError(f"zoom task: direct_by_kind names {unknown}, not kinds of shape; use {list(SHAPES)}")
    if call_cells not in CALL_CELLS:
        raise ValueError(f"zoom task: call_cells={call_cells!r} must be one of {CALL_CELLS}")
    cells = random.Random(f"{seed}-call-cells")  # its own stream: the boards do not depend on call_cells
    rng, seen = random.Random(seed), set() if seen is None else seen
    rows, quarantine, report, episodes = [], [], ZoomReport(), 0
    written: Counter[str | None] = Counter()  # rows written per kind of direct_by_kind (None: every other kind)
    while report.written < num:
        if report.drawn >= 10 * num + 100:
            raise ValueError(f"zoom task: {report.summary()}; too few rows pass, change the spec ({spec})")
        image, extra, answer = _candidate(rng, spec)
        png = encode_png(image)
        fingerprint = hashlib.sha256(png).hexdigest()
        if fingerprint in seen:
            continue
        seen.add(fingerprint)
        report.drawn += 1
        row_id = f"{id_prefix}-{report.drawn - 1:06d}"
        reason = spec.legibility(extra["shape_box"][2] - extra["shape_box"][0])
        if reason is not None:
            quarantine.append({"id": row_id, "kind": reason, "reason": _REASONS[reason], "extra": extra})
            report.quarantined += 1
            report.reasons[reason] += 1
            continue
        prompt = IMAGE_PLACEHOLDER + spec.question(extra["kind"], *cell_index(extra["cell"]))
        row = make_row(row_id, prompt, [png], answer, DATA_SOURCE, extra)
        elsewhere = (cells.randrange(spec.grid), cells.randrange(spec.grid)) if call_cells == "random" else None
        bucket = extra["kind"] if extra["kind"] in direct_by_kind else None
        direct = _steps_up(written[bucket], direct_by_kind.get(extra["kind"], direct_share))
        written[bucket] += 1
        if demonstrations and not direct:
            train_call = _steps_up(episodes, call_share)  # call_share counts the demonstrated episodes only
            row = demonstration(row, image, spec, train_call, elsewhere if train_call else None)
            episodes += 1
        rows.append(row)
        report.written += 1
    return rows, quarantine, report


def _steps_up(k: int, share: float) -> bool:
    """Whether the k-th row is among ``share`` of the rows spread evenly: where the share's running count steps
    up."""
    return math.floor((k + 1) * share) > math.floor(k * share)


_REASONS = {
    "legible_without_zoom": "the target shape is legible at the model's resolution; raise image_size or lower "
                            "shape_sides",
    "illegible_after_zoom": "the target shape stays illegible when zoomed on its cell; raise shape_sides or lower grid",
}


def build_zoom_splits(sizes: dict[str, int], seed: int, spec: ZoomTaskSpec = ZoomTaskSpec(),
                      demo_splits: tuple[str, ...] = ("sft",), call_share: float = 1.0, call_cells: str = "question",
                      direct_share: float = 0.0, direct_by_kind: Mapping[str, float] | None = None,
                      ) -> dict[str, tuple[list, list, ZoomReport]]:
    """Per split: its rows (demonstrations for ``demo_splits`` but ``direct_share`` of them, or their kind's share
    in ``direct_by_kind``; ``call_share`` of those with the call trained, on ``call_cells``:
    :func:`generate_zoom_rows`), its quarantined rows and its counts. Each split draws from its own derived seed,
    and no image occurs twice across the splits."""
    seen: set[str] = set()
    return {split: generate_zoom_rows(size, derive_seed(seed, TASK, split), spec, f"{split}-{TASK}", seen,
                                      demonstrations=split in demo_splits, call_share=call_share,
                                      call_cells=call_cells, direct_share=direct_share,
                                      direct_by_kind=direct_by_kind)
            for split, size in sizes.items()}


def write_zoom_splits(out_dir: str | Path, sizes: dict[str, int], seed: int, spec: ZoomTaskSpec = ZoomTaskSpec(),
                      demo_splits: tuple[str, ...] = ("sft",), call_share: float = 1.0, call_cells: str = "question",
                      direct_share: float = 0.0, direct_by_kind: Mapping[str, float] | None = None,
                      ) -> dict[str, ZoomReport]:
    """Write ``<out_dir>/<split>.parquet`` and ``<out_dir>/<split>.quarantine.jsonl`` per split; the counts."""
    out = Path(out_dir)
    reports = {}
    for split, (rows, quarantine, report) in build_zoom_splits(sizes, seed, spec, demo_splits, call_share, call_cells,
                                                                        direct_share, direct_by_kind).items():
        write_parquet(rows, out / f"{split}.parquet")
        path = out / f"{split}.quarantine.jsonl"
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text("".join(json.dumps(entry) + "\n" for entry in quarantine), encoding="utf-8")
        os.replace(tmp, path)
        reports[split] = report
    return reports

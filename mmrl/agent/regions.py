"""Whether a zoom or crop call looked at the right place: a call's region against a row's ground truth.

Boxes are (left, top, right, bottom) in pixels of the stored image, right and bottom exclusive; a call's box
(in the coordinates the model saw) maps onto the stored image with :func:`call_region`.
"""

from __future__ import annotations

from collections.abc import Sequence

from mmrl.agent.builtin import source_box

Box = tuple[int, int, int, int]


def call_region(bbox_2d: Sequence[float], seen: tuple[int, int], size: tuple[int, int]) -> Box | None:
    """A call's ``bbox_2d`` (in the coordinates of the image as the model saw it, ``seen``) on the stored image
    (``size``), as the built-in tools read it; None for a box they refuse."""
    try:
        return source_box(bbox_2d, seen, size)
    except ValueError:
        return None


def region_hit(region: Box | None, target: Box, cell: Box, max_area_ratio: float = 4.0) -> bool:
    """Whether ``region`` shows the ``target`` (a shape's box): it holds all of it and covers at most
    ``max_area_ratio`` times the area of its ``cell`` (so that zooming on it makes the target larger)."""
    if region is None:
        return False
    holds = region[0] <= target[0] and region[1] <= target[1] and region[2] >= target[2] and region[3] >= target[3]
    area = (region[2] - region[0]) * (region[3] - region[1])
    return holds and area <= max_area_ratio * (cell[2] - cell[0]) * (cell[3] - cell[1])

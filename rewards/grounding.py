"""Visual grounding: the IoU of the answer's bounding box with the ground truth's.

A box is ``x1, y1, x2, y2`` (top-left, then bottom-right corner) written in one of these forms:

* ``[10, 20, 30, 40]`` or ``(10, 20, 30, 40)``, commas or spaces between the numbers; this covers the
  JSON Qwen2.5-VL emits, ``[{"bbox_2d": [10, 20, 30, 40], "label": "cat"}]``;
* ``(10,20),(30,40)``, two corners;
* ``10 20 30 40`` or ``10, 20, 30, 40``, when that is the whole answer.

When the answer holds several boxes the last one is scored, like the last ``<answer>``.

The answer's box is in pixels of the image the model saw, the processor's resized image
(``model_image_sizes[0]``, width by height), and is rescaled to the original image
(``images[0].size``) in which the ground-truth box is given. With no ``model_image_sizes`` the answer is
taken to be in original-image pixels already. Both boxes are then clipped to the image; a box with
``x2 <= x1`` or ``y2 <= y1`` after clipping (inverted, empty, or entirely outside the image) scores 0.
Without images the boxes are compared as written, unclipped.

Qwen2-VL's coordinates normalised to 0-1000 are not converted: pass boxes in pixels.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from mmrl.answer_format import extract_answer
from rewards.text import clean_text

HIT_IOU = 0.5
"""The IoU from which a box counts as a hit (``grounding_hit``, the ``hit`` component)."""

Box = tuple[float, float, float, float]

_NUM = r"([-+]?(?:\d+(?:\.\d*)?|\.\d+))"
# Unambiguous, so that a long run of spaces cannot make the regex backtrack quadratically.
_SEP = r"(?:\s*,\s*|\s+)"
_BOX = re.compile(
    rf"[\[(]\s*{_NUM}{_SEP}{_NUM}{_SEP}{_NUM}{_SEP}{_NUM}\s*[\])]"
    rf"|\(\s*{_NUM}\s*,\s*{_NUM}\s*\)\s*,?\s*\(\s*{_NUM}\s*,\s*{_NUM}\s*\)"
)
_BARE_BOX = re.compile(rf"{_NUM}{_SEP}{_NUM}{_SEP}{_NUM}{_SEP}{_NUM}")


def parse_box(text: str) -> Box | None:
    """The last box written in ``text`` as four floats, or None if there is none or it is not finite."""
    text = clean_text(text)
    last = None
    for last in _BOX.finditer(text):  # only the last match is wanted
        pass
    if last is None:
        last = _BARE_BOX.fullmatch(text)
        if last is None:
            return None
    numbers = [float(group) for group in last.groups() if group is not None]
    if not all(math.isfinite(n) for n in numbers):
        return None
    x1, y1, x2, y2 = numbers
    return x1, y1, x2, y2


def box_iou(a: Box, b: Box) -> float:
    """Intersection over union of two boxes; 0.0 if either is degenerate (``x2 <= x1`` or ``y2 <= y1``)."""
    if a[2] <= a[0] or a[3] <= a[1] or b[2] <= b[0] or b[3] <= b[1]:
        return 0.0
    width = min(a[2], b[2]) - max(a[0], b[0])
    height = min(a[3], b[3]) - max(a[1], b[1])
    if width <= 0 or height <= 0:
        return 0.0
    intersection = width * height
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - intersection
    return intersection / union


def rescale_box(box: Box, from_size: tuple[float, float], to_size: tuple[float, float]) -> Box:
    """``box`` in pixels of a ``from_size`` (width, height) image, in pixels of a ``to_size`` image."""
    sx, sy = to_size[0] / from_size[0], to_size[1] / from_size[1]
    return box[0] * sx, box[1] * sy, box[2] * sx, box[3] * sy


def clip_box(box: Box, size: tuple[float, float]) -> Box:
    """``box`` clipped to a (width, height) image."""
    width, height = size
    return (
        min(max(box[0], 0.0), width),
        min(max(box[1], 0.0), height),
        min(max(box[2], 0.0), width),
        min(max(box[3], 0.0), height),
    )


def grounding_iou(
    response: str,
    ground_truth: str,
    images: Sequence | None = None,
    model_image_sizes: Sequence[tuple[int, int]] | None = None,
) -> dict[str, float]:
    """The IoU of the answer's box with the ground-truth box, see the module docstring.

    Returns ``{"score": iou, "iou": iou, "hit": 1.0 if iou >= 0.5 else 0.0}``.
    """
    iou = _answer_iou(response, ground_truth, images, model_image_sizes)
    return {"score": iou, "iou": iou, "hit": 1.0 if iou >= HIT_IOU else 0.0}


def grounding_hit(
    response: str,
    ground_truth: str,
    images: Sequence | None = None,
    model_image_sizes: Sequence[tuple[int, int]] | None = None,
) -> dict[str, float]:
    """1.0 if the answer's box has an IoU of at least 0.5 with the ground truth (grounding accuracy).

    Returns ``{"score": hit, "iou": iou}``.
    """
    iou = _answer_iou(response, ground_truth, images, model_image_sizes)
    return {"score": 1.0 if iou >= HIT_IOU else 0.0, "iou": iou}


def _answer_iou(
    response: str, ground_truth: str, images: Sequence | None, model_image_sizes: Sequence | None
) -> float:
    original_size = _size(images[0].size, "images[0].size") if images else None
    model_size = _size(model_image_sizes[0], "model_image_sizes[0]") if model_image_sizes else None
    if model_size is not None and original_size is None:
        raise ValueError(
            "grounding_iou: model_image_sizes is given but images is empty; the original image is needed "
            "to rescale the answer's box to the ground truth's pixels"
        )
    answer = extract_answer(response)
    if answer is None:
        return 0.0
    box, truth = parse_box(answer), parse_box(ground_truth)
    if box is None or truth is None:
        return 0.0
    if original_size is not None:
        if model_size is not None:
            box = rescale_box(box, model_size, original_size)
        box, truth = clip_box(box, original_size), clip_box(truth, original_size)
    return box_iou(box, truth)


def _size(size: object, name: str) -> tuple[float, float]:
    try:
        width, height = (float(v) for v in size)  # type: ignore[union-attr]
    except (TypeError, ValueError):
        width = height = math.nan
    if not (0 < width < math.inf and 0 < height < math.inf):
        raise ValueError(
            f"grounding_iou: {name} must be a (width, height) pair of positive numbers, got {size!r}"
        )
    return width, height

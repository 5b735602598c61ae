"""The built-in tools: ``crop`` and ``zoom_in`` on an image of the episode, and ``calculator``.

A box is given in the coordinates the model saw: pixels of the image as its processor resized it for the
model (``model_image_sizes``), not of the stored image. :func:`source_box` maps it back onto the stored
image, whose full resolution the crop then reads; the result is kept within the pixel budget
(``max_pixels``), so a tool's image costs the episode no more tokens than a prompt's image may.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

from PIL import Image

from mmrl.agent.schemas import tool

MAX_ASPECT = 50.0  # longest side / shortest side of a region (processors refuse extreme ratios)

_BOX = {"type": "array", "items": {"type": "number"}, "minItems": 4, "maxItems": 4,
        "description": "[x1, y1, x2, y2]: the region's top-left and bottom-right corners, in pixels of the image "
                       "as you see it"}
_IMAGE = {"type": "integer", "minimum": 0, "default": 0,
          "description": "which image of the conversation, counted from 0 in the order they appeared"}
_REGION = {"type": "object", "properties": {"bbox_2d": _BOX, "image": _IMAGE}, "required": ["bbox_2d"],
           "additionalProperties": False}


def source_box(bbox_2d: Sequence[float], seen: tuple[int, int], size: tuple[int, int]) -> tuple[int, int, int, int]:
    """A box in the coordinates of the image as the model saw it (``seen``: width, height) -> the pixel box
    (left, top, right, bottom; right and bottom exclusive) of the stored image (``size``), clipped to it.

    Raises ValueError for a box that is empty or inverted once clipped, or too thin (past :data:`MAX_ASPECT`).
    """
    x1, y1, x2, y2 = (float(v) for v in bbox_2d)
    if not x1 < x2 or not y1 < y2:
        raise ValueError(f"bbox_2d {list(bbox_2d)} is empty: give [x1, y1, x2, y2] with x1 < x2 and y1 < y2")
    (seen_w, seen_h), (width, height) = seen, size
    sx, sy = width / seen_w, height / seen_h
    left, top = max(0, math.floor(x1 * sx)), max(0, math.floor(y1 * sy))
    right, bottom = min(width, math.ceil(x2 * sx)), min(height, math.ceil(y2 * sy))
    if right <= left or bottom <= top:
        raise ValueError(f"bbox_2d {list(bbox_2d)} lies outside the image, which you see at {seen_w}x{seen_h}")
    box_w, box_h = right - left, bottom - top
    if max(box_w, box_h) / min(box_w, box_h) > MAX_ASPECT:
        raise ValueError(f"bbox_2d {list(bbox_2d)} is too thin; give a region at most {MAX_ASPECT:g} times longer "
                         "than it is wide")
    return left, top, right, bottom


def scaled(img: Image.Image, max_pixels: int, grow: bool) -> Image.Image:
    """``img`` resized, its aspect kept, to about ``max_pixels`` pixels: only shrunk when over the budget,
    or (``grow``) also enlarged to fill it."""
    area = img.width * img.height
    if area == max_pixels or (area < max_pixels and not grow):
        return img
    scale = math.sqrt(max_pixels / area)
    size = (max(1, math.floor(img.width * scale)), max(1, math.floor(img.height * scale)))
    return img.resize(size, Image.Resampling.BICUBIC)


def _region(bbox_2d: Sequence[float], image: int, images: Sequence[Image.Image],
            model_image_sizes: Sequence[Sequence[int]]) -> Image.Image:
    if not 0 <= image < len(images):
        raise ValueError(f"image {image} does not exist: the conversation has {len(images)} image(s), "
                         f"numbered 0 to {len(images) - 1}")
    seen = tuple(int(v) for v in model_image_sizes[image])
    source = images[image]
    return source.crop(source_box(bbox_2d, (seen[0], seen[1]), source.size))


@tool("Crop a region of an image of the conversation and see it at full resolution.", _REGION)
def crop(bbox_2d: list[float], image: int = 0, *, images: list[Image.Image], model_image_sizes: list[list[int]],
         max_pixels: int) -> Image.Image:
    """The region at the stored image's resolution, shrunk only if over ``max_pixels``."""
    return scaled(_region(bbox_2d, image, images, model_image_sizes), max_pixels, grow=False)


@tool("Zoom in on a region of an image of the conversation: see it enlarged.", _REGION)
def zoom_in(bbox_2d: list[float], image: int = 0, *, images: list[Image.Image], model_image_sizes: list[list[int]],
            max_pixels: int) -> Image.Image:
    """The region enlarged (or shrunk) to fill ``max_pixels``."""
    return scaled(_region(bbox_2d, image, images, model_image_sizes), max_pixels, grow=True)


# --- calculator ---------------------------------------------------------------------------------------

MAX_DIGITS = 100  # an integer result or operand past this many digits is refused (9**9**9 would take hours)
_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _checked(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        exact_power = isinstance(node.op, ast.Pow) and isinstance(left, int) and isinstance(right, int)
        if exact_power and abs(left) > 1 and right * math.log10(abs(left)) > MAX_DIGITS:
            raise ValueError(f"{left}**{right} is too large (over {MAX_DIGITS} digits)")
        result = _BINARY[type(node.op)](left, right)  # a float past its range raises OverflowError
        if isinstance(result, complex):
            raise ValueError(f"{left}**{right} is not a real number")
        return _checked(result)
    raise ValueError(f"unsupported expression {ast.unparse(node)!r}: use numbers, + - * / // % ** and parentheses")


def _checked(value: int | float) -> int | float:
    if isinstance(value, int) and abs(value) >= 10**MAX_DIGITS:
        raise ValueError(f"a number is too large (over {MAX_DIGITS} digits)")
    return value


@tool("Evaluate an arithmetic expression: numbers, + - * / // % ** and parentheses.",
      {"type": "object", "properties": {"expression": {"type": "string", "maxLength": 500,
                                                        "description": "e.g. (3 + 4) * 2.5"}},
       "required": ["expression"], "additionalProperties": False})
def calculator(expression: str) -> str:
    """The value of ``expression``: an integer exactly, a float to 12 significant digits."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"{expression!r} is not an arithmetic expression") from None
    value = _evaluate(tree.body)
    return str(value) if isinstance(value, int) else format(value, ".12g")


BUILTINS: dict[str, Callable[..., Any]] = {"crop": crop, "zoom_in": zoom_in, "calculator": calculator}

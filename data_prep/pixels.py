"""Fitting images to a pixel budget whose sides are multiples of a patch factor.

A vision encoder with patch size 14 and 2x2 patch merging wants both sides to
be multiples of 28 and the total pixel count bounded.

Two sizings (``sizing``): ``qwen`` is qwen-vl-utils' own ``smart_resize`` (what Qwen's tools and vLLM's Qwen
processors give a model of those families), used wherever its answer is a usable size; mmrl's own rule
(``mmrl``, the same idea written independently, and the fallback) also covers what ``smart_resize`` does not:
aspect ratios over 200 (it raises) and budgets where its rounding lands outside ``[min_pixels, max_pixels]`` or
below one factor a side.
"""

from __future__ import annotations

import io
import math

from PIL import Image

from mmrl.image_modes import to_rgb


def validate_budget(min_pixels: int, max_pixels: int, factor: int) -> None:
    """Raise ValueError unless the budget is usable."""
    if factor < 1:
        raise ValueError(f"factor={factor} must be a positive integer such as 28")
    if min_pixels < 1:
        raise ValueError(f"min_pixels={min_pixels} must be positive")
    if min_pixels > max_pixels:
        raise ValueError(f"min_pixels={min_pixels} exceeds max_pixels={max_pixels}; swap or widen them")
    if max_pixels < factor * factor:
        raise ValueError(
            f"max_pixels={max_pixels} is below factor**2={factor * factor}; "
            f"raise max_pixels so at least one {factor}x{factor} image fits"
        )


def _round_to(value: float, factor: int) -> int:
    return max(factor, round(value / factor) * factor)


def _floor_to(value: float, factor: int) -> int:
    return max(factor, math.floor(value / factor) * factor)


def _ceil_to(value: float, factor: int) -> int:
    return max(factor, math.ceil(value / factor) * factor)


def _scaled(width: int, height: int, min_pixels: int, max_pixels: int, factor: int) -> tuple[int, int]:
    """The aspect-preserving first guess: round, then shrink or grow as a whole."""
    new_w, new_h = _round_to(width, factor), _round_to(height, factor)
    if new_w * new_h > max_pixels:
        scale = math.sqrt(max_pixels / (width * height))
        return _floor_to(width * scale, factor), _floor_to(height * scale, factor)
    if new_w * new_h < min_pixels:
        scale = math.sqrt(min_pixels / (width * height))
        return _ceil_to(width * scale, factor), _ceil_to(height * scale, factor)
    return new_w, new_h


def _nearest_in_budget(width: int, height: int, min_pixels: int, max_pixels: int, factor: int) -> tuple[int, int]:
    """Search the sides (in units of factor) in budget with the closest aspect ratio.

    Needed only when the first guess misses: extreme aspect ratios (one side
    pinned at ``factor``) or a budget window narrower than the rounding step.
    """
    unit = factor * factor
    lo, hi = math.ceil(min_pixels / unit), max_pixels // unit
    target = math.log(width / height)
    best: tuple[float, int, int] | None = None
    for units_w in range(1, hi + 1):
        units_h_lo, units_h_hi = max(1, math.ceil(lo / units_w)), hi // units_w
        if units_h_lo > units_h_hi:
            continue
        units_h = min(max(round(units_w / math.exp(target)), units_h_lo), units_h_hi)
        error = abs(math.log(units_w / units_h) - target)
        if best is None or error < best[0]:
            best = (error, units_w, units_h)
    if best is None:
        raise ValueError(
            f"no width*height with both sides multiples of {factor} lies in "
            f"[{min_pixels}, {max_pixels}]; widen the range"
        )
    return best[1] * factor, best[2] * factor


SIZINGS = ("mmrl", "qwen")


def qwen_size(width: int, height: int, min_pixels: int, max_pixels: float, factor: int) -> tuple[int, int] | None:
    """qwen-vl-utils' ``smart_resize`` as (new_w, new_h), or None where it raises or its answer is out of budget."""
    from qwen_vl_utils.vision_process import smart_resize

    try:
        new_h, new_w = smart_resize(height, width, factor, min_pixels=min_pixels, max_pixels=max_pixels)
    except ValueError:  # an aspect ratio over its MAX_RATIO
        return None
    if min(new_w, new_h) < factor or not min_pixels <= new_w * new_h <= max_pixels:
        return None
    return new_w, new_h


def fit_pixel_budget(
    width: int, height: int, min_pixels: int, max_pixels: int, factor: int = 28, sizing: str = "mmrl"
) -> tuple[int, int]:
    """Size (new_w, new_h) near width x height with sides multiples of factor.

    The aspect ratio is kept as far as rounding allows, and
    ``min_pixels <= new_w * new_h <= max_pixels``. ``sizing="qwen"``: qwen-vl-utils' answer where it has a usable
    one (:func:`qwen_size`), else mmrl's.
    """
    if width < 1 or height < 1:
        raise ValueError(f"image size {width}x{height} must be positive in both sides")
    validate_budget(min_pixels, max_pixels, factor)
    if sizing not in SIZINGS:
        raise ValueError(f"sizing={sizing!r} is unknown; allowed: {', '.join(SIZINGS)}")
    if sizing == "qwen":
        size = qwen_size(width, height, min_pixels, max_pixels, factor)
        if size is not None:
            return size
    new_w, new_h = _scaled(width, height, min_pixels, max_pixels, factor)
    if min_pixels <= new_w * new_h <= max_pixels:
        return new_w, new_h
    return _nearest_in_budget(width, height, min_pixels, max_pixels, factor)


def resize_to_budget(img: Image.Image, min_pixels: int, max_pixels: int, factor: int = 28,
                     sizing: str = "mmrl") -> Image.Image:
    """An RGB copy of ``img`` resized (bicubic, as qwen-vl-utils' ``fetch_image``) to fit the pixel budget."""
    size = fit_pixel_budget(img.width, img.height, min_pixels, max_pixels, factor, sizing)
    rgb = to_rgb(img)
    if rgb.size == size:
        return rgb.copy()
    return rgb.resize(size, Image.Resampling.BICUBIC)


def encode_png(img: Image.Image) -> bytes:
    """PNG bytes of an image."""
    buffer = io.BytesIO()
    img.save(buffer, format="PNG")
    return buffer.getvalue()

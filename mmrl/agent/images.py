"""An image a tool returned, made into what the model can see: one upright RGB picture of a shape processors take.

:func:`upright_rgb` (in the worker, on the tool's own image, and again in the driver, on the PNG it sent):

- an animated image (GIF, APNG, multi-page TIFF; ``n_frames > 1``) gives its **first frame**, whichever frame the
  tool left it on, and reports the repair ``animated_image``;
- an EXIF orientation is applied (``ImageOps.exif_transpose``): the model sees the picture the right way up;
- the mode becomes RGB as the image shows: transparency (an alpha band, or a palette's or a colour's
  ``transparency``) is composited over white; 16- and 32-bit integer grey (``I;16*``, ``I``) is scaled from
  0..65535 to 0..255 (not clipped to white); CMYK, 1-bit, palette, grey and the rest are converted by PIL.

:func:`fitted` (in the driver): an image more than :data:`~mmrl.agent.builtin.MAX_ASPECT` times longer than wide
is refused (the processors refuse extreme ratios: Qwen's past 200, which raised ValueError while the turn was
encoded, and stopped the run); one over the pixel budget is shrunk to it. A tiny one (1x1) is left to the
processor, which enlarges it to its grid (the tiny model's processor does: tests/unit/test_safe_outputs.py).
"""

from __future__ import annotations

from PIL import Image, ImageOps

from mmrl.agent.builtin import MAX_ASPECT, scaled

_WIDE_GREY = ("I;16", "I;16L", "I;16B", "I;16N", "I")  # integer grey read as 16 bits per pixel
_ALPHA = ("RGBA", "LA", "PA", "RGBa")  # PIL cannot convert "La": such an image is a bad_image


def upright_rgb(image: Image.Image) -> tuple[Image.Image, tuple[str, ...]]:
    """``image``'s first frame, upright, in RGB (see the module's docstring), and the repairs made:
    ``("animated_image",)`` or none. PIL's errors on corrupt data propagate."""
    repairs: tuple[str, ...] = ()
    if getattr(image, "n_frames", 1) > 1:
        image.seek(0)
        repairs = ("animated_image",)
    image = ImageOps.exif_transpose(image)  # a copy of the current frame, turned upright
    return _rgb(image), repairs


def _rgb(image: Image.Image) -> Image.Image:
    if image.mode in _WIDE_GREY:
        image = image.convert("I").point(lambda v: v * (1 / 257)).convert("L")  # 65535 -> 255, clipped to 0..255
    if image.mode in _ALPHA or "transparency" in image.info:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")


def fitted(image: Image.Image, max_pixels: int) -> Image.Image | str:
    """``image`` shrunk to ``max_pixels`` if over it (aspect kept); or, for an image too long for its width, why it
    is refused."""
    width, height = image.size
    if max(width, height) / min(width, height) > MAX_ASPECT:
        return (f"returned a {width}x{height} image, whose aspect ratio {max(width, height) / min(width, height):g} "
                f"is over {MAX_ASPECT:g}; return an image at most {MAX_ASPECT:g} times longer than it is wide")
    return scaled(image, max_pixels, grow=False)

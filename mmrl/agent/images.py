"""An image a tool returned, made into what the model can see: one upright RGB picture of a shape processors take.

:func:`upright_rgb` (in the worker, on the tool's own image, and again in the driver, on the PNG it sent):

- an animated image (GIF, APNG, multi-page TIFF; ``n_frames > 1``) gives its **first frame**, whichever frame the
  tool left it on, and reports the repair ``animated_image``;
- an EXIF orientation is applied (``ImageOps.exif_transpose``): the model sees the picture the right way up;
- the mode becomes RGB as the image shows (:func:`mmrl.image_modes.to_rgb`, as for a user's images):
  transparency over white, 16-bit grey scaled to 8 bits; PIL cannot convert ``La``, so such an image is a
  ``bad_image``.

:func:`fitted` (in the driver): an image more than :data:`~mmrl.agent.builtin.MAX_ASPECT` times longer than wide
is refused (the processors refuse extreme ratios: Qwen's past 200, which raised ValueError while the turn was
encoded, and stopped the run); one over the pixel budget is shrunk to it. A tiny one (1x1) is left to the
processor, which enlarges it to its grid (the tiny model's processor does: tests/unit/test_safe_outputs.py).
"""

from __future__ import annotations

from PIL import Image, ImageOps

from mmrl.agent.builtin import MAX_ASPECT, scaled
from mmrl.image_modes import to_rgb


def upright_rgb(image: Image.Image) -> tuple[Image.Image, tuple[str, ...]]:
    """``image``'s first frame, upright, in RGB (see the module's docstring), and the repairs made:
    ``("animated_image",)`` or none. PIL's errors on corrupt data propagate."""
    repairs: tuple[str, ...] = ()
    if getattr(image, "n_frames", 1) > 1:
        image.seek(0)
        repairs = ("animated_image",)
    image = ImageOps.exif_transpose(image)  # a copy of the current frame, turned upright
    return to_rgb(image), repairs


def fitted(image: Image.Image, max_pixels: int) -> Image.Image | str:
    """``image`` shrunk to ``max_pixels`` if over it (aspect kept); or, for an image too long for its width, why it
    is refused."""
    width, height = image.size
    if max(width, height) / min(width, height) > MAX_ASPECT:
        return (f"returned a {width}x{height} image, whose aspect ratio {max(width, height) / min(width, height):g} "
                f"is over {MAX_ASPECT:g}; return an image at most {MAX_ASPECT:g} times longer than it is wide")
    return scaled(image, max_pixels, grow=False)

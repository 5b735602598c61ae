"""An image of any mode as the RGB picture it shows: the one conversion a user's images (:mod:`data_prep.pixels`)
and a tool's (:mod:`mmrl.agent.images`) go through.

- transparency (an alpha band, or a palette's or a colour's ``transparency``) is composited over white, not black;
- 16- and 32-bit integer grey (``I;16*``, ``I``) is scaled from 0..65535 to 0..255 (PIL's own conversion clips
  every value over 255 to white);
- CMYK, 1-bit, palette, grey and the rest are converted by PIL (an embedded ICC profile is not applied).
"""

from __future__ import annotations

import numpy as np
from PIL import Image

ALPHA_MODES = ("RGBA", "LA", "PA", "RGBa")


def to_rgb(image: Image.Image) -> Image.Image:
    """``image`` in RGB as it shows (see the module's docstring); an RGB image is returned as it is."""
    if image.mode == "RGB":
        return image
    if image.mode.startswith("I"):
        image = to_8bit(image)
    if image.mode not in ALPHA_MODES and "transparency" not in image.info:
        return image.convert("RGB")
    rgba = image.convert("RGBA")
    white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    return Image.alpha_composite(white, rgba).convert("RGB")


def to_8bit(image: Image.Image) -> Image.Image:
    """Integer grey (``I;16*`` or ``I``) as 8-bit grey (``L``): 0..65535 scaled to 0..255, rounded."""
    values = np.asarray(image, dtype=np.int64).clip(0, 65535)
    return Image.fromarray(((values * 255 + 32767) // 65535).astype(np.uint8), mode="L")
